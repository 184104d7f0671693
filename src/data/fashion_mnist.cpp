#include "volt/data/fashion_mnist.h"

#include <torch/torch.h>
#include <zlib.h>

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "volt/core/check.h"

namespace volt {
namespace {

bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// A file read through zlib: gzread reads plain files transparently, so one reader serves .gz
// and raw IDX files.
class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path), f_(gzopen(path.c_str(), "rb")) {
    VOLT_CHECK(f_ != nullptr, DataError, "[FashionMnist] cannot open '", path,
               "'; install Debian's dataset-fashion-mnist or pass the folder holding the IDX "
               "files.");
  }
  ~GzFile() { gzclose(f_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  /// Appends up to `limit` bytes (fewer at the end of the file) to `out`.
  void read(std::vector<uint8_t>& out, size_t limit) {
    uint8_t buf[1 << 16];
    while (limit > 0) {
      const int n = gzread(f_, buf, static_cast<unsigned>(std::min(limit, sizeof(buf))));
      if (n < 0) {
        int err = 0;
        const std::string msg = gzerror(f_, &err);
        VOLT_CHECK(false, DataError, "[FashionMnist] '", path_, "' is corrupted (zlib: ", msg,
                   "); re-install the dataset files.");
      }
      if (n == 0) return;
      out.insert(out.end(), buf, buf + n);
      limit -= static_cast<size_t>(n);
    }
  }

 private:
  std::string path_;
  gzFile f_;
};

uint32_t be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

std::string find_file(const std::string& root, const std::string& stem) {
  for (const std::string& cand : {root + "/" + stem + ".gz", root + "/" + stem}) {
    if (file_exists(cand)) return cand;
  }
  VOLT_CHECK(false, DataError, "[FashionMnist] '", root, "/", stem,
             "[.gz]' not found; install Debian's dataset-fashion-mnist (scripts/setup.sh does) "
             "or pass the folder holding the IDX files.");
  return {};
}

}  // namespace

at::Tensor read_idx_file(const std::string& path) {
  GzFile file(path);
  std::vector<uint8_t> data;
  file.read(data, 4);
  VOLT_CHECK(data.size() >= 4, DataError, "[FashionMnist] '", path, "' is truncated (", data.size(),
             " bytes, no IDX header); re-install the dataset files.");
  // IDX header: two zero bytes, a type code (0x08 = uint8), the number of dimensions.
  VOLT_CHECK(data[0] == 0 && data[1] == 0 && data[2] == 0x08 && data[3] >= 1 && data[3] <= 4,
             DataError, "[FashionMnist] '", path, "' is not a uint8 IDX file (magic ", int(data[0]),
             ",", int(data[1]), ",", int(data[2]), ",", int(data[3]), "); check the path.");
  const size_t ndim = data[3];
  file.read(data, 4 * ndim);
  VOLT_CHECK(data.size() >= 4 + 4 * ndim, DataError, "[FashionMnist] '", path,
             "' is truncated inside its header; re-install the dataset files.");
  std::vector<int64_t> dims;
  uint64_t numel = 1;
  for (size_t i = 0; i < ndim; ++i) {
    dims.push_back(be32(&data[4 + 4 * i]));
    // Four 32-bit sizes can multiply past 64 bits, and a wrapped product could match the data.
    VOLT_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(dims.back()), &numel),
               DataError, "[FashionMnist] '", path, "': the sizes in its header overflow 64 bits; ",
               "the file is corrupted, re-install the dataset files.");
  }
  const size_t offset = 4 + 4 * ndim;
  // The data, read no further than the header's promise plus one byte: memory stays bounded by
  // the claim (a gzip stream can inflate to anything), and the extra byte tells a longer file.
  const uint64_t left = std::numeric_limits<size_t>::max() - offset - 1;
  file.read(data, static_cast<size_t>(std::min<uint64_t>(numel, left) + 1));
  const size_t got = data.size() - offset;
  VOLT_CHECK(got == numel, DataError, "[FashionMnist] '", path, "' holds ",
             got > numel ? "more than " + std::to_string(numel) : std::to_string(got),
             " data bytes but its header promises ", numel,
             "; the file is truncated or corrupted, re-install the dataset files.");
  auto t = torch::empty(dims, torch::kUInt8);
  std::memcpy(t.data_ptr<uint8_t>(), data.data() + offset, numel);
  return t;
}

namespace {
std::pair<at::Tensor, at::Tensor> load_split(const std::string& root, FashionMnist::Split split,
                                             bool normalize) {
  const std::string prefix = split == FashionMnist::Split::kTrain ? "train" : "t10k";
  auto images = read_idx_file(find_file(root, prefix + "-images-idx3-ubyte"));
  auto labels = read_idx_file(find_file(root, prefix + "-labels-idx1-ubyte"));
  VOLT_CHECK(images.dim() == 3 && labels.dim() == 1 && images.size(0) == labels.size(0) &&
                 images.size(1) == 28 && images.size(2) == 28,
             DataError, "[FashionMnist] images ", images.sizes(), " and labels ", labels.sizes(),
             " under '", root, "' do not match; expected [N,28,28] and [N].");
  // A label past the 10 classes (another data set's files, a damaged file of the right length)
  // would fail deep in the loss, or assert on a CUDA device.
  VOLT_CHECK(labels.numel() == 0 || labels.max().item<int64_t>() < 10, DataError,
             "[FashionMnist] '", root, "' has labels up to ", labels.max().item<int64_t>(),
             " in its ", prefix,
             " label file; Fashion-MNIST has classes 0-9: point root at Fashion-MNIST's files.");
  auto x = images.to(torch::kFloat32).div_(255.0f).unsqueeze_(1).contiguous();
  if (normalize) x.sub_(0.2860f).div_(0.3530f);
  return {x, labels.to(torch::kInt64)};
}
}  // namespace

FashionMnist::FashionMnist(const std::string& root, Split split, bool normalize)
    : TensorDataset([&] {
        auto p = load_split(root, split, normalize);
        return TensorDataset(p.first, p.second);
      }()) {}

}  // namespace volt
