#pragma once
/// DataLoader: batches a Dataset in a seeded, resumable order, optionally on worker threads.

#include <c10/util/Optional.h>
#include <torch/arg.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "volt/core/batch.h"
#include "volt/data/dataset.h"
#include "volt/data/sampler.h"

namespace volt {

using CollateFn = std::function<Batch(const std::vector<Example>&)>;

/// Options for DataLoader; batch_size is required.
struct DataLoaderOptions {
  explicit DataLoaderOptions(int64_t batch_size) : batch_size_(batch_size) {}
  /// Samples per batch.
  TORCH_ARG(int64_t, batch_size);
  /// Visit samples in a new random order every epoch. Default: false.
  TORCH_ARG(bool, shuffle) = false;
  /// Seed of the shuffle order (combined with the epoch number); unset: the global seed
  /// (volt::global_seed(): seed_everything's, 0 without one), read as each epoch's order is
  /// drawn, as Lightning's distributed sampler takes PL_GLOBAL_SEED. Default: unset.
  TORCH_ARG(c10::optional<uint64_t>, seed) = c10::nullopt;
  /// Drop the last batch when it is smaller than batch_size. Default: false.
  TORCH_ARG(bool, drop_last) = false;
  /// Worker threads that build batches ahead of the consumer; 0 builds them inline. Default: 0.
  TORCH_ARG(int64_t, num_workers) = 0;
  /// Batches each worker may keep ready ahead of the consumer (bounded queue). Default: 2.
  TORCH_ARG(int64_t, prefetch_factor) = 2;
  /// Copy batches into page-locked memory (CUDA only; a documented no-op on CPU). Default: false.
  TORCH_ARG(bool, pin_memory) = false;
  /// With pin_memory, on a CUDA run: fit fetches the next training batch as soon as a step is
  /// enqueued and copies it to the device on a side stream while that step runs (the transfer
  /// hooks still see each batch in its turn; a batch they replace is copied as usual).
  /// Default: true.
  TORCH_ARG(bool, prefetch_to_device) = true;
  /// Custom collate function; empty uses default_collate (or the dataset's batch fast path).
  TORCH_ARG(CollateFn, collate);
  /// This process's rank and the number of ranks sharing the data. Default: 0 of 1.
  TORCH_ARG(int64_t, rank) = 0;
  TORCH_ARG(int64_t, world_size) = 1;
  /// With world_size > 1: true pads the ranks' shards to equal length by repeating samples
  /// from the start (torch's DistributedSampler: every rank runs as many steps); false gives
  /// each sample to one rank only, the shards' lengths then differing by at most one (Lightning's
  /// UnrepeatedDistributedSampler, which the Trainer's predict uses). Default: true.
  TORCH_ARG(bool, even_shards) = true;
};

std::ostream& operator<<(std::ostream& os, const DataLoaderOptions& o);

class BatchStream;

/// How a combined loader's epoch ends (Lightning's CombinedLoader modes that training accepts;
/// for one loader after another, as Lightning's "sequential", pass evaluation loaders as a list).
enum class CombineMode {
  /// As many batches as the longest loader; a shorter one starts again when it runs out, each
  /// new pass over a shuffling loader in a new order (seeded by its seed, the epoch and the
  /// pass). Lightning's mode for several training loaders.
  kMaxSizeCycle,
  /// As many batches as the shortest loader (Lightning's CombinedLoader default).
  kMinSize,
  /// As many batches as the longest loader; a loader that has run out is absent from the later
  /// batches (Batch::has_part), as Lightning's None.
  kMaxSize,
};

std::ostream& operator<<(std::ostream& os, CombineMode mode);

/// A resumable loader: stream(epoch, start) yields exactly the batches a full pass would yield
/// from `start` on, so a run resumed mid-epoch sees the same data as an uninterrupted one.
class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);
  /// Batches per epoch on this rank.
  int64_t num_batches() const;
  /// Samples in the last batch of an epoch on this rank: batch_size, or fewer when the rank's
  /// samples do not fill it and drop_last is off (0 when there is no batch).
  int64_t last_batch_size() const;
  /// Batches `first_batch` .. `first_batch + max_batches - 1` (max_batches < 0: to the end).
  BatchStream stream(int64_t epoch, int64_t first_batch = 0, int64_t max_batches = -1) const;
  const DataLoaderOptions& options() const { return options_; }
  /// This loader over the shard of `rank` among `world_size` ranks (a distributed sampler: the
  /// same seeded per-epoch order on every rank, every world_size-th index from position `rank`,
  /// padded to equal length unless `even` is false: DataLoaderOptions::even_shards).
  DataLoader sharded(int64_t rank, int64_t world_size, bool even = true) const;
  /// sharded(), leaving alone a loader (or a combined loader's part) the program sharded itself
  /// (world_size > 1): what the Trainer's use_distributed_sampler does, as Lightning keeps a
  /// DistributedSampler it finds and replaces the others, part by part of a CombinedLoader.
  DataLoader sharded_where_unsharded(int64_t rank, int64_t world_size, bool even = true) const;
  /// A loader over the same dataset with other options (e.g. shuffling off). ConfigError for a
  /// combined loader, whose options are its loaders': set them before combining.
  DataLoader with_options(DataLoaderOptions options) const;
  /// This loader with shuffling on or off (each of a combined loader's loaders).
  DataLoader with_shuffle(bool shuffle) const;
  /// For a combined loader: its first loader's data set (parts() has each loader).
  const Dataset& dataset() const { return *dataset_; }
  /// Whether this loader combines several (combined_loader).
  bool is_combined() const { return combined_ != nullptr; }
  /// A combined loader's loaders with their names, in the order given (empty for one loader).
  std::vector<std::pair<std::string, DataLoader>> parts() const;

 private:
  friend class BatchStream;
  friend DataLoader combined_loader(std::vector<std::pair<std::string, DataLoader>>, CombineMode);
  struct Combined;
  explicit DataLoader(std::shared_ptr<const Combined> combined);
  DataLoader recombined(const std::function<DataLoader(const DataLoader&)>& change) const;
  Batch make_batch(const std::vector<int64_t>& indices) const;

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  Sampler sampler_;
  std::shared_ptr<const Combined> combined_;  // set for a combined loader
};

/// Several loaders as one (Lightning's CombinedLoader): each batch holds a batch of each loader,
/// read back with `batch.part(name)`; `mode` says how many batches an epoch has. Pass it where a
/// DataLoader goes (`Trainer::fit(module, combined_loader({{"a", a}, {"b", b}}), val)`, a
/// DataModule's train_dataloader()); exact resume, distributed sharding (each loader sharded) and
/// worker threads (each loader's own) work as for one loader. Its options() are its first
/// loader's with batch_size the sum of the loaders' (the samples of a full batch). A combined
/// batch's rows are its parts' in loader order, and BatchStream::last_indices() numbers them as
/// torch's ConcatDataset would the loaders' data sets laid end to end in that order (loader j's
/// sample k is k plus the sizes of the data sets before it), so a PredictionWriter gets every
/// row's place. Names must be distinct, non-empty and without '/'; otherwise, and for no
/// loaders, a ConfigError.
DataLoader combined_loader(std::vector<std::pair<std::string, DataLoader>> loaders,
                           CombineMode mode = CombineMode::kMaxSizeCycle);

/// One pass over part of an epoch. Worker exceptions are rethrown from next(). It holds a copy
/// of its loader (sharing the data set), so it may outlive the DataLoader it came from.
class BatchStream {
 public:
  BatchStream(BatchStream&&) noexcept;
  BatchStream& operator=(BatchStream&&) noexcept;
  ~BatchStream();
  /// Writes the next batch into `out`; false when the pass is over.
  bool next(Batch& out);
  /// Number of batches this pass yields in total.
  int64_t size() const;
  /// The dataset indices of the samples in the batch the latest next() returned, in its order
  /// (empty before the first batch; for a combined loader, in the loaders' data sets laid end
  /// to end: combined_loader).
  std::vector<int64_t> last_indices() const;

  /// Range-for over the rest of the pass, one next() per step:
  ///
  ///   for (volt::Batch& b : loader.stream(epoch)) { ... }
  ///
  /// An input iterator: the batch it points to is replaced by the next one when it advances.
  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = Batch*;
    using reference = Batch&;

    iterator() = default;
    Batch& operator*() { return batch_; }
    Batch* operator->() { return &batch_; }
    iterator& operator++();
    /// Equal when both are at the end (or both are the same stream's position).
    friend bool operator==(const iterator& a, const iterator& b) { return a.stream_ == b.stream_; }
    friend bool operator!=(const iterator& a, const iterator& b) { return !(a == b); }

   private:
    friend class BatchStream;
    explicit iterator(BatchStream* stream);
    BatchStream* stream_ = nullptr;  // null at the end
    Batch batch_;
  };
  /// Reads the first batch of what is left.
  iterator begin();
  iterator end() { return iterator(); }

 private:
  friend class DataLoader;
  struct Impl;
  explicit BatchStream(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace volt
