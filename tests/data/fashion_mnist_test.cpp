#include <gtest/gtest.h>
#include <zlib.h>

#include <fstream>

#include "file_text.h"
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
  const std::string gz = volt_test::file_text(dir / "full.gz");
  std::ofstream(dir / "cut.gz", std::ios::binary) << gz.substr(0, gz.size() / 2);
  EXPECT_THROW(volt::read_idx_file(dir / "cut.gz"), volt::DataError);
  EXPECT_EQ(volt::read_idx_file(dir / "full.gz").sizes(), (std::vector<int64_t>{2, 28, 28}));
}

// Files that parse but are not Fashion-MNIST: images of another size, a label past the 10
// classes (before, accepted: the label failed deep in the loss, or asserted on a CUDA device).
TEST(FashionMnist, ImagesOfAnotherSizeOrLabelsPastNineAreDataErrors) {
  volt_test::TempDir dir;
  const std::string labels_ok("\x00\x00\x08\x01\x00\x00\x00\x02\x01\x02", 10);
  const std::string images28("\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x1c\x00\x00\x00\x1c",
                             16);
  const std::string images32("\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x20\x00\x00\x00\x20",
                             16);
  auto error = [&] {
    try {
      volt::FashionMnist ds(dir.path, volt::FashionMnist::Split::kTest);
    } catch (const volt::DataError& e) {
      return std::string(e.what());
    }
    return std::string("no DataError");
  };
  write_gz(dir / "t10k-images-idx3-ubyte.gz", images32 + std::string(2 * 32 * 32, '\x01'));
  write_gz(dir / "t10k-labels-idx1-ubyte.gz", labels_ok);
  EXPECT_NE(error().find("expected [N,28,28] and [N]"), std::string::npos) << error();
  write_gz(dir / "t10k-images-idx3-ubyte.gz", images28 + std::string(2 * 28 * 28, '\x01'));
  write_gz(dir / "t10k-labels-idx1-ubyte.gz",
           std::string("\x00\x00\x08\x01\x00\x00\x00\x02\x01\xc8", 10));  // 1 and 200
  EXPECT_NE(error().find("has labels up to 200"), std::string::npos) << error();
  write_gz(dir / "t10k-labels-idx1-ubyte.gz", labels_ok);
  EXPECT_EQ(volt::FashionMnist(dir.path, volt::FashionMnist::Split::kTest).size(), 2);
}

std::string error_of(const std::string& path) {
  try {
    volt::read_idx_file(path);
  } catch (const volt::DataError& e) {
    return e.what();
  }
  return "no DataError";
}

// Headers that lie (session 22): sizes whose product passes 64 bits (four 65536s make 2^64, which
// wrapped to 0 and matched an empty body: libtorch then refused the sizes with its own c10::Error),
// a body longer than promised, and a gzip stream inflating far past the claim, read no further
// than the claim plus one byte.
TEST(FashionMnist, HeadersThatLieAreDataErrorsAndBoundTheRead) {
  volt_test::TempDir dir;
  const std::string huge(
      "\x00\x00\x08\x04\x00\x01\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00"
      "\x00\x01\x00\x00",
      20);
  write_gz(dir / "huge.gz", huge);
  EXPECT_NE(error_of(dir / "huge.gz").find("the sizes in its header overflow 64 bits"),
            std::string::npos)
      << error_of(dir / "huge.gz");

  const std::string header("\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x1c\x00\x00\x00\x1c", 16);
  write_gz(dir / "long.gz", header + std::string(2 * 28 * 28 + 5, '\x05'));
  EXPECT_NE(error_of(dir / "long.gz")
                .find("holds more than 1568 data bytes but its header "
                      "promises 1568"),
            std::string::npos)
      << error_of(dir / "long.gz");

  // 10 bytes promised, 64 MiB of zeros behind them (64 KiB of gzip).
  write_gz(dir / "bomb.gz", std::string("\x00\x00\x08\x01\x00\x00\x00\x0a", 8) +
                                std::string(size_t{64} << 20, '\0'));
  EXPECT_NE(error_of(dir / "bomb.gz").find("holds more than 10 data bytes"), std::string::npos)
      << error_of(dir / "bomb.gz");
}

}  // namespace
