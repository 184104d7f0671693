// ProgressBar (Lightning's TQDMProgressBar) on a real terminal (a pseudo-terminal) and on a
// plain file: the bars' text, their rows, throttling, what stays on screen, log lines above the
// bars, and the Trainer's refusals.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <regex>
#include <thread>

#include "error_text.h"
#include "log_capture.h"
#include "tiny.h"

namespace {

using volt_test::has;

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

/// Runs `body` with a stream on a pseudo-terminal of `columns` columns and returns what was
/// drawn on it. `as_stderr`: the terminal is also this process's stderr while `body` runs.
template <typename F>
std::string on_terminal(F&& body, int columns = 100, bool as_stderr = false) {
  int master = -1, slave = -1;
  struct winsize ws {};
  ws.ws_col = static_cast<unsigned short>(columns);
  ws.ws_row = 40;
  if (::openpty(&master, &slave, nullptr, nullptr, &ws) != 0) return "<no pty>";
  // Drain the terminal while the run writes (a full pty buffer would block the writer) until
  // the writer's side is closed and all it wrote is read: then read() fails with EIO.
  std::string drawn;
  std::thread reader([&] {
    ::fcntl(master, F_SETFL, O_NONBLOCK);
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(master, buf, sizeof buf);
      if (n > 0) {
        drawn.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        break;
      } else {
        std::this_thread::yield();
      }
    }
  });
  int saved_stderr = -1;
  std::FILE* out = nullptr;
  if (as_stderr) {
    std::fflush(stderr);
    saved_stderr = ::dup(2);
    ::dup2(slave, 2);
    ::close(slave);
    out = stderr;
  } else {
    out = ::fdopen(slave, "w");
  }
  body(out);
  if (as_stderr) {
    std::fflush(stderr);
    ::dup2(saved_stderr, 2);  // closes the terminal's last writer
    ::close(saved_stderr);
  } else {
    std::fclose(out);  // closes the slave: the reader ends after the last byte
  }
  reader.join();
  ::close(master);
  return drawn;
}

volt::TrainerOptions options(const std::shared_ptr<volt::ProgressBar>& bar, int64_t epochs) {
  return volt::TrainerOptions()
      .accelerator("cpu")
      .max_epochs(epochs)
      .num_sanity_val_steps(0)
      .logger(false)
      .enable_checkpointing(false)
      .enable_model_summary(false)
      .callbacks({bar});
}

std::string read_file(const std::string& path) {
  std::FILE* in = std::fopen(path.c_str(), "r");
  std::string text(1 << 16, '\0');
  text.resize(std::fread(&text[0], 1, text.size(), in));
  std::fclose(in);
  return text;
}

// Characters on screen: a UTF-8 sequence counts as one.
size_t columns_of(const std::string& row) {
  size_t n = 0;
  for (unsigned char c : row) n += (c & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

TEST(ProgressBar, FormatsNumbersAsLightningsTqdm) {
  // Expected values from Lightning's Tqdm.format_num (tqdm's format_num, then its padding).
  const std::vector<std::pair<double, std::string>> cases = {
      {1.0, "1.000"},   {0.1234567, "0.123"},      {12345.0, "12345.0"},
      {1e-5, "1e-5"},   {-0.5, "-.500"},           {2.0, "2.000"},
      {100.0, "100.0"}, {1234.5, "1234.5"},        {0.0, "0.000"},
      {NAN, "nan.0"},   {INFINITY, "inf.0"},       {-INFINITY, "-inf."},
      {1e20, "1e+20"},  {123456789.0, "1.23e+8"},  {3.14159, "3.140"},
      {-1.0, "-1.00"},  {0.000123456, "0.000123"}, {0.001, "0.001"}};
  for (const auto& c : cases) EXPECT_EQ(volt::ProgressBar::format_num(c.first), c.second);
}

TEST(ProgressBar, OptionsAreChecked) {
  EXPECT_THROW(volt::ProgressBar(volt::ProgressBarOptions().refresh_rate(-1)), volt::ConfigError);
  EXPECT_THROW(volt::ProgressBar(volt::ProgressBarOptions().refresh_s(-1)), volt::ConfigError);
  EXPECT_THROW(volt::ProgressBar(volt::ProgressBarOptions().refresh_s(NAN)), volt::ConfigError);
  volt::ProgressBar off(volt::ProgressBarOptions().refresh_rate(0));
  EXPECT_FALSE(off.is_enabled());
  volt::ProgressBar bar;
  bar.disable();
  EXPECT_FALSE(bar.is_enabled());
  bar.enable();
  EXPECT_TRUE(bar.is_enabled());
}

// The Trainer takes one bar, and none when enable_progress_bar is false (Lightning's callback
// connector raises for both).
TEST(ProgressBar, TheTrainerRefusesTwoBarsOrABarItWasToldNotToShow) {
  auto bar = std::make_shared<volt::ProgressBar>();
  const std::string two = volt_test::error_of<volt::ConfigError>([&] {
    volt::Trainer(options(bar, 1).callbacks({bar, std::make_shared<volt::ProgressBar>()}));
  });
  EXPECT_TRUE(has(two, "[Trainer] 2 ProgressBar callbacks were given")) << two;
  const std::string off = volt_test::error_of<volt::ConfigError>(
      [&] { volt::Trainer(options(bar, 1).enable_progress_bar(false)); });
  EXPECT_TRUE(has(off, "[Trainer] enable_progress_bar=false with a ProgressBar in callbacks"))
      << off;
}

// A file gets finished bars only: each epoch's line, then a standalone pass's, in Lightning's
// format with tqdm's 10-cell bar when no terminal gives a width. No carriage return, no escape.
TEST(ProgressBar, FileGetsEachFinishedBarInLightningsFormat) {
  volt_test::TempDir dir;
  std::FILE* f = std::fopen((dir / "bar.txt").c_str(), "w");
  auto bar = std::make_shared<volt::ProgressBar>(volt::ProgressBarOptions().refresh_s(0), f);
  volt_test::TinyClassifier model;
  volt::Trainer trainer(options(bar, 2).logger(true).default_root_dir(dir.path));
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)),
              volt_test::loader(volt_test::blobs(64, 8, 2), 16, false));
  trainer.validate(model, volt_test::loader(volt_test::blobs(64, 8, 2), 16, false));
  trainer.predict(model, volt_test::loader(volt_test::blobs(48), 16, false));
  std::fclose(f);
  const std::string text = read_file(dir / "bar.txt");
  EXPECT_EQ(count(text, "\n"), 4) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(text.find('\033'), std::string::npos);
  // v_num: the CSV logger's version; the prog_bar value train_loss with three digits.
  const std::regex epoch(
      R"(Epoch 0: 100%\|██████████\| 8/8 \[\d\d:\d\d<00:00, +\d+\.\d\dit/s, v_num=0, )"
      R"(train_loss=\d\.\d\d\d\]\n)");
  EXPECT_TRUE(std::regex_search(text, epoch)) << text;
  EXPECT_TRUE(has(text, "Epoch 1: 100%|██████████| 8/8 [")) << text;
  // A bar after the fit's shows no item: it is a new bar (not the training bar's values).
  const std::regex validation(
      R"(Validation DataLoader 0: 100%\|██████████\| 4/4 \[\d\d:\d\d<00:00, +\d+\.\d\dit/s\]\n)");
  EXPECT_TRUE(std::regex_search(text, validation)) << text;
  const std::regex predicting(
      R"(Predicting DataLoader 0: 100%\|██████████\| 3/3 \[\d\d:\d\d<00:00, +\d+\.\d\dit/s\]\n)");
  EXPECT_TRUE(std::regex_search(text, predicting)) << text;
  // No in-fit validation line: inside fit its bar is cleared (Lightning's leave=False).
  EXPECT_EQ(count(text, "Validation DataLoader 0"), 1) << text;
}

// A bar disabled while it is shown is still ended: the terminal is not left on its row.
class DisablesTheBar : public volt::Callback {
 public:
  explicit DisablesTheBar(std::shared_ptr<volt::ProgressBar> bar) : bar_(std::move(bar)) {}
  std::string state_key() const override { return "DisablesTheBar"; }
  void on_train_batch_end(volt::RunContext&, volt::Module&, const volt::Batch&,
                          int64_t batch_idx) override {
    if (batch_idx == 2) bar_->disable();
  }
  std::shared_ptr<volt::ProgressBar> bar_;
};

TEST(ProgressBar, ABarDisabledWhileShownIsStillEnded) {
  const std::string drawn = on_terminal([](std::FILE* out) {
    auto bar = std::make_shared<volt::ProgressBar>(volt::ProgressBarOptions().refresh_s(0), out);
    volt_test::TinyClassifier model;
    volt::Trainer trainer(options(bar, 1).callbacks({bar, std::make_shared<DisablesTheBar>(bar)}));
    trainer.fit(model, volt_test::loader(volt_test::blobs(128)));
  });
  ASSERT_NE(drawn, "<no pty>");
  EXPECT_FALSE(has(drawn, "| 4/8 [")) << drawn;  // nothing drawn once disabled
  EXPECT_EQ(drawn.substr(drawn.size() - 2), "\r\n") << drawn;
}

// Without max_epochs, max_steps bounds the training bar (Lightning's total_train_batches).
TEST(ProgressBar, MaxStepsAloneBoundsTheTrainingBar) {
  volt_test::TempDir dir;
  std::FILE* f = std::fopen((dir / "bar.txt").c_str(), "w");
  auto bar = std::make_shared<volt::ProgressBar>(volt::ProgressBarOptions(), f);
  volt_test::TinyClassifier model;
  volt::Trainer trainer(options(bar, -1).max_steps(3));
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)));
  std::fclose(f);
  const std::string text = read_file(dir / "bar.txt");
  EXPECT_TRUE(has(text, "Epoch 0: 100%|██████████| 3/3 [")) << text;
}

// On a terminal: the training bar redrawn in place, validation on the row below it and erased
// after, both cut to the terminal's width; the training bar stays at the end.
TEST(ProgressBar, TerminalDrawsValidationBelowTheTrainingBarThenErasesIt) {
  const int columns = 100;
  const std::string drawn = on_terminal(
      [](std::FILE* out) {
        auto bar =
            std::make_shared<volt::ProgressBar>(volt::ProgressBarOptions().refresh_s(0), out);
        volt_test::TinyClassifier model;
        volt::Trainer trainer(options(bar, 2));
        // 64 rows / 16 = 4 validation batches per pass, one pass per epoch.
        trainer.fit(model, volt_test::loader(volt_test::blobs(128)),
                    volt_test::loader(volt_test::blobs(64, 8, 2), 16, false));
      },
      columns);
  ASSERT_NE(drawn, "<no pty>");
  // The validation row: a newline down from the training row, then back up one row.
  for (const char* percent : {" 25%", " 50%", " 75%", "100%"}) {
    EXPECT_EQ(count(drawn, std::string("Validation DataLoader 0: ") + percent + "|"), 2)
        << percent << "\n"
        << drawn;
  }
  EXPECT_GE(count(drawn, "\033[1A\r"), 8) << drawn;
  EXPECT_TRUE(has(drawn, "Epoch 0: 100%|")) << drawn;
  EXPECT_TRUE(has(drawn, "| 8/8 [")) << drawn;
  EXPECT_TRUE(has(drawn, "train_loss=")) << drawn;
  // One training bar (leave=false), reset at each epoch: it stays at the end with a newline.
  const size_t last = drawn.rfind("Epoch 1: 100%|");
  ASSERT_NE(last, std::string::npos) << drawn;
  EXPECT_EQ(drawn.substr(drawn.size() - 5), "\033[K\r\n") << drawn;
  // Every row fits the terminal: the bar fills it, one column spare.
  const std::regex row(R"((Epoch \d|Validation DataLoader 0): [^\r\n\x1b]*)");
  size_t rows = 0;
  for (std::sregex_iterator it(drawn.begin(), drawn.end(), row), end; it != end; ++it, ++rows) {
    EXPECT_LE(columns_of(it->str()), static_cast<size_t>(columns - 1)) << it->str();
  }
  EXPECT_GT(rows, 10u);
}

// leave=true keeps every epoch's finished bar (one line each); throttled redraws read nothing
// between.
TEST(ProgressBar, LeaveKeepsEachEpochsBarAndRefreshRateThrottles) {
  int64_t redraws = 0;
  const std::string drawn = on_terminal([&](std::FILE* out) {
    auto bar = std::make_shared<volt::ProgressBar>(
        volt::ProgressBarOptions().leave(true).refresh_rate(4).refresh_s(0), out);
    volt_test::TinyClassifier model;
    volt::Trainer trainer(options(bar, 3));
    trainer.fit(model, volt_test::loader(volt_test::blobs(128)));
    redraws = bar->redraws();
  });
  ASSERT_NE(drawn, "<no pty>");
  for (int e = 0; e < 3; ++e) {
    const std::string done = "Epoch " + std::to_string(e) + ": 100%|";
    ASSERT_TRUE(has(drawn, done)) << drawn;
    // The finished bar is followed by a newline: it stays.
    const size_t at = drawn.rfind(done);
    EXPECT_EQ(drawn.substr(drawn.find(']', at), 6), "]\033[K\r\n") << drawn;
  }
  // 8 batches, refresh_rate 4: each epoch draws at its start, batches 4 and 8, its end, and
  // the kept bar once more.
  EXPECT_LE(redraws, 3 * 5) << drawn;
  EXPECT_EQ(count(drawn, "| 2/8 ["), 0) << drawn;
  EXPECT_GE(count(drawn, "| 4/8 ["), 3) << drawn;
}

// A standalone test keeps its bar; refresh_s of an hour draws only its start and last batch.
TEST(ProgressBar, StandaloneTestPassKeepsItsFinalLine) {
  const std::string drawn = on_terminal([](std::FILE* out) {
    auto bar =
        std::make_shared<volt::ProgressBar>(volt::ProgressBarOptions().refresh_s(3600.0), out);
    volt_test::TinyClassifier model;
    volt::Trainer trainer(options(bar, 1));
    trainer.test(model, volt_test::loader(volt_test::blobs(64), 16, false));
  });
  ASSERT_NE(drawn, "<no pty>");
  EXPECT_EQ(count(drawn, "Testing DataLoader 0: "), 3) << drawn;  // start, last batch, kept
  EXPECT_TRUE(has(drawn, "Testing DataLoader 0: 100%|")) << drawn;
  EXPECT_EQ(drawn.substr(drawn.size() - 5), "\033[K\r\n") << drawn;
}

// volt's log lines go above the bars (tqdm.write's way): the bar row is erased, the line
// printed, the bar drawn again below it.
class LogsMidEpoch : public volt::Callback {
 public:
  std::string state_key() const override { return "LogsMidEpoch"; }
  void on_train_batch_end(volt::RunContext&, volt::Module&, const volt::Batch&,
                          int64_t batch_idx) override {
    if (batch_idx == 3) volt::log_info("Test", "a line from the middle of an epoch");
  }
};

TEST(ProgressBar, LogLinesGoAboveTheBars) {
  const std::string drawn = on_terminal(
      [](std::FILE* out) {
        auto bar =
            std::make_shared<volt::ProgressBar>(volt::ProgressBarOptions().refresh_s(0), out);
        volt_test::TinyClassifier model;
        volt::Trainer trainer(options(bar, 1).callbacks({bar, std::make_shared<LogsMidEpoch>()}));
        trainer.fit(model, volt_test::loader(volt_test::blobs(128)));
      },
      100, /*as_stderr=*/true);
  ASSERT_NE(drawn, "<no pty>");
  const size_t line = drawn.find("[volt] info: [Test] a line from the middle of an epoch\r\n");
  ASSERT_NE(line, std::string::npos) << drawn;
  // Erased before: the line starts on an empty row ...
  EXPECT_EQ(drawn.substr(line - 4, 4), "\r\033[K") << drawn;
  // ... and the bar comes back under it, at the batch it had reached.
  const size_t after =
      line + std::string("[volt] info: [Test] a line from the middle of an epoch\r\n").size();
  EXPECT_EQ(drawn.substr(after, 11), "\rEpoch 0:  ") << drawn;
  EXPECT_TRUE(has(drawn.substr(after, 200), "| 4/8 [")) << drawn.substr(after, 200);
}

// A failing run leaves the bars as drawn and the cursor on the line below them, so that the
// error does not land on a bar.
class FailsAtBatch3 : public volt_test::TinyClassifier {
 public:
  torch::Tensor training_step(const volt::Batch& b, int64_t idx) override {
    if (idx == 3) throw std::runtime_error("bad batch");
    return TinyClassifier::training_step(b, idx);
  }
};

TEST(ProgressBar, AFailedRunEndsTheBarsLine) {
  const std::string drawn = on_terminal([](std::FILE* out) {
    auto bar = std::make_shared<volt::ProgressBar>(volt::ProgressBarOptions().refresh_s(0), out);
    FailsAtBatch3 model;
    volt::Trainer trainer(options(bar, 1));
    EXPECT_THROW(trainer.fit(model, volt_test::loader(volt_test::blobs(128))), std::runtime_error);
  });
  ASSERT_NE(drawn, "<no pty>");
  const size_t last = drawn.rfind("Epoch 0:  38%|");  // 3 of 8 batches
  ASSERT_NE(last, std::string::npos) << drawn;
  EXPECT_EQ(drawn.substr(drawn.size() - 5), "\033[K\r\n") << drawn;
}

}  // namespace
