#include "volt/data/data_loader.h"

#include <torch/torch.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <ostream>
#include <thread>

#include "volt/core/check.h"

namespace volt {

std::ostream& operator<<(std::ostream& os, const DataLoaderOptions& o) {
  return os << "DataLoaderOptions(batch_size=" << o.batch_size() << ", shuffle=" << o.shuffle()
            << ", seed=" << (o.seed() ? std::to_string(*o.seed()) : std::string("global"))
            << ", drop_last=" << o.drop_last() << ", num_workers=" << o.num_workers()
            << ", prefetch_factor=" << o.prefetch_factor() << ", pin_memory=" << o.pin_memory()
            << ", prefetch_to_device=" << o.prefetch_to_device()
            << ", collate=" << (o.collate() ? "custom" : "default") << ", rank=" << o.rank()
            << ", world_size=" << o.world_size() << ", even_shards=" << o.even_shards() << ")";
}

std::ostream& operator<<(std::ostream& os, CombineMode mode) {
  switch (mode) {
    case CombineMode::kMaxSizeCycle: return os << "max_size_cycle";
    case CombineMode::kMinSize: return os << "min_size";
    case CombineMode::kMaxSize: return os << "max_size";
  }
  return os << "CombineMode(" << static_cast<int>(mode) << ")";
}

struct DataLoader::Combined {
  std::vector<std::string> names;
  std::vector<DataLoader> loaders;
  CombineMode mode = CombineMode::kMaxSizeCycle;
  // Where each loader's data set starts when the data sets are laid end to end in loader order
  // (torch's ConcatDataset): a combined batch's row indices are in that index space.
  std::vector<int64_t> offsets;
};

namespace {

// The size of the index space of `loader`'s rows: its data set's, or its loaders' data sets'
// laid end to end for a combined one.
int64_t index_space(const DataLoader& loader) {
  if (!loader.is_combined()) return loader.dataset().size();
  int64_t n = 0;
  for (const auto& part : loader.parts()) n += index_space(part.second);
  return n;
}

// Batches per epoch of a combined loader.
int64_t combined_count(const std::vector<DataLoader>& loaders, CombineMode mode) {
  int64_t n = loaders.front().num_batches();
  for (const auto& l : loaders) {
    n = mode == CombineMode::kMinSize ? std::min(n, l.num_batches()) : std::max(n, l.num_batches());
  }
  return n;
}

// Where batch `i` of a combined epoch comes from in a loader of `n` batches: whether it has one
// there, which pass over the loader (max_size_cycle starts it again) and which batch of that pass.
struct PartPosition {
  bool present;
  int64_t pass;
  int64_t index;
};

PartPosition part_position(CombineMode mode, int64_t n, int64_t i) {
  if (mode == CombineMode::kMaxSizeCycle) return {n > 0, n > 0 ? i / n : 0, n > 0 ? i % n : 0};
  return {i < n, 0, i};
}

// The sampler epoch of pass `pass` in `epoch`: the epoch itself for the first pass, then numbers
// no real epoch reaches, so each further pass over a shuffling loader has an order of its own.
int64_t pass_epoch(int64_t epoch, int64_t pass) {
  return pass == 0 ? epoch : epoch + (pass << 32);
}

DataLoaderOptions combined_options(const std::vector<DataLoader>& loaders) {
  DataLoaderOptions o = loaders.front().options();
  int64_t batch_size = 0;
  bool shuffle = false, pin = true, prefetch = true;
  for (const auto& l : loaders) {
    // The sum is the combined batch's samples; past int64 it would wrap (undefined behaviour).
    VOLT_CHECK(l.options().batch_size() <= std::numeric_limits<int64_t>::max() - batch_size,
               ConfigError,
               "[DataLoader] the combined loaders' batch sizes add up past 2^63; "
               "give each loader a batch size it can hold in memory.");
    batch_size += l.options().batch_size();
    shuffle = shuffle || l.options().shuffle();
    pin = pin && l.options().pin_memory();
    prefetch = prefetch && l.options().prefetch_to_device();
  }
  return o.batch_size(batch_size).shuffle(shuffle).pin_memory(pin).prefetch_to_device(prefetch);
}

// Puts one loader's batch into a combined batch as the extra entries `<name>/...`.
void add_part(Batch& out, const std::string& name, Batch&& b) {
  if (b.input.defined()) out.extra.emplace(name + "/input", std::move(b.input));
  if (b.target.defined()) out.extra.emplace(name + "/target", std::move(b.target));
  for (auto& kv : b.extra) {
    VOLT_CHECK(kv.first != "input" && kv.first != "target", ConfigError,
               "[DataLoader] combined loader '", name,
               "' gives a batch with an extra tensor named '", kv.first, "', which its part's ",
               kv.first, " would overwrite; rename that extra tensor.");
    out.extra.emplace(name + "/" + kv.first, std::move(kv.second));
  }
}

}  // namespace

DataLoader combined_loader(std::vector<std::pair<std::string, DataLoader>> loaders,
                           CombineMode mode) {
  VOLT_CHECK(!loaders.empty(), ConfigError,
             "[DataLoader] combined_loader was given no loaders; pass at least one (name, "
             "loader) pair.");
  auto c = std::make_shared<DataLoader::Combined>();
  c->mode = mode;
  for (auto& nl : loaders) {
    VOLT_CHECK(!nl.first.empty() && nl.first.find('/') == std::string::npos, ConfigError,
               "[DataLoader] combined_loader: the name '", nl.first,
               "' is empty or has a '/'; name each loader with a non-empty name without '/' "
               "(Batch::part(name) reads it back).");
    VOLT_CHECK(std::find(c->names.begin(), c->names.end(), nl.first) == c->names.end(), ConfigError,
               "[DataLoader] combined_loader: two loaders are named '", nl.first,
               "'; give each a name of its own.");
    c->names.push_back(nl.first);
    c->offsets.push_back(c->offsets.empty() ? 0
                                            : c->offsets.back() + index_space(c->loaders.back()));
    c->loaders.push_back(std::move(nl.second));
  }
  return DataLoader(std::shared_ptr<const DataLoader::Combined>(std::move(c)));
}

DataLoader::DataLoader(std::shared_ptr<const Combined> combined)
    : dataset_(combined->loaders.front().dataset_),
      options_(combined_options(combined->loaders)),
      sampler_(combined->loaders.front().sampler_),
      combined_(std::move(combined)) {}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)),
      options_(std::move(options)),
      sampler_(dataset_ ? dataset_->size() : 0, options_.shuffle(), options_.seed(),
               options_.rank(), options_.world_size(), options_.even_shards()) {
  VOLT_CHECK(dataset_ != nullptr, ConfigError, "[DataLoader] dataset is null; pass a Dataset.");
  VOLT_CHECK(options_.batch_size() >= 1, ConfigError,
             "[DataLoader] batch_size=", options_.batch_size(), " must be >= 1.");
  VOLT_CHECK(options_.num_workers() >= 0, ConfigError,
             "[DataLoader] num_workers=", options_.num_workers(),
             " must be >= 0 (0 loads batches on the calling thread).");
  VOLT_CHECK(options_.prefetch_factor() >= 1, ConfigError,
             "[DataLoader] prefetch_factor=", options_.prefetch_factor(), " must be >= 1.");
  // One thread per worker and num_workers x prefetch_factor batches held: past these bounds a
  // typo, not a setting (the product overflowed to a negative capacity, and every thread waited
  // forever).
  constexpr int64_t kMaxWorkers = 1024, kMaxAhead = int64_t{1} << 20;
  VOLT_CHECK(options_.num_workers() <= kMaxWorkers, ConfigError,
             "[DataLoader] num_workers=", options_.num_workers(), " is more than ", kMaxWorkers,
             " threads; use at most the cores that load data (e.g. 4).");
  VOLT_CHECK(options_.prefetch_factor() <= kMaxAhead / std::max<int64_t>(1, options_.num_workers()),
             ConfigError, "[DataLoader] prefetch_factor=", options_.prefetch_factor(), " with ",
             options_.num_workers(), " workers holds more than ", kMaxAhead,
             " batches ahead; use a small factor (2 is the default).");
}

// This combined loader with each of its loaders changed by `change`, names and mode kept.
DataLoader DataLoader::recombined(
    const std::function<DataLoader(const DataLoader&)>& change) const {
  std::vector<std::pair<std::string, DataLoader>> parts;
  for (size_t j = 0; j < combined_->loaders.size(); ++j) {
    parts.emplace_back(combined_->names[j], change(combined_->loaders[j]));
  }
  return combined_loader(std::move(parts), combined_->mode);
}

DataLoader DataLoader::sharded(int64_t rank, int64_t world_size, bool even) const {
  if (combined_)
    return recombined([&](const DataLoader& l) { return l.sharded(rank, world_size, even); });
  DataLoaderOptions o = options_;
  o.rank(rank).world_size(world_size).even_shards(even);
  return with_options(std::move(o));
}

DataLoader DataLoader::sharded_where_unsharded(int64_t rank, int64_t world_size, bool even) const {
  if (combined_) {
    return recombined(
        [&](const DataLoader& l) { return l.sharded_where_unsharded(rank, world_size, even); });
  }
  return options_.world_size() > 1 ? *this : sharded(rank, world_size, even);
}

DataLoader DataLoader::with_options(DataLoaderOptions options) const {
  VOLT_CHECK(!combined_, ConfigError,
             "[DataLoader] a combined loader's options are its loaders'; set them on each loader "
             "before combined_loader().");
  return DataLoader(dataset_, std::move(options));
}

DataLoader DataLoader::with_shuffle(bool shuffle) const {
  if (combined_) return recombined([&](const DataLoader& l) { return l.with_shuffle(shuffle); });
  DataLoaderOptions o = options_;
  o.shuffle(shuffle);
  return with_options(std::move(o));
}

std::vector<std::pair<std::string, DataLoader>> DataLoader::parts() const {
  std::vector<std::pair<std::string, DataLoader>> out;
  if (!combined_) return out;
  for (size_t j = 0; j < combined_->loaders.size(); ++j) {
    out.emplace_back(combined_->names[j], combined_->loaders[j]);
  }
  return out;
}

int64_t DataLoader::num_batches() const {
  if (combined_) return combined_count(combined_->loaders, combined_->mode);
  const int64_t n = sampler_.size();
  const int64_t bs = options_.batch_size();
  return options_.drop_last() ? n / bs : n / bs + (n % bs != 0);  // n + bs - 1 could overflow
}

int64_t DataLoader::last_batch_size() const {
  if (combined_) {
    // The parts of the epoch's last batch: each a full batch of its loader, or its last one.
    const int64_t last = num_batches() - 1;
    int64_t samples = 0;
    for (const auto& l : combined_->loaders) {
      const PartPosition p =
          part_position(combined_->mode, l.num_batches(), std::max<int64_t>(last, 0));
      if (last < 0 || !p.present) continue;
      samples += p.index == l.num_batches() - 1 ? l.last_batch_size() : l.options().batch_size();
    }
    return samples;
  }
  const int64_t n = sampler_.size(), bs = options_.batch_size();
  if (num_batches() == 0) return 0;
  return options_.drop_last() || n % bs == 0 ? bs : n % bs;
}

Batch DataLoader::make_batch(const std::vector<int64_t>& indices) const {
  Batch b;
  c10::optional<Batch> fast;
  if (!options_.collate()) fast = dataset_->get_batch(indices);
  if (fast) {
    b = std::move(*fast);
  } else {
    std::vector<Example> examples;
    examples.reserve(indices.size());
    for (int64_t i : indices) examples.push_back(dataset_->get(i));
    b = options_.collate() ? options_.collate()(examples) : default_collate(examples);
  }
  // Pinned memory only exists with a CUDA runtime; on CPU the flag is a documented no-op.
  if (options_.pin_memory() && torch::cuda::is_available()) b = b.pin_memory();
  return b;
}

struct BatchStream::Impl {
  // A copy of the loader (shared data set, a few options): a stream may outlive the DataLoader
  // it came from (`for (auto s = make_loader().stream(0); s.next(b);)`).
  explicit Impl(const DataLoader& l) : own(l), loader(&own) {}
  const DataLoader own;
  const DataLoader* loader;
  std::vector<int64_t> order;
  int64_t first = 0;  // first batch index of this pass (within the epoch)
  int64_t count = 0;  // batches this pass yields
  int64_t consumed = 0;

  // Worker state (unused when num_workers == 0).
  std::mutex mu;
  std::condition_variable cv_ready, cv_space;
  std::map<int64_t, Batch> ready;
  int64_t next_to_claim = 0;
  int64_t capacity = 0;
  bool stop = false;
  // The first failed batch (lowest index) and its exception: the consumer receives it in order,
  // after the batches before it (as PyTorch's DataLoader re-raises a worker's error at its
  // index), so how far a run gets does not depend on which worker failed first.
  std::exception_ptr error;
  int64_t error_batch = std::numeric_limits<int64_t>::max();
  std::vector<std::thread> workers;

  // Combined loader: its loaders and, per loader, the pass being read and its number.
  std::shared_ptr<const DataLoader::Combined> combined;
  int64_t epoch = 0;
  std::vector<std::unique_ptr<BatchStream>> passes;
  std::vector<int64_t> pass_of;
  std::vector<int64_t> combined_indices;  // the latest combined batch's rows, offset per loader

  Batch next_combined() {
    const DataLoader::Combined& c = *combined;
    const int64_t i = first + consumed;
    Batch out;
    combined_indices.clear();
    for (size_t j = 0; j < c.loaders.size(); ++j) {
      const DataLoader& l = c.loaders[j];
      const int64_t n = l.num_batches();
      const PartPosition p = part_position(c.mode, n, i);
      if (!p.present) continue;
      if (!passes[j] || pass_of[j] != p.pass) {
        // Only the batches of this pass that the combined stream will still read, so that a
        // loader's workers build no batch nobody takes.
        const int64_t wanted = std::min(n - p.index, count - consumed);
        passes[j] =
            std::make_unique<BatchStream>(l.stream(pass_epoch(epoch, p.pass), p.index, wanted));
        pass_of[j] = p.pass;
      }
      Batch b;
      VOLT_ASSERT(passes[j]->next(b), "combined loader '", c.names[j], "' ran out at batch ", i);
      for (int64_t k : passes[j]->last_indices()) combined_indices.push_back(c.offsets[j] + k);
      add_part(out, c.names[j], std::move(b));
    }
    return out;
  }

  std::vector<int64_t> indices_of(int64_t k) const {
    const int64_t bs = loader->options().batch_size();
    const int64_t begin = (first + k) * bs;
    const int64_t end = std::min<int64_t>(begin + bs, static_cast<int64_t>(order.size()));
    return std::vector<int64_t>(order.begin() + begin, order.begin() + end);
  }

  void work() {
    for (;;) {
      int64_t k;
      {
        std::unique_lock<std::mutex> lock(mu);
        // Bounded prefetch: never run more than `capacity` batches ahead of the consumer.
        cv_space.wait(lock, [&] { return stop || next_to_claim < consumed + capacity; });
        // Nothing past a failed batch is built: the consumer stops there.
        if (stop || next_to_claim >= count || next_to_claim > error_batch) return;
        k = next_to_claim++;
      }
      try {
        Batch b = loader->make_batch(indices_of(k));
        std::lock_guard<std::mutex> lock(mu);
        ready.emplace(k, std::move(b));
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (k < error_batch) {
          error = std::current_exception();
          error_batch = k;
        }
      }
      cv_ready.notify_all();
      cv_space.notify_all();
    }
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv_space.notify_all();
    for (auto& t : workers) t.join();
  }
};

BatchStream DataLoader::stream(int64_t epoch, int64_t first_batch, int64_t max_batches) const {
  const int64_t total = num_batches();
  VOLT_CHECK(first_batch >= 0 && first_batch <= total, ValueError,
             "[DataLoader] first_batch=", first_batch, " is outside [0, ", total, "].");
  auto impl = std::make_unique<BatchStream::Impl>(*this);
  if (combined_) {
    if (combined_->mode == CombineMode::kMaxSizeCycle && total > 0) {
      for (size_t j = 0; j < combined_->loaders.size(); ++j) {
        VOLT_CHECK(combined_->loaders[j].num_batches() > 0, ConfigError,
                   "[DataLoader] combined loader '", combined_->names[j],
                   "' has no batches on this process (its data set is empty there, or holds "
                   "fewer samples than batch_size with drop_last), and "
                   "CombineMode::kMaxSizeCycle cannot start an empty loader again; give it data "
                   "or combine with CombineMode::kMaxSize.");
      }
    }
    impl->combined = combined_;
    impl->epoch = epoch;
    impl->first = first_batch;
    impl->count = total - first_batch;
    if (max_batches >= 0) impl->count = std::min(impl->count, max_batches);
    impl->passes.resize(combined_->loaders.size());
    impl->pass_of.assign(combined_->loaders.size(), -1);
    return BatchStream(std::move(impl));
  }
  impl->order = sampler_.indices(epoch);
  impl->first = first_batch;
  impl->count = total - first_batch;
  if (max_batches >= 0) impl->count = std::min(impl->count, max_batches);
  const int64_t nw = options_.num_workers();
  if (nw > 0 && impl->count > 0) {
    impl->capacity = nw * options_.prefetch_factor();
    for (int64_t i = 0; i < std::min(nw, impl->count); ++i) {
      impl->workers.emplace_back([p = impl.get()] { p->work(); });
    }
  }
  return BatchStream(std::move(impl));
}

BatchStream::BatchStream(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BatchStream::BatchStream(BatchStream&&) noexcept = default;
BatchStream& BatchStream::operator=(BatchStream&&) noexcept = default;
BatchStream::~BatchStream() = default;

int64_t BatchStream::size() const {
  return impl_->count;
}

std::vector<int64_t> BatchStream::last_indices() const {
  if (impl_->consumed == 0) return {};
  if (impl_->combined) return impl_->combined_indices;
  return impl_->indices_of(impl_->consumed - 1);
}

bool BatchStream::next(Batch& out) {
  Impl& s = *impl_;
  if (s.consumed >= s.count) return false;
  if (s.combined) {
    out = s.next_combined();
    ++s.consumed;
    return true;
  }
  if (s.workers.empty()) {
    out = s.loader->make_batch(s.indices_of(s.consumed));
    ++s.consumed;
    return true;
  }
  std::unique_lock<std::mutex> lock(s.mu);
  // Every batch before error_batch was claimed before it, so it arrives or fails in its turn.
  s.cv_ready.wait(lock,
                  [&] { return s.error_batch == s.consumed || s.ready.count(s.consumed) > 0; });
  if (s.error_batch == s.consumed) std::rethrow_exception(s.error);
  auto it = s.ready.find(s.consumed);
  out = std::move(it->second);
  s.ready.erase(it);
  ++s.consumed;
  lock.unlock();
  s.cv_space.notify_all();
  return true;
}

BatchStream::iterator::iterator(BatchStream* stream) : stream_(stream) {
  ++*this;
}

BatchStream::iterator& BatchStream::iterator::operator++() {
  if (stream_ != nullptr && !stream_->next(batch_)) {
    stream_ = nullptr;
    batch_ = Batch();
  }
  return *this;
}

BatchStream::iterator BatchStream::begin() {
  return iterator(this);
}

}  // namespace volt
