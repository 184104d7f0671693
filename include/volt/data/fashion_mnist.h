#pragma once
/// Fashion-MNIST (and MNIST) from the IDX files, gzipped or not, e.g. Debian's
/// dataset-fashion-mnist.

#include <string>

#include "volt/data/dataset.h"

namespace volt {

/// Where Debian's dataset-fashion-mnist package installs the files.
constexpr const char* kFashionMnistDefaultRoot = "/usr/share/datasets/fashion-mnist";

/// Reads an IDX file (optionally .gz) into a uint8 tensor with the file's dimensions.
/// Throws DataError naming the file when it is missing, truncated or malformed.
at::Tensor read_idx_file(const std::string& path);

/// The 60k-train / 10k-test Fashion-MNIST split as float images [N,1,28,28] scaled to [0,1]
/// (optionally normalized with the training set's mean 0.2860 and std 0.3530) and int64 labels.
class FashionMnist : public TensorDataset {
 public:
  enum class Split { kTrain, kTest };
  /// Looks for {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] under `root`.
  FashionMnist(const std::string& root, Split split, bool normalize = true);
};

}  // namespace volt
