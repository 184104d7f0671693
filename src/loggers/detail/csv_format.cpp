#include "csv_format.h"

#include <algorithm>
#include <sstream>
#include <string_view>
#include <unordered_set>

#include "core/detail/ascii.h"
#include "core/detail/numbers.h"
#include "volt/core/check.h"

namespace volt {
namespace detail {

std::string csv_escape(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

CsvReader::CsvReader(std::istream& in, std::string where, uint64_t limit)
    : in_(in.rdbuf()), where_(std::move(where)), limit_(limit) {}

int CsvReader::peek() {
  using Traits = std::char_traits<char>;
  return offset_ < limit_ && in_ != nullptr ? in_->sgetc() : Traits::eof();
}

int CsvReader::get() {
  const int c = peek();
  if (c != std::char_traits<char>::eof()) {
    in_->sbumpc();
    ++offset_;
  }
  return c;
}

bool CsvReader::next(CsvRecord& rec) {
  constexpr int kEof = std::char_traits<char>::eof();
  if (peek() == kEof) return false;
  rec.cells.clear();
  rec.line = line_;
  rec.complete = false;
  for (;;) {  // one cell per iteration
    std::string cell;
    if (peek() == '"') {
      const int64_t opened = line_;
      get();
      bool closed = false;
      for (int c = get(); c != kEof; c = get()) {
        if (c == '"') {
          if (peek() == '"') {
            cell += '"';
            get();
            continue;
          }
          closed = true;
          break;
        }
        if (c == '\n') ++line_;
        cell += static_cast<char>(c);
      }
      VOLT_CHECK(closed, DataError, where_, ":", opened,
                 ": a quoted cell is not closed; repair or delete that line.");
      bool cr = false;
      if (peek() == '\r') {  // CRLF
        get();
        cr = true;
      }
      const int after = peek();
      VOLT_CHECK(after == '\n' || (!cr && (after == ',' || after == kEof)), DataError, where_, ":",
                 line_, ": text after a closing quote; repair or delete that line.");
    } else {
      for (int c = peek(); c != kEof && c != ',' && c != '\n'; c = peek()) {
        cell += static_cast<char>(get());
      }
      if (!cell.empty() && cell.back() == '\r' && peek() != ',') cell.pop_back();
    }
    rec.cells.push_back(std::move(cell));
    if (peek() == ',') {
      get();
      continue;
    }
    break;  // end of the record: a newline or the end of the input
  }
  if (get() == '\n') {
    ++line_;
    rec.complete = true;
  }
  return true;
}

std::vector<CsvRecord> parse_csv(const std::string& text, const std::string& where) {
  auto in = c_stream<std::istringstream>(text);
  CsvReader reader(in, where);
  std::vector<CsvRecord> records;
  for (CsvRecord rec; reader.next(rec);) records.push_back(rec);
  return records;
}

MetricsHeader metrics_header(const CsvRecord& header, const std::string& where) {
  MetricsHeader h{header.cells, 0};
  bool found = false;
  // A hash set, not a search of the names before each: a header of 200,000 columns took 21 s
  // (O(n^2)).
  std::unordered_set<std::string_view> seen;
  for (size_t c = 0; c < h.names.size(); ++c) {
    const std::string& name = h.names[c];
    VOLT_CHECK(!name.empty(), DataError, where, ":", header.line, ": column ", c + 1,
               " of the header has no name; repair the header line.");
    VOLT_CHECK(seen.insert(name).second, DataError, where, ":", header.line, ": column '", name,
               "' appears twice in the header; repair the header.");
    if (ascii_trim(name) != "step") continue;
    VOLT_CHECK(!found, DataError, where, ":", header.line, ": columns ", h.step + 1, " and ", c + 1,
               " are both 'step'; repair the header.");
    h.step = c;
    found = true;
  }
  VOLT_CHECK(found, DataError, where, ":", header.line, ": the header '",
             (header.cells.size() == 1 ? header.cells[0] : header.cells[0] + ",..."),
             "' has no 'step' column; pass a metrics.csv written by a CSVLogger (volt's or "
             "Lightning's).");
  return h;
}

}  // namespace detail
}  // namespace volt
