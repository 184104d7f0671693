// safetensors: reads a file Python wrote (tools/safetensors_fixture.py), Python reads what volt
// writes (tools/check_safetensors.py), round trips, and every malformed-file path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "build_paths.h"
#include "io/detail/safetensors_parse.h"
#include "peak_rss.h"
#include "python_tool.h"
#include "tiny.h"

namespace {

const std::string kFixture = volt_test::source_dir() + "/tests/io/data/python_written.safetensors";

void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header << data;
}

template <typename E = volt::CheckpointError>
void expect_load_error(const std::string& path, const std::string& phrase) {
  try {
    volt::load_safetensors(path);
    FAIL() << "expected an error mentioning '" << phrase << "'";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("[Safetensors]", 0), 0u) << e.what();
  }
}

TEST(Safetensors, OverlappingEntriesAreRefusedBeforeAnyTensorIsMade) {
  // 100 entries, each naming the whole 16 MiB data section: the reader made each tensor as it
  // went and found the overlap only after the loop, 1.6 GB later. The spans are checked first
  // now: the refusal costs no more than the file.
  const size_t kBytes = size_t{16} << 20;
  nlohmann::json header;
  for (int i = 0; i < 100; ++i) {
    header["t" + std::to_string(i)] = {
        {"dtype", "U8"}, {"shape", {kBytes}}, {"data_offsets", {0, kBytes}}};
  }
  const std::string text = header.dump();
  std::string file(8, '\0');
  const uint64_t n = text.size();
  std::memcpy(&file[0], &n, 8);
  file += text + std::string(kBytes, 'x');
  const long before = volt_test::peak_rss_kb();
  try {
    volt::detail::parse_safetensors(file, "overlap.safetensors");
    ADD_FAILURE() << "no error";
  } catch (const volt::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("overlap in the data section"), std::string::npos)
        << e.what();
  }
  // (A high-water mark: run alone, as ctest does, it sees this test's allocations.)
  EXPECT_LT(volt_test::peak_rss_kb() - before, 200 * 1024) << "KB more at the peak";
}

TEST(Safetensors, ReadsAFileWrittenByPython) {
  auto f = volt::load_safetensors(kFixture);
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.tensors.size(), 11u);
  EXPECT_TRUE(f.tensors.at("weight").equal(at::arange(6, at::kFloat).reshape({2, 3}) * 0.5 - 1));
  EXPECT_TRUE(f.tensors.at("bias").equal(
      at::tensor({1.5, -2.25, 3.0, 1e-300}, at::TensorOptions().dtype(at::kDouble))));
  EXPECT_TRUE(f.tensors.at("half").equal(at::tensor({0.5, -1.0}).to(at::kHalf)));
  EXPECT_TRUE(f.tensors.at("bf").equal(at::tensor({1.0, -2.5, 3.0}).to(at::kBFloat16)));
  EXPECT_TRUE(f.tensors.at("idx").equal(
      at::tensor({int64_t{1}, int64_t{-2}, int64_t{3}, int64_t{1} << 40}).reshape({2, 2})));
  EXPECT_EQ(f.tensors.at("empty").scalar_type(), at::kInt);
  EXPECT_EQ(f.tensors.at("empty").numel(), 0);
  EXPECT_TRUE(f.tensors.at("u8").equal(at::tensor({0, 255, 7}).to(at::kByte)));
  EXPECT_TRUE(f.tensors.at("flag").equal(at::tensor({1, 0, 1}).to(at::kBool)));
  EXPECT_EQ(f.tensors.at("scalar").dim(), 0);
  EXPECT_EQ(f.tensors.at("scalar").item<float>(), 3.25f);
  EXPECT_TRUE(f.tensors.at("i16").equal(at::tensor({-300, 300}).to(at::kShort)));
  EXPECT_TRUE(f.tensors.at("i8").equal(at::tensor({-7, 7}).to(at::kChar)));
}

TEST(Safetensors, ModuleRoundTripAndPythonReadsIt) {
  volt_test::TempDir dir;
  torch::manual_seed(0);
  auto net = torch::nn::Sequential(torch::nn::Linear(5, 4), torch::nn::BatchNorm1d(4),
                                   torch::nn::Linear(4, 3));
  net->forward(torch::randn({8, 5}));  // moves the BatchNorm running stats off their init
  const std::string path = dir / "model.safetensors";
  volt::save_safetensors(*net, path, {{"epoch", "3"}});
  torch::manual_seed(1);
  auto other = torch::nn::Sequential(torch::nn::Linear(5, 4), torch::nn::BatchNorm1d(4),
                                     torch::nn::Linear(4, 3));
  volt::load_safetensors(*other, path);
  auto a = net->named_parameters();
  for (const auto& p : other->named_parameters()) EXPECT_TRUE(p.value().equal(a[p.key()]));
  auto ab = net->named_buffers();
  for (const auto& b : other->named_buffers()) EXPECT_TRUE(b.value().equal(ab[b.key()]));
  EXPECT_EQ(volt::load_safetensors(path).metadata.at("epoch"), "3");

  // Python (python3-torch, no volt code) reads the same bytes back.
  if (!volt_test::has_python_torch()) {
    GTEST_SKIP() << "python3-torch not installed; skipping the Python read-back";
  }
  const auto run = volt_test::run_python_tool("check_safetensors.py", {path});
  ASSERT_EQ(run.status, 0) << run.out;
  auto j = nlohmann::json::parse(run.out);
  EXPECT_EQ(j["__metadata__"]["epoch"], "3");
  auto f = volt::load_safetensors(path);
  for (const auto& [name, t] : f.tensors) {
    ASSERT_TRUE(j.contains(name)) << name;
    EXPECT_EQ(j[name]["shape"].get<std::vector<int64_t>>(), t.sizes().vec());
    EXPECT_NEAR(j[name]["sum"].get<double>(), t.to(at::kDouble).sum().item<double>(), 1e-9);
  }
  EXPECT_EQ(j["1.num_batches_tracked"]["dtype"], "I64");
  EXPECT_EQ(j["0.weight"]["dtype"], "F32");
}

TEST(Safetensors, EveryDtypeRoundTrips) {
  volt_test::TempDir dir;
  auto src = volt::load_safetensors(kFixture);
  volt::save_safetensors(src.tensors, dir / "copy.safetensors", src.metadata);
  auto back = volt::load_safetensors(dir / "copy.safetensors");
  ASSERT_EQ(back.tensors.size(), src.tensors.size());
  for (const auto& [name, t] : src.tensors) {
    EXPECT_EQ(back.tensors.at(name).scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(back.tensors.at(name).equal(t)) << name;
  }
  EXPECT_EQ(back.metadata, src.metadata);
}

TEST(Safetensors, RejectsMalformedFiles) {
  volt_test::TempDir dir;
  const std::string p = dir / "bad.safetensors";
  expect_load_error(dir / "missing.safetensors", "cannot open");
  // A folder is said to be one (it read as a 0-byte file: "truncated or not safetensors").
  expect_load_error(dir.path, "cannot read file '" + dir.path + "' (Is a directory)");
  std::ofstream(p) << "abc";
  expect_load_error(p, "shorter than the 8-byte header length");
  write_raw(p, "{}", "");  // no tensors: a valid file
  EXPECT_TRUE(volt::load_safetensors(p).tensors.empty());
  {
    std::ofstream f(p, std::ios::binary);
    const uint64_t n = 1000;
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << "{}";
  }
  expect_load_error(p, "exceeds the file");
  write_raw(p, "{\"a\": {\"dtype\": \"F32\",\n \"shape\": [1], ", "");
  expect_load_error(p, "header: malformed JSON");
  write_raw(p, "[1, 2]", "");
  expect_load_error(p, "must be a JSON object");
  // Deep nesting stops at the depth limit at once: 10 MB of '[' took 6.6 s and 1.1 GB before the
  // parser failed (the format allows 100 MB: about 8 GB).
  write_raw(p, std::string(10000000, '['), "");
  expect_load_error(p, "nest more than 8 levels deep");
  write_raw(p, R"({"a": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}})", "x");
  expect_load_error(p, "unknown dtype 'F8_E4M3'");
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", "1234");
  expect_load_error(p, "out of range");
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [4, 0]}})", "12345678");
  expect_load_error(p, "out of range");
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", "12345678");
  expect_load_error(p, "need 12");
  write_raw(p,
            R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
            "12345678");
  expect_load_error(p, "overlap");
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", "12345678");
  expect_load_error(p, "belong to no tensor");
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", "12345678");
  expect_load_error(p, "trailing bytes");
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [1]}})", "1234");
  expect_load_error(p, "needs \"dtype\", \"shape\" and \"data_offsets\"");
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", "1234");
  expect_load_error(p, "non-negative integers");
  write_raw(p, R"({"__metadata__": {"k": 1}})", "");
  expect_load_error(p, "is not a string");
}

TEST(Safetensors, HugeShapesAreCheckpointErrorsNotLibtorchErrors) {
  // Found while writing fuzz/safetensors_fuzzer.cpp: 2^62 floats "need" 2^64 = 0 bytes, so
  // an empty span passed and at::empty threw its own error; a dimension above 2^63-1 became a
  // negative libtorch size even in an empty tensor.
  volt_test::TempDir dir;
  const std::string p = dir / "huge.safetensors";
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}})",
            "");
  expect_load_error(p, "overflows: 4611686018427387904 elements of 4 bytes");
  write_raw(p,
            R"({"a": {"dtype": "U8", "shape": [9223372036854775808, 0], "data_offsets": [0, 0]}})",
            "");
  expect_load_error(p, "has dimension 9223372036854775808, more than 2^63-1");
}

TEST(Safetensors, ModuleMismatchIsReportedOrSkipped) {
  volt_test::TempDir dir;
  auto small = torch::nn::Linear(3, 2);
  volt::save_safetensors(*small, dir / "w.safetensors");
  auto big = torch::nn::Linear(4, 2);
  try {
    volt::load_safetensors(*big, dir / "w.safetensors");
    FAIL() << "expected CheckpointError";
  } catch (const volt::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("shape of 'weight'"), std::string::npos) << e.what();
  }
  auto no_bias = torch::nn::Linear(torch::nn::LinearOptions(3, 2).bias(false));
  const at::Tensor before = no_bias->weight.clone();
  try {
    volt::load_safetensors(*no_bias, dir / "w.safetensors");
    FAIL() << "expected CheckpointError";
  } catch (const volt::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("unexpected 'bias'"), std::string::npos) << e.what();
  }
  // A strict mismatch changes nothing (before session 81 the matching weight was copied).
  EXPECT_TRUE(no_bias->weight.equal(before));
  volt::load_safetensors(*no_bias, dir / "w.safetensors", /*strict=*/false);
  EXPECT_TRUE(no_bias->weight.equal(small->weight));
}

TEST(Safetensors, RejectsUnsupportedDtypesAndNames) {
  volt_test::TempDir dir;
  try {
    volt::save_safetensors({{"c", at::zeros({2}, at::kComplexDouble)}}, dir / "c.safetensors");
    FAIL() << "expected ValueError";
  } catch (const volt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be stored"), std::string::npos);
  }
  EXPECT_THROW(volt::save_safetensors({{"__metadata__", at::zeros({1})}}, dir / "m.safetensors"),
               volt::ValueError);
  EXPECT_FALSE(std::ifstream(dir / "c.safetensors").good());  // nothing partial left behind
  // The header is JSON: a name or metadata value that is not UTF-8 is a ValueError (it escaped
  // as nlohmann's type_error before session 81).
  EXPECT_THROW(volt::save_safetensors({{"\xff", at::zeros({1})}}, dir / "u.safetensors"),
               volt::ValueError);
  EXPECT_THROW(
      volt::save_safetensors({{"a", at::zeros({1})}}, dir / "u.safetensors", {{"k", "\xfe"}}),
      volt::ValueError);
  EXPECT_FALSE(std::ifstream(dir / "u.safetensors").good());
}

// A written file's JSON header (and its length, the 8 bytes before it).
nlohmann::json header_of(const std::string& path, uint64_t* length = nullptr) {
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string json(n, ' ');
  in.read(json.data(), static_cast<std::streamsize>(n));
  if (length != nullptr) *length = n;
  return nlohmann::json::parse(json);
}

// Each tensor starts at a multiple of its element size (the reference writer's layout: widest
// dtype first), so a reader that maps the file casts in place. Before session 81 the tensors lay
// in name order: "a" (3 bytes) put "b" (float) at offset 3.
TEST(Safetensors, EveryTensorIsAlignedToItsElementSize) {
  volt_test::TempDir dir;
  const std::string p = dir / "mixed.safetensors";
  const std::map<std::string, at::Tensor> tensors{{"a", at::arange(3).to(at::kByte)},
                                                  {"b", at::arange(2).to(at::kFloat)},
                                                  {"c", at::arange(3).to(at::kShort)},
                                                  {"d", at::arange(5).to(at::kDouble)},
                                                  {"e", at::ones({1}, at::kBool)}};
  volt::save_safetensors(tensors, p);
  uint64_t n = 0;
  const auto header = header_of(p, &n);
  EXPECT_EQ((8 + n) % 8, 0u);
  for (const auto& [name, t] : tensors) {
    const uint64_t begin = header.at(name).at("data_offsets")[0].get<uint64_t>();
    EXPECT_EQ(begin % t.element_size(), 0u) << name << " at " << begin;
  }
  const auto back = volt::load_safetensors(p);
  for (const auto& [name, t] : tensors) EXPECT_TRUE(back.tensors.at(name).equal(t)) << name;
}

// The reference writer's order: its dtype enum descending (I64 before F64, F32 before I32, BF16
// before F16), then by name; volt sorted by element size alone, so same-width dtypes lay in name
// order and the bytes differed from Python's. Complex64 ("C64", safetensors 0.7) round-trips.
TEST(Safetensors, TensorsLieInTheReferenceWritersOrder) {
  volt_test::TempDir dir;
  const std::string p = dir / "order.safetensors";
  const std::map<std::string, at::Tensor> tensors{
      {"a", at::arange(2).to(at::kDouble)},     {"b", at::arange(2).to(at::kLong)},
      {"c", at::arange(2).to(at::kInt)},        {"d", at::arange(2).to(at::kFloat)},
      {"e", at::arange(2).to(at::kHalf)},       {"f", at::arange(2).to(at::kBFloat16)},
      {"g", at::randn({2}, at::kComplexFloat)}, {"h", at::arange(2).to(at::kDouble)}};
  volt::save_safetensors(tensors, p);
  const auto header = header_of(p);
  std::vector<std::pair<uint64_t, std::string>> laid;
  for (const auto& [name, t] : tensors) {
    laid.emplace_back(header.at(name).at("data_offsets")[0].get<uint64_t>(), name);
  }
  std::sort(laid.begin(), laid.end());
  std::string order;
  for (const auto& l : laid) order += l.second;
  EXPECT_EQ(order, "bahgdcfe");
  EXPECT_EQ(header.at("g").at("dtype"), "C64");
  const auto back = volt::load_safetensors(p);
  for (const auto& [name, t] : tensors) EXPECT_TRUE(back.tensors.at(name).equal(t)) << name;
}

}  // namespace
