#include "csv_format.h"

#include <algorithm>
#include <string_view>
#include <unordered_set>

#include "core/detail/ascii.h"
#include "volt/core/check.h"

namespace volt {
namespace detail {

std::string csv_escape(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::vector<CsvRecord> parse_csv(const std::string& text, const std::string& where) {
  std::vector<CsvRecord> records;
  int64_t line = 1;
  size_t i = 0;
  while (i < text.size()) {
    CsvRecord rec{{}, line};
    for (;;) {  // one cell per iteration
      std::string cell;
      if (i < text.size() && text[i] == '"') {
        const int64_t opened = line;
        ++i;
        bool closed = false;
        while (i < text.size()) {
          const char c = text[i++];
          if (c == '"') {
            if (i < text.size() && text[i] == '"') {
              cell += '"';
              ++i;
              continue;
            }
            closed = true;
            break;
          }
          if (c == '\n') ++line;
          cell += c;
        }
        VOLT_CHECK(closed, DataError, where, ":", opened,
                   ": a quoted cell is not closed; repair or delete that line.");
        if (i + 1 < text.size() && text[i] == '\r' && text[i + 1] == '\n') ++i;  // CRLF
        VOLT_CHECK(i == text.size() || text[i] == ',' || text[i] == '\n', DataError, where, ":",
                   line, ": text after a closing quote; repair or delete that line.");
      } else {
        while (i < text.size() && text[i] != ',' && text[i] != '\n') cell += text[i++];
        if (!cell.empty() && cell.back() == '\r' && (i == text.size() || text[i] == '\n')) {
          cell.pop_back();
        }
      }
      rec.cells.push_back(std::move(cell));
      if (i < text.size() && text[i] == ',') {
        ++i;
        continue;
      }
      break;  // end of the record: a newline or the end of the text
    }
    if (i < text.size()) {  // the newline
      ++i;
      ++line;
    }
    records.push_back(std::move(rec));
  }
  return records;
}

std::vector<std::string> metrics_header(const CsvRecord& header, const std::string& where) {
  const std::string& first = header.cells.front();
  size_t b = 0, e = first.size();
  while (b < e && ascii_space(first[b])) ++b;
  while (e > b && ascii_space(first[e - 1])) --e;
  VOLT_CHECK(first.compare(b, e - b, "step") == 0, DataError, where, ":", header.line,
             ": the header starts with '", header.cells.front(),
             "', not 'step'; pass a metrics.csv written by CSVLogger.");
  std::vector<std::string> names(header.cells.begin() + 1, header.cells.end());
  // A hash set, not a search of the names before each: a header of 200,000 columns took 21 s
  // (O(n^2)).
  std::unordered_set<std::string_view> seen;
  for (size_t c = 0; c < names.size(); ++c) {
    VOLT_CHECK(!names[c].empty(), DataError, where, ":", header.line, ": column ", c + 2,
               " of the header has no name; repair the header line.");
    VOLT_CHECK(seen.insert(names[c]).second, DataError, where, ":", header.line, ": column '",
               names[c], "' appears twice in the header; repair the header.");
  }
  return names;
}

}  // namespace detail
}  // namespace volt
