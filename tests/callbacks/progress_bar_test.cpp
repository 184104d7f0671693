// ProgressBar on a real terminal (a pseudo-terminal) and on a plain file: training and
// evaluation lines, throttling, and what stays on screen.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <thread>

#include "tiny.h"

namespace {

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

/// Runs `body` with a ProgressBar drawing to a pseudo-terminal and returns what it drew.
template <typename F>
std::string on_terminal(double refresh_s, F&& body) {
  int master = -1, slave = -1;
  if (::openpty(&master, &slave, nullptr, nullptr, nullptr) != 0) return "<no pty>";
  std::FILE* out = ::fdopen(slave, "w");
  std::string drawn;
  // Drain the terminal while the run writes (a full pty buffer would block the writer) until
  // the writer's side is closed and all it wrote is read: then read() fails with EIO. Stopping
  // at the first empty read once the run returned lost the last line on a busy machine, where
  // the pty had not passed it on yet.
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
  body(std::make_shared<volt::ProgressBar>(refresh_s, out));
  std::fclose(out);  // closes the slave: the reader ends after the last byte
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
      .callbacks({bar});
}

TEST(ProgressBar, TerminalShowsValidationProgressThenClearsIt) {
  const std::string drawn = on_terminal(0.0, [](std::shared_ptr<volt::ProgressBar> bar) {
    volt_test::TinyClassifier model;
    volt::Trainer trainer(options(bar, 2));
    // 64 rows / 16 = 4 validation batches per pass, one pass per epoch.
    trainer.fit(model, volt_test::loader(volt_test::blobs(128)),
                volt_test::loader(volt_test::blobs(64, 8, 2), 16, false));
  });
  ASSERT_NE(drawn, "<no pty>");
  for (int k = 1; k <= 4; ++k) {
    EXPECT_EQ(count(drawn, "Validation " + std::to_string(k) + "/4 ["), 2) << k << "\n" << drawn;
  }
  EXPECT_NE(drawn.find("Epoch 0/1 8/8 ["), std::string::npos) << drawn;
  EXPECT_NE(drawn.find("train_loss="), std::string::npos);
  // Each validation line is cleared after its pass (a lone "\r\033[K"), and the epoch's final
  // training line ends with a newline.
  EXPECT_EQ(count(drawn, "\r\033[K\r"), 2) << drawn;
  EXPECT_EQ(count(drawn, "\n"), 2) << drawn;
}

TEST(ProgressBar, StandaloneTestPassKeepsItsFinalLine) {
  const std::string drawn = on_terminal(3600.0, [](std::shared_ptr<volt::ProgressBar> bar) {
    volt_test::TinyClassifier model;
    volt::Trainer trainer(options(bar, 1));
    trainer.test(model, volt_test::loader(volt_test::blobs(64), 16, false));
  });
  ASSERT_NE(drawn, "<no pty>");
  // Throttled: one hour between redraws, so only the final line is drawn.
  EXPECT_EQ(count(drawn, "Testing "), 1) << drawn;
  EXPECT_NE(drawn.find("Testing 4/4 ["), std::string::npos) << drawn;
}

TEST(ProgressBar, FileOutputGetsFinalLinesOnly) {
  volt_test::TempDir dir;
  std::FILE* f = std::fopen((dir / "bar.txt").c_str(), "w");
  auto bar = std::make_shared<volt::ProgressBar>(0.0, f);
  volt_test::TinyClassifier model;
  volt::Trainer trainer(options(bar, 2));
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)),
              volt_test::loader(volt_test::blobs(64, 8, 2), 16, false));
  trainer.validate(model, volt_test::loader(volt_test::blobs(64, 8, 2), 16, false));
  std::fclose(f);
  std::FILE* in = std::fopen((dir / "bar.txt").c_str(), "r");
  std::string text(4096, '\0');
  text.resize(std::fread(&text[0], 1, text.size(), in));
  std::fclose(in);
  // Two epoch lines and the standalone validation's line; no in-fit validation lines, no \r.
  EXPECT_EQ(count(text, "\n"), 3) << text;
  EXPECT_EQ(count(text, "Validation 4/4 ["), 1) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos);
}

}  // namespace
