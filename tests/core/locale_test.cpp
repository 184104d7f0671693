// volt inside a program that chose a locale (setlocale(LC_ALL, ""), as Qt's QCoreApplication
// does, or std::locale::global(std::locale("")) for iostreams): names, levels, numbers and
// generated code read and write as in the "C" locale (src/core/detail/ascii.h,
// src/core/detail/numbers.h). The locales are built here with localedef into a temp folder, so
// the test needs no locale installed system-wide.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cctype>
#include <clocale>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <locale>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include <volt/callbacks/model_checkpoint.h>
#include <volt/callbacks/model_summary.h>
#include <volt/core/registry.h>
#include <volt/kernels/fused_bias_activation.h>
#include <volt/kernels/fused_elementwise.h>
#include <volt/kernels/kernel_cache.h>
#include <volt/loggers/csv.h>
#include <volt/precision/mixed.h>
#include <volt/report/run_report.h>

#include "build_paths.h"
#include "cli/detail/resolve.h"
#include "core/detail/ascii.h"
#include "core/detail/numbers.h"
#include "core/detail/state_key.h"
#include "error_text.h"
#include "file_text.h"
#include "processes.h"
#include "reread.h"
#include "scoped_env.h"
#include "tiny.h"

namespace {

namespace d = volt::detail;
using volt_test::file_text;

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

// The folder holding locale `input`.`charset` (e.g. de_DE.UTF-8), built there with localedef
// once per process (LOCPATH=<folder> makes it selectable); empty if localedef failed.
std::string built_locales(const std::string& input, const std::string& charset) {
  static volt_test::TempDir dir;
  static std::set<std::string> built;
  const std::string name = input + "." + charset;
  const std::string build =
      "localedef -i " + input + " -f " + charset + " '" + dir / name + "' >/dev/null 2>&1";
  if (built.count(name) == 0 && std::system(build.c_str()) != 0) return "";
  built.insert(name);
  return dir.path;
}

constexpr const char* kNoLocaledef =
    " (its sources come with the Debian package `locales`, which scripts/setup.sh installs)";

// Selects locale `input`.`charset` for the whole process (LC_ALL) for the test; with `cpp`,
// through std::locale::global, which also makes it the locale of every iostream constructed
// afterwards. The "C" locale again after.
class HostLocale : public ::testing::Test {
 protected:
  void select(const std::string& input, const std::string& charset, bool cpp = false) {
    const std::string name = input + "." + charset, dir = built_locales(input, charset);
    if (dir.empty()) GTEST_SKIP() << "localedef could not build " << name << kNoLocaledef;
    ::setenv("LOCPATH", dir.c_str(), 1);
    bool set = true;
    if (cpp) {
      try {
        std::locale::global(std::locale(name));
      } catch (const std::runtime_error&) {
        set = false;
      }
    } else {
      set = std::setlocale(LC_ALL, name.c_str()) != nullptr;
    }
    ::unsetenv("LOCPATH");
    ASSERT_TRUE(set) << "selecting the locale \"" << name << "\" failed";
  }
  void TearDown() override {
    std::locale::global(std::locale::classic());
    std::setlocale(LC_ALL, "C");
  }
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
  const std::string html = file_text(volt::write_run_report(run.path));
  // The plot's points, as its script reads them.
  EXPECT_NE(html.find("[1,0.25]"), std::string::npos);
  EXPECT_NE(html.find("[2,0.125]"), std::string::npos);
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
  EXPECT_EQ(file_text(b.metrics_path()), "step,loss\n0,0\n1,0.5\n2,1\n3,2.5\n");
}

// std::locale::global(std::locale("de_DE.UTF-8")): iostreams made afterwards group digits with
// '.' and write a decimal comma.
class GermanIostreams : public HostLocale {
 protected:
  void SetUp() override {
    select("de_DE", "UTF-8", /*cpp=*/true);
    if (IsSkipped() || HasFatalFailure()) return;
    std::ostringstream os;
    os << 1000 << ' ' << 0.5;
    ASSERT_EQ(os.str(), "1.000 0,5");
  }
};

TEST_F(GermanIostreams, VoltsStreamsWriteAndReadAsInTheCLocale) {
  auto os = d::c_stream<std::ostringstream>();
  os << 1000 << ' ' << 0.5 << ' ' << at::IntArrayRef{1024, 64};
  EXPECT_EQ(os.str(), "1000 0.5 [1024, 64]");
  auto in = d::c_stream<std::istringstream>("0.25 1000");
  double x = 0;
  int64_t n = 0;
  EXPECT_TRUE(in >> x >> n);
  EXPECT_EQ(x, 0.25);
  EXPECT_EQ(n, 1000);
  // File streams too: what one program writes, another reads whatever its locale.
  volt_test::TempDir dir;
  d::c_stream<std::ofstream>(dir / "n.txt") << 0.75 << ' ' << 123456;
  std::locale::global(std::locale::classic());
  std::ifstream back(dir / "n.txt");
  EXPECT_TRUE(back >> x >> n);
  EXPECT_EQ(x, 0.75);
  EXPECT_EQ(n, 123456);
}

TEST_F(GermanIostreams, TheBf16ProbeCacheIsWrittenAsInTheCLocale) {
  // Every process on the machine reads this file (so ranks and resumed runs decide the same bf16
  // ops): a process with another locale must read the same figures. Under de_DE it was written
  // "matmul_speedup 0,87...", which a "C" process reads as 0 and rejects.
  volt_test::TempDir cache;
  volt_test::ScopedEnv env{"VOLT_CACHE_DIR", cache.path};
  const volt::MixedPrecision::CpuProbe& p = volt::MixedPrecision::cpu_probe();
  std::locale::global(std::locale::classic());
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(cache.path)) {
    if (e.path().extension() == ".txt") files.push_back(e.path());
  }
  ASSERT_EQ(files.size(), 1u) << "expected one bf16_probe_*.txt in " << cache.path;
  // The name holds a hash of the machine's key, in hex digits (grouped, "3a9.f0c...", it named
  // another file than the "C" locale's processes read).
  EXPECT_TRUE(
      std::regex_match(files[0].filename().string(), std::regex("bf16_probe_[0-9a-f]{16}\\.txt")))
      << files[0];
  std::ifstream in(files[0]);
  std::string key, a, b, c;
  double matmul = 0, conv = 0;
  int64_t min_macs = -1;
  ASSERT_TRUE(std::getline(in, key));
  EXPECT_NE(key.find("bf16 probe"), std::string::npos) << key;
  ASSERT_TRUE(in >> a >> matmul >> b >> conv >> c >> min_macs) << "unreadable: " << files[0];
  EXPECT_EQ(a + b + c, "matmul_speedupconv_speedupmatmul_min_macs");
  EXPECT_EQ(matmul, p.matmul_speedup);  // 17 digits: the same double
  EXPECT_EQ(conv, p.conv_speedup);
  EXPECT_EQ(min_macs, p.matmul_min_macs);
}

TEST_F(GermanIostreams, TheCsvLoggerWritesStepsAsIntegers) {
  // A rewrite (a new column, or the first save after a resume) wrote step 1000 as "1.000": the
  // run report plotted it at step 1 and the next resume refused the file.
  volt_test::TempDir dir;
  volt::CSVLogger csv(volt::CSVLoggerOptions(dir.path));
  csv.log_metrics({{"loss", 1}}, 1000);
  csv.log_metrics({{"loss", 0.5}, {"val_loss", 0.25}}, 12345);
  csv.save();
  EXPECT_EQ(file_text(csv.metrics_path()), "step,loss,val_loss\n1000,1,\n12345,0.5,0.25\n");
}

TEST_F(GermanIostreams, ErrorMessagesWriteNumbersAsInTheCLocale) {
  // VOLT_CHECK's messages were written under the global locale: "input [2, 1.024] does not fit
  // weight [1.000, 4.096]" here, which reads as other shapes and no log search finds.
  const std::string error = volt_test::error_of<volt::ValueError>([] {
    volt::fused_linear_activation(torch::zeros({2, 1024}), torch::zeros({1000, 4096}), {},
                                  volt::Activation::kRelu, /*require_fused=*/false);
  });
  EXPECT_NE(error.find("input [2, 1024] does not fit weight [1000, 4096]"), std::string::npos)
      << error;
  EXPECT_EQ(d::str_cat(1000, ' ', 0.5), "1000 0.5");
}

TEST_F(GermanIostreams, AFusedKernelWithAThousandInputsCompilesAndIsCachedByItsHash) {
  // The generated source indexes inputs with integers ("in[1.000]" does not compile), and the
  // cache entry is named by a hex hash that every process must spell alike.
  volt_test::TempDir cache;
  volt_test::ScopedEnv env{"VOLT_KERNEL_CACHE_CONFIG", cache.path + ",false,64"};
  volt::FusedElementwise wide("wide", {volt::jit::input(0) + volt::jit::input(1000) * 0.5},
                              volt::FusedElementwiseOptions().require_fused(true));
  std::vector<at::Tensor> xs(1001, torch::zeros({4}));
  xs[0] = torch::arange(4, torch::kFloat);
  xs[1000] = torch::full({4}, 2.0f);
  EXPECT_NE(wide.source(xs).find("in[1000]"), std::string::npos);
  EXPECT_TRUE(torch::equal(wide(xs)[0], xs[0] + 1));
  volt::KernelCache::global().flush();  // entries are written in the background
  std::vector<std::string> entries;
  for (const auto& e : std::filesystem::directory_iterator(cache.path)) {
    if (e.path().extension() == ".so") entries.push_back(e.path().filename().string());
  }
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_TRUE(std::regex_match(entries[0], std::regex("wide-[0-9a-f]{16}\\.so"))) << entries[0];
}

TEST_F(GermanIostreams, OptimizerStateKeysAreLibtorchsOwn) {
  // libtorch 1.13 keys optimizer state by the parameter's address as text made under the global
  // locale ("0x7ff.d9f.dc5..." here); volt's key must be that same text, or a fused optimizer's
  // and ZeRO's state would not be found. (In 2.x the key is the pointer itself.)
  auto w = torch::randn({4}, torch::requires_grad());
  torch::optim::Adam adam({w});
  w.sum().backward();
  adam.step();
  EXPECT_EQ(adam.state().count(d::state_key_for(w)), 1u);
}

TEST(MixedLocaleRanks, AgreeOnTheirConfigurationUnderDdpAndZero) {
  // Rank 1 runs with the C++ global locale de_DE (nodes of one job may differ in LANG). Every
  // rank's fingerprint of its configuration (parameter shapes: fc1 is [1000, 8]) and ZeRO's
  // partition layout (element counts) must be the same text: written "[1.000, 8]" on rank 1,
  // they were refused as configurations that differ between ranks.
  const std::string locales = built_locales("de_DE", "UTF-8");
  if (locales.empty()) GTEST_SKIP() << "localedef could not build de_DE.UTF-8" << kNoLocaledef;
  for (const std::vector<std::string> strategy :
       {std::vector<std::string>{}, std::vector<std::string>{"--zero", "1"}}) {
    volt_test::TempDir root;
    std::vector<std::string> args = {"--root",       root.path,     "--out",         root / "w",
                                     "--devices",    "2",           "--width",       "1000",
                                     "--samples",    "32",          "--timeout",     "30",
                                     "--cxx-locale", "de_DE.UTF-8", "--locale-rank", "1"};
    args.insert(args.end(), strategy.begin(), strategy.end());
    volt_test::Process job(volt_test::ddp_worker(), args, {{"LOCPATH", locales}});
    const int code = job.exit_code(std::chrono::seconds(120));
    EXPECT_EQ(code, 0) << job.output();
    EXPECT_NE(job.output().find("rank 1 done"), std::string::npos) << job.output();
  }
}

}  // namespace
