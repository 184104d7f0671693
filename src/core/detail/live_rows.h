#pragma once
// Private: rows a terminal shows in place (the progress bar's bars), kept below volt's log: a
// log line printed to the same stream while rows are live erases them, is printed, and the rows
// are drawn again under it (tqdm.write's way). Everything here runs under the log's lock, so a
// log line from another thread never lands inside a row.

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace volt {
namespace detail {

/// Draws `rows` on the terminal `out` in place of the live rows drawn before (fewer rows erase
/// the ones left below), each cut to the terminal's width; the cursor stays at the end of the
/// first row. An empty list erases them all and leaves the cursor at the start of an empty line.
void show_live_rows(std::FILE* out, const std::vector<std::string>& rows);

/// Ends the live rows: the first `keep` of them stay on screen with the cursor on the line after
/// them; the others are erased.
void end_live_rows(std::FILE* out, size_t keep);

/// Writes `line` and a newline to `out` under the log's lock (a bar's line in a file).
void write_line(std::FILE* out, const std::string& line);

/// The terminal's width in columns; 0 when `out` is not a terminal or does not say.
int64_t terminal_columns(std::FILE* out);

/// `text` cut to `columns` characters (UTF-8 sequences count as one); unchanged when columns
/// is 0 or it fits.
std::string cut_to_columns(const std::string& text, int64_t columns);

}  // namespace detail
}  // namespace volt
