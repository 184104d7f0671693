#pragma once
// The CSV dialect CSVLogger writes (RFC 4180): a cell holding a comma, quote, CR or newline is
// quoted, with quotes doubled. One writer and one reader, shared by the logger's resume and the
// run report. No torch includes.

#include <cstdint>
#include <istream>
#include <limits>
#include <string>
#include <vector>

namespace volt {
namespace detail {

/// `s` as one CSV cell.
std::string csv_escape(const std::string& s);

struct CsvRecord {
  std::vector<std::string> cells;
  int64_t line = 1;  // 1-based line where the record starts
  // Whether a newline ended the record; false for a last line without one (CSVLogger ends every
  // row with a newline, so that is a row still being written).
  bool complete = true;
};

/// Reads records one at a time, so a file is read in the memory of its largest record, not of
/// the file (the logger's resume and the report read metrics.csv this way). Records end at
/// newlines outside quotes (a trailing "\r" is dropped, so CRLF files read the same); a blank
/// line is a record with one empty cell. Throws DataError "<where>:<line>: a quoted cell is not
/// closed" / "text after a closing quote" (`where` is e.g. "[report] runs/x/metrics.csv").
class CsvReader {
 public:
  /// Reads `in` up to its end or `limit` bytes, whichever comes first.
  CsvReader(std::istream& in, std::string where,
            uint64_t limit = std::numeric_limits<uint64_t>::max());
  /// The next record into `out`; false at the end of the input.
  bool next(CsvRecord& out);
  /// Bytes read so far: where the next record starts.
  uint64_t offset() const { return offset_; }

 private:
  int peek();
  int get();

  std::streambuf* in_;
  std::string where_;
  uint64_t limit_, offset_ = 0;
  int64_t line_ = 1;
};

/// All records of `text` (a CsvReader over it).
std::vector<CsvRecord> parse_csv(const std::string& text, const std::string& where);

/// A metrics.csv header: every column's name exactly as written (a name may hold spaces), and
/// which column holds the step. volt's CSVLogger writes "step" first; Lightning's sorts its
/// columns, so "step" may be anywhere ("epoch,step,train_loss").
struct MetricsHeader {
  std::vector<std::string> names;
  size_t step = 0;
};

/// Reads a metrics.csv header record. Throws DataError "<where>:<line>: ..." when no column is
/// "step" (blanks around it allowed) or two are, a name is empty or a name appears twice.
MetricsHeader metrics_header(const CsvRecord& header, const std::string& where);

}  // namespace detail
}  // namespace volt
