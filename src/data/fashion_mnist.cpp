#include "volt/data/fashion_mnist.h"

#include <torch/torch.h>
#include <zlib.h>

#include <sys/stat.h>

#include "volt/core/check.h"

namespace volt {
namespace {

bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// gzread reads plain files transparently, so one reader serves .gz and raw IDX files.
std::vector<uint8_t> read_all(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  VOLT_CHECK(f != nullptr, DataError, "[FashionMnist] cannot open '", path,
             "'; install Debian's dataset-fashion-mnist or pass the folder holding the IDX files.");
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  for (;;) {
    int n = gzread(f, buf, sizeof(buf));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      VOLT_CHECK(false, DataError, "[FashionMnist] '", path, "' is corrupted (zlib: ", msg,
                 "); re-install the dataset files.");
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  gzclose(f);
  return out;
}

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
  std::vector<uint8_t> data = read_all(path);
  VOLT_CHECK(data.size() >= 4, DataError, "[FashionMnist] '", path, "' is truncated (", data.size(),
             " bytes, no IDX header); re-install the dataset files.");
  // IDX header: two zero bytes, a type code (0x08 = uint8), the number of dimensions.
  VOLT_CHECK(data[0] == 0 && data[1] == 0 && data[2] == 0x08 && data[3] >= 1 && data[3] <= 4,
             DataError, "[FashionMnist] '", path, "' is not a uint8 IDX file (magic ", int(data[0]),
             ",", int(data[1]), ",", int(data[2]), ",", int(data[3]), "); check the path.");
  const size_t ndim = data[3];
  VOLT_CHECK(data.size() >= 4 + 4 * ndim, DataError, "[FashionMnist] '", path,
             "' is truncated inside its header; re-install the dataset files.");
  std::vector<int64_t> dims;
  size_t numel = 1;
  for (size_t i = 0; i < ndim; ++i) {
    dims.push_back(be32(&data[4 + 4 * i]));
    numel *= static_cast<size_t>(dims.back());
  }
  const size_t offset = 4 + 4 * ndim;
  VOLT_CHECK(data.size() - offset == numel, DataError, "[FashionMnist] '", path, "' holds ",
             data.size() - offset, " data bytes but its header promises ", numel,
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
  VOLT_CHECK(images.dim() == 3 && labels.dim() == 1 && images.size(0) == labels.size(0), DataError,
             "[FashionMnist] images ", images.sizes(), " and labels ", labels.sizes(), " under '",
             root, "' do not match; expected [N,28,28] and [N].");
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
