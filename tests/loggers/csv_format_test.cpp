// The CSV dialect CSVLogger writes and the one reader its resume and the run report share.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <sstream>

#include "loggers/detail/csv_format.h"
#include "volt/core/errors.h"

namespace {

using volt::detail::csv_escape;
using volt::detail::parse_csv;

std::vector<std::vector<std::string>> cells(const std::string& text) {
  std::vector<std::vector<std::string>> out;
  for (const auto& r : parse_csv(text, "[t] f.csv")) out.push_back(r.cells);
  return out;
}

TEST(CsvFormat, EscapedCellsParseBackExactly) {
  const std::vector<std::string> names = {"plain", "a,b", "say \"hi\"", "two\nlines",
                                          "cr\r",  "",    "\"",         ",,"};
  std::string line;
  for (size_t i = 0; i < names.size(); ++i) line += (i ? "," : "") + csv_escape(names[i]);
  EXPECT_EQ(csv_escape("plain"), "plain");
  EXPECT_EQ(csv_escape("say \"hi\""), "\"say \"\"hi\"\"\"");
  const auto records = parse_csv(line + "\n1,2,3,4,5,6,7,8\n", "[t] f.csv");
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].cells, names);
  EXPECT_EQ(records[0].line, 1);
  EXPECT_EQ(records[1].line, 3);  // the quoted newline took a line
}

TEST(CsvFormat, CrlfBlankLinesAndEmptyCells) {
  EXPECT_EQ(cells("step,a\r\n0,1\r\n\r\n1,\r\n"),
            (std::vector<std::vector<std::string>>{{"step", "a"}, {"0", "1"}, {""}, {"1", ""}}));
  EXPECT_EQ(cells("\"a\"\r\n\"b\""), (std::vector<std::vector<std::string>>{{"a"}, {"b"}}));
  EXPECT_TRUE(cells("").empty());
}

TEST(CsvFormat, MalformedQuotingNamesTheLine) {
  const auto error_of = [](const std::string& text) -> std::string {
    try {
      parse_csv(text, "[t] f.csv");
    } catch (const volt::DataError& e) {
      return e.what();
    }
    return "<no DataError>";
  };
  EXPECT_NE(error_of("a\nstep,\"a,b\n0,1\n").find("[t] f.csv:2: a quoted cell is not closed"),
            std::string::npos);
  EXPECT_NE(error_of("a\n\"x\ny\"z,1\n").find("[t] f.csv:3: text after a closing quote"),
            std::string::npos);
}

// The reader the logger's resume and the report share: one record at a time, a last line
// without its newline marked, and a byte limit (the logger's rewrite reads only what it knows is
// whole) read as the end of the input.
TEST(CsvFormat, AReaderMarksAnUnfinishedLastLineAndStopsAtItsLimit) {
  const std::string text = "step,\"a\nb\"\r\n0,1\n1,2";
  const auto read = [&](uint64_t limit) {
    std::istringstream in(text);
    volt::detail::CsvReader reader(in, "[t] f.csv", limit);
    std::vector<std::pair<volt::detail::CsvRecord, uint64_t>> out;
    for (volt::detail::CsvRecord r; reader.next(r);) out.emplace_back(r, reader.offset());
    return out;
  };
  const auto all = read(UINT64_MAX);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].first.cells, (std::vector<std::string>{"step", "a\nb"}));
  EXPECT_TRUE(all[0].first.complete);
  EXPECT_EQ(all[0].second, 12u);  // through the CRLF
  EXPECT_EQ(all[1].first.line, 3);
  EXPECT_TRUE(all[1].first.complete);
  EXPECT_EQ(all[1].second, 16u);
  EXPECT_EQ(all[2].first.cells, (std::vector<std::string>{"1", "2"}));
  EXPECT_FALSE(all[2].first.complete);
  EXPECT_EQ(all[2].second, text.size());
  // A limit inside the second row: the row is read up to it, and not complete.
  const auto cut = read(14);
  ASSERT_EQ(cut.size(), 2u);
  EXPECT_EQ(cut[1].first.cells, (std::vector<std::string>{"0", ""}));
  EXPECT_FALSE(cut[1].first.complete);
  EXPECT_EQ(read(16).size(), 2u);
  EXPECT_TRUE(read(0).empty());
}

TEST(CsvFormat, AHeaderOfManyColumnsIsCheckedInLinearTime) {
  // 200,000 columns: each name was searched among those before it (O(n^2): 21 s here).
  volt::detail::CsvRecord header{{"step"}, 1};
  for (int c = 0; c < 200000; ++c) header.cells.push_back("metric_" + std::to_string(c));
  const auto t0 = std::chrono::steady_clock::now();
  const auto h = volt::detail::metrics_header(header, "[t] f.csv");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(h.names.size(), 200001u);
  EXPECT_EQ(h.names.back(), "metric_199999");
  EXPECT_EQ(h.step, 0u);
  EXPECT_LT(secs, 2.0);
  // The duplicate is still found, at its column.
  header.cells.push_back("metric_7");
  try {
    volt::detail::metrics_header(header, "[t] f.csv");
    ADD_FAILURE() << "accepted";
  } catch (const volt::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("[t] f.csv:1: column 'metric_7' appears twice"),
              std::string::npos)
        << e.what();
  }
}

// volt writes "step" first; Lightning sorts every name, "step" among them. Either is read; a
// header with no step, or two, is refused with its line.
TEST(CsvFormat, TheStepColumnIsFoundWhereverItIs) {
  const auto header = [](std::vector<std::string> cells) {
    return volt::detail::metrics_header(volt::detail::CsvRecord{std::move(cells), 4}, "[t] f.csv");
  };
  EXPECT_EQ(header({"step", "loss"}).step, 0u);
  const auto lightning = header({"epoch", "step", "train_loss"});
  EXPECT_EQ(lightning.step, 1u);
  EXPECT_EQ(lightning.names, (std::vector<std::string>{"epoch", "step", "train_loss"}));
  EXPECT_EQ(header({"a", " step "}).step, 1u);  // blanks around it allowed, as before
  const auto error_of = [&](std::vector<std::string> cells) -> std::string {
    try {
      header(std::move(cells));
    } catch (const volt::DataError& e) {
      return e.what();
    }
    return "<no DataError>";
  };
  EXPECT_NE(error_of({"epoch", "loss"})
                .find("[t] f.csv:4: the header 'epoch,...' has no 'step' column; pass a "
                      "metrics.csv written by a CSVLogger"),
            std::string::npos);
  EXPECT_NE(error_of({"step", "loss", "step "}).find("columns 1 and 3 are both 'step'"),
            std::string::npos);
  EXPECT_NE(error_of({"step", ""}).find("column 2 of the header has no name"), std::string::npos);
}

}  // namespace
