#include "volt/data/data_loader.h"

#include <torch/torch.h>

#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <ostream>
#include <thread>

#include "volt/core/check.h"

namespace volt {

std::ostream& operator<<(std::ostream& os, const DataLoaderOptions& o) {
  return os << "DataLoaderOptions(batch_size=" << o.batch_size() << ", shuffle=" << o.shuffle()
            << ", seed=" << o.seed() << ", drop_last=" << o.drop_last()
            << ", num_workers=" << o.num_workers() << ", prefetch_factor=" << o.prefetch_factor()
            << ", pin_memory=" << o.pin_memory()
            << ", prefetch_to_device=" << o.prefetch_to_device()
            << ", collate=" << (o.collate() ? "custom" : "default") << ", rank=" << o.rank()
            << ", world_size=" << o.world_size() << ")";
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)),
      options_(std::move(options)),
      sampler_(dataset_ ? dataset_->size() : 0, options_.shuffle(), options_.seed(),
               options_.rank(), options_.world_size()) {
  VOLT_CHECK(dataset_ != nullptr, ConfigError, "[DataLoader] dataset is null; pass a Dataset.");
  VOLT_CHECK(options_.batch_size() >= 1, ConfigError,
             "[DataLoader] batch_size=", options_.batch_size(), " must be >= 1.");
  VOLT_CHECK(options_.num_workers() >= 0, ConfigError,
             "[DataLoader] num_workers=", options_.num_workers(),
             " must be >= 0 (0 loads batches on the calling thread).");
  VOLT_CHECK(options_.prefetch_factor() >= 1, ConfigError,
             "[DataLoader] prefetch_factor=", options_.prefetch_factor(), " must be >= 1.");
}

DataLoader DataLoader::sharded(int64_t rank, int64_t world_size) const {
  DataLoaderOptions o = options_;
  o.rank(rank).world_size(world_size);
  return with_options(std::move(o));
}

DataLoader DataLoader::with_options(DataLoaderOptions options) const {
  return DataLoader(dataset_, std::move(options));
}

int64_t DataLoader::num_batches() const {
  const int64_t n = sampler_.size();
  const int64_t bs = options_.batch_size();
  return options_.drop_last() ? n / bs : (n + bs - 1) / bs;
}

int64_t DataLoader::last_batch_size() const {
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
  std::exception_ptr error;
  std::vector<std::thread> workers;

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
        if (stop || next_to_claim >= count) return;
        k = next_to_claim++;
      }
      try {
        Batch b = loader->make_batch(indices_of(k));
        std::lock_guard<std::mutex> lock(mu);
        ready.emplace(k, std::move(b));
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        stop = true;
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
  auto impl = std::make_unique<BatchStream::Impl>();
  impl->loader = this;
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
  return impl_->indices_of(impl_->consumed - 1);
}

bool BatchStream::next(Batch& out) {
  Impl& s = *impl_;
  if (s.consumed >= s.count) return false;
  if (s.workers.empty()) {
    out = s.loader->make_batch(s.indices_of(s.consumed));
    ++s.consumed;
    return true;
  }
  std::unique_lock<std::mutex> lock(s.mu);
  s.cv_ready.wait(lock, [&] { return s.error || s.ready.count(s.consumed) > 0; });
  if (s.error) std::rethrow_exception(s.error);
  auto it = s.ready.find(s.consumed);
  out = std::move(it->second);
  s.ready.erase(it);
  ++s.consumed;
  lock.unlock();
  s.cv_space.notify_all();
  return true;
}

}  // namespace volt
