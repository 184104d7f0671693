#pragma once
/// Graphs cached by input signature: the policy of the reference's ModuleCacher (HPU graphs),
/// for CUDA graphs. A captured graph replays fixed kernels on fixed memory, so it is valid only
/// for inputs with the shapes, dtypes and devices it was captured with, and for the module's
/// training mode (which changes what forward records). GraphKey is that signature; GraphCache
/// keeps up to max_graphs graphs by key and evicts the least recently used.
///
///   volt::GraphCache<MyGraph> cache(/*max_graphs=*/4, "encoder");
///   MyGraph& g = cache.get(volt::GraphKey({x, mask}, module->is_training()),
///                          [&] { return capture_my_graph(x, mask); });
///
/// The cache is device-neutral: it owns whatever the capture function returns (GraphedModule
/// and the Trainer's graphed step fill it with CUDA graphs); the policy is tested on the CPU
/// with real tensors.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace volt {

/// What a graph was captured for: each input's shape, dtype, device and requires_grad (an
/// undefined tensor, an absent optional input, counts too), the training mode, and whether
/// autograd was recording (a graph captured under no_grad has no backward), and a `layout`: what
/// the positions of `inputs` mean when that is not fixed (the Trainer's graphed step passes the
/// names of a batch's extra tensors, so batches whose tensors agree in shape but not in name
/// get graphs of their own).
class GraphKey {
 public:
  GraphKey(at::ArrayRef<at::Tensor> inputs, bool training, bool grad_mode = false,
           std::string layout = "");

  bool training() const { return training_; }
  bool grad_mode() const { return grad_mode_; }
  const std::string& layout() const { return layout_; }
  size_t num_inputs() const { return inputs_.size(); }
  size_t hash() const { return hash_; }
  /// e.g. "train(float[128, 784] cpu, long[128] cpu)"; "eval(...)" outside training;
  /// "train+grad(...)" when captured with grad mode on; "train[<layout>](...)" with a layout.
  std::string str() const;

  friend bool operator==(const GraphKey& a, const GraphKey& b);
  friend bool operator!=(const GraphKey& a, const GraphKey& b) { return !(a == b); }

 private:
  struct Input {
    bool defined = false;
    std::vector<int64_t> sizes;
    c10::ScalarType dtype = c10::ScalarType::Undefined;
    c10::Device device = c10::Device(c10::DeviceType::CPU);
    bool requires_grad = false;
  };
  std::vector<Input> inputs_;
  bool training_ = false;
  bool grad_mode_ = false;
  std::string layout_;
  size_t hash_ = 0;
};

std::ostream& operator<<(std::ostream& os, const GraphKey& key);

struct GraphKeyHash {
  size_t operator()(const GraphKey& key) const { return key.hash(); }
};

/// What a cache did: lookups that found a graph, lookups that captured one, graphs dropped to
/// stay within max_graphs. A high eviction count means the input signatures cycle over more
/// than max_graphs: raise it, or pad inputs to fewer shapes.
struct GraphCacheStats {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t evictions = 0;
};

std::ostream& operator<<(std::ostream& os, const GraphCacheStats& s);

namespace detail {
void check_max_graphs(int64_t max_graphs, const std::string& name);
[[noreturn]] void throw_no_graph(const std::string& name, const GraphKey& key);
/// Logs the first eviction of a cache (later ones are only counted).
void log_first_eviction(const std::string& name, const GraphKey& key, int64_t max_graphs);
}  // namespace detail

/// Up to max_graphs graphs by GraphKey, least recently used evicted first. Not thread-safe (a
/// module's graphs are used from the thread that runs it).
template <class Graph>
class GraphCache {
 public:
  /// `name` names the cache in logs and errors (a module path, say). Throws ConfigError when
  /// max_graphs < 1.
  explicit GraphCache(int64_t max_graphs, std::string name = "GraphCache")
      : max_graphs_(max_graphs), name_(std::move(name)) {
    detail::check_max_graphs(max_graphs_, name_);
  }
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;
  // Moving a std::list keeps its iterators valid (they then refer into the new list).
  GraphCache(GraphCache&&) = default;
  GraphCache& operator=(GraphCache&&) = default;

  /// The graph for `key`. A hit makes it the most recently used. A miss first evicts the least
  /// recently used graph when the cache is full, so that no more than max_graphs graphs (and
  /// their memory pools) are ever held, then keeps what `capture()` returns (a
  /// std::unique_ptr<Graph>). If capture throws or returns null, nothing is kept (the eviction
  /// stands) and the exception propagates; the miss is counted either way.
  template <class Capture>
  Graph& get(const GraphKey& key, Capture&& capture) {
    auto it = index_.find(key);
    if (it != index_.end()) {
      ++stats_.hits;
      lru_.splice(lru_.begin(), lru_, it->second);
      return *it->second->graph;
    }
    ++stats_.misses;
    if (static_cast<int64_t>(lru_.size()) >= max_graphs_) evict_oldest();
    std::unique_ptr<Graph> graph = std::forward<Capture>(capture)();
    if (!graph) detail::throw_no_graph(name_, key);
    lru_.push_front(Entry{key, std::move(graph)});
    index_.emplace(key, lru_.begin());
    return *lru_.front().graph;
  }

  /// The cached graph for `key` without counting a lookup or changing recency; null if absent.
  Graph* peek(const GraphKey& key) const {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : it->second->graph.get();
  }
  bool contains(const GraphKey& key) const { return index_.count(key) != 0; }
  size_t size() const { return lru_.size(); }
  int64_t max_graphs() const { return max_graphs_; }
  const std::string& name() const { return name_; }
  const GraphCacheStats& stats() const { return stats_; }

  /// Keys from the most to the least recently used.
  std::vector<GraphKey> keys() const {
    std::vector<GraphKey> out;
    out.reserve(lru_.size());
    for (const Entry& e : lru_) out.push_back(e.key);
    return out;
  }

  /// Drops every graph (e.g. after parameters were re-allocated, which invalidates the memory
  /// a graph replays on). Statistics are kept.
  void clear() {
    index_.clear();
    lru_.clear();
  }

 private:
  struct Entry {
    GraphKey key;
    std::unique_ptr<Graph> graph;
  };

  void evict_oldest() {
    if (stats_.evictions == 0) detail::log_first_eviction(name_, lru_.back().key, max_graphs_);
    ++stats_.evictions;
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }

  int64_t max_graphs_;
  std::string name_;
  GraphCacheStats stats_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<GraphKey, typename std::list<Entry>::iterator, GraphKeyHash> index_;
};

}  // namespace volt
