// volt inside a program that chose a locale (setlocale(LC_ALL, ""), as Qt's QCoreApplication
// does): names, levels, numbers and generated code read and write as in the "C" locale
// (src/core/detail/ascii.h, src/core/detail/numbers.h). The locales are built here with
// localedef into a temp folder, so the test needs no locale installed system-wide.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cctype>
#include <clocale>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <volt/callbacks/model_checkpoint.h>
#include <volt/callbacks/model_summary.h>
#include <volt/core/registry.h>
#include <volt/kernels/fused_elementwise.h>
#include <volt/loggers/csv.h>
#include <volt/report/run_report.h>

#include "cli/detail/resolve.h"
#include "core/detail/ascii.h"
#include "core/detail/numbers.h"
#include "error_text.h"
#include "reread.h"
#include "scoped_env.h"
#include "tiny.h"

namespace {

namespace d = volt::detail;

// ----------------------------------------------------------------------------- no locale

TEST(AsciiCase, EveryByteClassifiesAndFoldsAsAscii) {
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    const bool upper = b >= 'A' && b <= 'Z', lower = b >= 'a' && b <= 'z';
    const bool digit = b >= '0' && b <= '9';
    EXPECT_EQ(d::ascii_alpha(c), upper || lower) << "byte " << b;
    EXPECT_EQ(d::ascii_digit(c), digit) << "byte " << b;
    EXPECT_EQ(d::ascii_alnum(c), upper || lower || digit) << "byte " << b;
    EXPECT_EQ(d::ascii_space(c), b == ' ' || (b >= '\t' && b <= '\r')) << "byte " << b;
    EXPECT_EQ(d::ascii_lower(c), upper ? static_cast<char>(b + 32) : c) << "byte " << b;
    EXPECT_EQ(d::ascii_upper(c), lower ? static_cast<char>(b - 32) : c) << "byte " << b;
    if (b < 128) {  // the "C" locale agrees on ASCII
      EXPECT_EQ(d::ascii_alnum(c), std::isalnum(b) != 0) << "byte " << b;
      EXPECT_EQ(d::ascii_space(c), std::isspace(b) != 0) << "byte " << b;
    }
  }
  // UTF-8 text keeps its multi-byte characters byte for byte.
  EXPECT_EQ(d::ascii_upper("Detail-\xc3\xa9t\xc3\xa9"), "DETAIL-\xc3\xa9T\xc3\xa9");
  EXPECT_EQ(d::ascii_lower("BFloat16 \xc4\xb0"), "bfloat16 \xc4\xb0");
}

TEST(CNumbers, FormatAndParseAsPrintfAndStrtod) {
  EXPECT_EQ(d::c_format("((float)%.9g)", 0.1f), "((float)0.100000001)");
  EXPECT_EQ(d::c_format("%.1f%%", 12.34), "12.3%");
  // Longer than its stack buffer: the whole text.
  const std::string wide = d::c_format("%300.2f", 1.5);
  EXPECT_EQ(wide.size(), 300u);
  EXPECT_EQ(wide.substr(296), "1.50");
  char* end = nullptr;
  const char* text = "-2.5e-3 rest";
  EXPECT_EQ(d::c_strtod(text, &end), -2.5e-3);
  EXPECT_EQ(std::string(end), " rest");
}

// ------------------------------------------------------------------------- under a locale

// Builds `name` (e.g. "de_DE.UTF-8") with localedef once into a folder of its own and selects
// it for the whole process (LC_ALL) for the test; the "C" locale again afterwards.
class HostLocale : public ::testing::Test {
 protected:
  void select(const std::string& input, const std::string& charset) {
    static volt_test::TempDir dir;
    static std::set<std::string> built;
    const std::string name = input + "." + charset;
    const std::string build =
        "localedef -i " + input + " -f " + charset + " '" + dir / name + "' >/dev/null 2>&1";
    if (built.count(name) == 0 && std::system(build.c_str()) != 0) {
      GTEST_SKIP() << "localedef could not build " << name
                   << " (its sources come with the Debian package `locales`, which "
                      "scripts/setup.sh installs)";
    }
    built.insert(name);
    ::setenv("LOCPATH", dir.path.c_str(), 1);
    const bool set = std::setlocale(LC_ALL, name.c_str()) != nullptr;
    ::unsetenv("LOCPATH");
    ASSERT_TRUE(set) << "setlocale(LC_ALL, \"" << name << "\") failed";
  }
  void TearDown() override { std::setlocale(LC_ALL, "C"); }
};

class TurkishLocale : public HostLocale {
 protected:
  void SetUp() override {
    select("tr_TR", "ISO-8859-9");
    if (IsSkipped() || HasFatalFailure()) return;
    // The locale took effect: the C library folds i and I the Turkish way and counts the
    // Latin-5 byte 0xE7 (c with cedilla) as a letter.
    ASSERT_NE(std::toupper('i'), 'I');
    ASSERT_NE(std::tolower('I'), 'i');
    ASSERT_NE(std::isalnum(0xE7), 0);
  }
};

TEST_F(TurkishLocale, CaseFoldingStaysAscii) {
  EXPECT_EQ(d::ascii_upper("info"), "INFO");  // TORCH_DISTRIBUTED_DEBUG=info
  EXPECT_EQ(d::ascii_lower("BFLOAT16"), "bfloat16");
  EXPECT_FALSE(d::ascii_alpha('\xe7'));
  // The registry's suggestions fold the same way: "MNIST" abbreviates MnistDataModule.
  EXPECT_EQ(volt::closest_match("MNIST", {"MnistDataModule", "CifarDataModule"}),
            "MnistDataModule");
}

TEST_F(TurkishLocale, AFusedKernelNameWithANonAsciiByteIsAValueError) {
  // Kernel names become cache file names and log lines: ASCII letters, digits and '_' only.
  const std::string error = volt_test::error_of<volt::ValueError>(
      [] { volt::FusedElementwise("k\xe7", {volt::jit::input(0)}); });
  EXPECT_NE(error.find("is not 1-64 letters, digits or '_'"), std::string::npos) << error;
}

class GermanLocale : public HostLocale {
 protected:
  void SetUp() override {
    select("de_DE", "UTF-8");
    if (IsSkipped() || HasFatalFailure()) return;
    // The locale took effect: printf writes a decimal comma.
    char buf[16];
    std::snprintf(buf, sizeof buf, "%.1f", 0.5);
    ASSERT_EQ(std::string(buf), "0,5");
  }
};

TEST_F(GermanLocale, NumbersReadAndWriteAsInTheCLocale) {
  EXPECT_EQ(d::c_format("%.9g", 0.5), "0.5");
  char* end = nullptr;
  const std::string text = "0.5";
  EXPECT_EQ(d::c_strtod(text.c_str(), &end), 0.5);
  EXPECT_EQ(end, text.c_str() + text.size());
  // Only for the call: the thread's locale is the program's again afterwards.
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f", 0.5);
  EXPECT_EQ(std::string(buf), "0,5");
}

TEST_F(GermanLocale, AFusedKernelsConstantsKeepTheirValue) {
  // The kernel's C++ source holds 0.5 as a literal: written "0,5" it is the comma operator (5).
  volt_test::TempDir cache;
  volt_test::ScopedEnv env{"VOLT_KERNEL_CACHE_CONFIG", cache.path + ",false,64"};
  volt::FusedElementwise half("half", {volt::jit::input(0) * 0.5 + 0.25},
                              volt::FusedElementwiseOptions().require_fused(true));
  const at::Tensor x = torch::arange(8, torch::kFloat);
  EXPECT_TRUE(torch::equal(half({x})[0], x * 0.5 + 0.25)) << half({x})[0];
}

TEST_F(GermanLocale, ConfigValuesReadAsInTheCLocale) {
  volt::Registry r = volt::registry();
  r.models = decltype(r.models)("model");
  r.data_modules = decltype(r.data_modules)("data module");
  r.models.add("Tiny", "", volt::Params().add("lr", 1e-3, "lr"),
               [](const volt::Args&) -> std::shared_ptr<volt::Module> {
                 return std::make_shared<volt_test::TinyClassifier>();
               });
  r.data_modules.add(
      "Blobs", "", volt::Params(),
      [](const volt::Args&) -> std::shared_ptr<volt::DataModule> { return nullptr; });
  d::ConfigNode n = d::parse_yaml(
      "model: {lr: 0.25}\ntrainer: {gradient_clip_val: 0.5, limit_val_batches: 0.75}\n",
      "run.yaml");
  d::canonicalize(n);
  const d::ResolvedConfig c = d::resolve(n, r);
  EXPECT_EQ(c.model.args.get<double>("lr"), 0.25);
  const volt::TrainerOptions o = d::trainer_options(c.trainer);
  EXPECT_EQ(o.gradient_clip_val(), 0.5);
  EXPECT_EQ(o.limit_val_batches().fraction(), 0.75);
}

TEST_F(GermanLocale, ModelSummaryAndCheckpointKeysWriteAsInTheCLocale) {
  // 1,235,000 parameters, 4.940 MB in fp32: the size is read back from printf's "%.3f" text
  // (under de_DE "4,940" had no '.', and the summary threw std::out_of_range).
  torch::nn::Linear big(1234, 1000);
  const std::string summary = volt::format_summary(volt::summarize(*big));
  EXPECT_NE(summary.find("1.2 M"), std::string::npos) << summary;
  EXPECT_NE(summary.find("4.940"), std::string::npos) << summary;
  // The callback's state key (in checkpoints): the same text in every locale.
  volt::ModelCheckpoint ckpt(volt::ModelCheckpointOptions().train_time_interval(1.5));
  EXPECT_NE(ckpt.state_key().find("train_time_interval=1.500000"), std::string::npos)
      << ckpt.state_key();
}

TEST_F(GermanLocale, TheRunReportReadsAndPlotsAsInTheCLocale) {
  volt_test::TempDir run;
  std::ofstream(run / "metrics.csv") << "step,train_loss\n0,1.5\n1,0.25\n2,0.125\n";
  std::ifstream page(volt::write_run_report(run.path));
  std::stringstream html;
  html << page.rdbuf();
  // The plot's points, as its script reads them.
  EXPECT_NE(html.str().find("[1,0.25]"), std::string::npos);
  EXPECT_NE(html.str().find("[2,0.125]"), std::string::npos);
}

TEST_F(GermanLocale, TheCsvLoggersResumeReadsItsNumbers) {
  volt_test::TempDir dir;
  volt::CSVLogger a(volt::CSVLoggerOptions(dir.path));
  for (int s = 0; s < 4; ++s) a.log_metrics({{"loss", 0.5 * s}}, s);
  a.save();
  torch::serialize::OutputArchive out;
  a.save_state(out);
  auto in = volt_test::reread(out);
  // Resuming at step 3 reads the rows before it back (a ',' decimal point read "0.5" as a
  // number followed by garbage: a DataError asking to repair the file).
  volt::CSVLogger b(volt::CSVLoggerOptions(dir.path));
  b.load_state(in, /*step=*/3);
  b.log_metrics({{"loss", 2.5}}, 3);
  b.save();
  std::ifstream file(b.metrics_path());
  std::stringstream text;
  text << file.rdbuf();
  EXPECT_EQ(text.str(), "step,loss\n0,0\n1,0.5\n2,1\n3,2.5\n");
}

}  // namespace
