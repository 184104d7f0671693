#include <gtest/gtest.h>
#include <zlib.h>

#include <fstream>

#include "tiny.h"

namespace {

bool have_dataset() {
  std::ifstream f(std::string(volt::kFashionMnistDefaultRoot) + "/t10k-labels-idx1-ubyte.gz");
  return f.good();
}

TEST(FashionMnist, ReadsTheRealTestSplit) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist not installed (scripts/setup.sh)";
  volt::FashionMnist ds(volt::kFashionMnistDefaultRoot, volt::FashionMnist::Split::kTest, false);
  ASSERT_EQ(ds.size(), 10000);
  EXPECT_EQ(ds.inputs().sizes(), (std::vector<int64_t>{10000, 1, 28, 28}));
  EXPECT_GE(ds.inputs().min().item<float>(), 0.0f);
  EXPECT_LE(ds.inputs().max().item<float>(), 1.0f);
  // Balanced classes: exactly 1000 test images per class.
  auto counts = torch::bincount(ds.targets());
  EXPECT_TRUE(counts.eq(1000).all().item<bool>());
  // First test label of Fashion-MNIST is 9 (ankle boot).
  EXPECT_EQ(ds.targets()[0].item<int64_t>(), 9);
}

TEST(FashionMnist, MissingFolderIsADataError) {
  try {
    volt::FashionMnist ds("/nonexistent/fmnist", volt::FashionMnist::Split::kTrain);
    FAIL();
  } catch (const volt::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("not found"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("dataset-fashion-mnist"), std::string::npos);
  }
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

TEST(FashionMnist, TruncatedAndCorruptedFilesAreDataErrors) {
  volt_test::TempDir dir;
  // Header promises 2 images of 28x28 but holds 10 bytes of pixels.
  std::string header("\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x1c\x00\x00\x00\x1c", 16);
  write_gz(dir / "t10k-images-idx3-ubyte.gz", header + std::string(10, '\x01'));
  write_gz(dir / "t10k-labels-idx1-ubyte.gz",
           std::string("\x00\x00\x08\x01\x00\x00\x00\x02\x01\x02", 10));
  try {
    volt::FashionMnist ds(dir.path, volt::FashionMnist::Split::kTest);
    FAIL();
  } catch (const volt::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  // Wrong magic.
  write_gz(dir / "bad.gz", std::string("\x01\x02\x03\x04", 4));
  EXPECT_THROW(volt::read_idx_file(dir / "bad.gz"), volt::DataError);
  // A gzip stream cut in half.
  write_gz(dir / "full.gz", header + std::string(2 * 28 * 28, '\x05'));
  std::ifstream in(dir / "full.gz", std::ios::binary);
  std::string gz((std::istreambuf_iterator<char>(in)), {});
  std::ofstream(dir / "cut.gz", std::ios::binary) << gz.substr(0, gz.size() / 2);
  EXPECT_THROW(volt::read_idx_file(dir / "cut.gz"), volt::DataError);
  EXPECT_EQ(volt::read_idx_file(dir / "full.gz").sizes(), (std::vector<int64_t>{2, 28, 28}));
}

}  // namespace
