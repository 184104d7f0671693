#pragma once
// The CSV dialect CSVLogger writes (RFC 4180): a cell holding a comma, quote, CR or newline is
// quoted, with quotes doubled. One writer and one reader, shared by the logger's resume and the
// run report. No torch includes.

#include <cstdint>
#include <string>
#include <vector>

namespace volt {
namespace detail {

/// `s` as one CSV cell.
std::string csv_escape(const std::string& s);

struct CsvRecord {
  std::vector<std::string> cells;
  int64_t line;  // 1-based line where the record starts
};

/// Splits `text` into records at newlines outside quotes (a trailing "\r" is dropped, so CRLF
/// files read the same). A blank line is a record with one empty cell. Throws DataError
/// "<where>:<line>: a quoted cell is not closed" / "text after a closing quote" (`where` is
/// e.g. "[report] runs/x/metrics.csv").
std::vector<CsvRecord> parse_csv(const std::string& text, const std::string& where);

/// The metric names of a metrics.csv header record: the cells after "step", exactly as CSVLogger
/// wrote them (a name may hold spaces). Throws DataError "<where>:<line>: ..." when the first
/// cell is not "step" (blanks around it allowed), a name is empty or a name appears twice.
std::vector<std::string> metrics_header(const CsvRecord& header, const std::string& where);

}  // namespace detail
}  // namespace volt
