// Graph caching policy (the reference's ModuleCacher) and graph options/capture checks, on real
// tensors. The cached "graph" here is a CPU stand-in that does what a captured graph keeps:
// static input buffers of the captured shapes and the output computed from them; CUDA capture
// itself is issue #15's GPU part.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "error_text.h"
#include "log_capture.h"
#include "volt/graphs/graph_cache.h"
#include "volt/graphs/graph_options.h"

using volt::GraphCache;
using volt::GraphKey;
using volt::GraphOptions;
using volt_test::error_of;

namespace {

// What a captured graph holds: static buffers shaped like the inputs it was captured with.
struct StaticBuffers {
  std::vector<at::Tensor> inputs;
  explicit StaticBuffers(at::ArrayRef<at::Tensor> sample) {
    for (const at::Tensor& t : sample) inputs.push_back(torch::empty_like(t));
  }
  // Replay: copy the batch into the buffers (which fails on any other shape) and run `fn`.
  at::Tensor run(at::ArrayRef<at::Tensor> batch, const std::function<at::Tensor(at::Tensor)>& fn) {
    for (size_t i = 0; i < batch.size(); ++i) inputs[i].copy_(batch[i]);
    return fn(inputs[0]);
  }
};

std::unique_ptr<StaticBuffers> capture(at::ArrayRef<at::Tensor> sample, int* captures) {
  ++*captures;
  return std::make_unique<StaticBuffers>(sample);
}

GraphKey key_of(std::vector<int64_t> shape, bool training = true) {
  return GraphKey({torch::zeros(shape)}, training);
}

}  // namespace

TEST(GraphKey, IsTheSignatureNotTheValues) {
  const GraphKey a({torch::randn({4, 3}), torch::arange(4)}, true);
  const GraphKey b({torch::ones({4, 3}), torch::zeros({4}, torch::kLong)}, true);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_EQ(a.str(), "train(float[4, 3] cpu, long[4] cpu)");
  EXPECT_EQ(a.num_inputs(), 2u);

  const at::Tensor x = torch::randn({4, 3});
  EXPECT_NE(GraphKey({x}, true), GraphKey({torch::randn({5, 3})}, true));             // shape
  EXPECT_NE(GraphKey({x}, true), GraphKey({torch::randn({3, 4})}, true));             // same numel
  EXPECT_NE(GraphKey({x}, true), GraphKey({x.to(torch::kDouble)}, true));             // dtype
  EXPECT_NE(GraphKey({x}, true), GraphKey({torch::empty({4, 3}, at::kMeta)}, true));  // device
  EXPECT_NE(GraphKey({x}, true), GraphKey({x.detach().requires_grad_()}, true));      // grad
  EXPECT_NE(GraphKey({x}, true), GraphKey({x}, false));                               // mode
  EXPECT_NE(GraphKey({x}, true), GraphKey({x}, true, /*grad_mode=*/true));            // autograd
  EXPECT_EQ(GraphKey({x}, true, true).str(), "train+grad(float[4, 3] cpu)");
  EXPECT_NE(GraphKey({x}, true), GraphKey({x, at::Tensor()}, true));  // an absent optional
  EXPECT_NE(GraphKey({x, at::Tensor()}, true), GraphKey({at::Tensor(), x}, true));  // position
  EXPECT_EQ(GraphKey({x, at::Tensor()}, false).str(), "eval(float[4, 3] cpu, undefined)");
  EXPECT_EQ(GraphKey({x.detach().requires_grad_()}, true).str(), "train(float[4, 3] cpu grad)");
  // The layout: the same tensors under other names (a combined batch's parts) are another key.
  EXPECT_NE(GraphKey({x, x}, true, true, "input target a/input"),
            GraphKey({x, x}, true, true, "input target b/input"));
  EXPECT_EQ(GraphKey({x}, true, true, "input -"), GraphKey({x}, true, true, "input -"));
  EXPECT_NE(GraphKey({x}, true, true, "input -"), GraphKey({x}, true, true));
  EXPECT_EQ(GraphKey({x}, true, true, "input -").str(), "train+grad[input -](float[4, 3] cpu)");
  std::ostringstream os;
  os << GraphKey({}, true);
  EXPECT_EQ(os.str(), "train()");
}

TEST(GraphCache, CapturesOncePerSignatureAndReplaysAfter) {
  // A ragged last batch gives a second signature: 10 samples in batches of 4 -> 4, 4, 2.
  const at::Tensor data = torch::randn({10, 3});
  torch::nn::Linear layer(3, 2);
  GraphCache<StaticBuffers> cache(4, "layer");
  int captures = 0;
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (int64_t start = 0; start < 10; start += 4) {
      const at::Tensor batch = data.slice(0, start, std::min<int64_t>(start + 4, 10));
      StaticBuffers& g =
          cache.get(GraphKey({batch}, true), [&] { return capture({batch}, &captures); });
      const at::Tensor out = g.run({batch}, [&](const at::Tensor& in) { return layer(in); });
      EXPECT_TRUE(torch::equal(out, layer(batch)));  // the replay computes what eager does
    }
  }
  EXPECT_EQ(captures, 2);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.stats().misses, 2);
  EXPECT_EQ(cache.stats().hits, 7);
  EXPECT_EQ(cache.stats().evictions, 0);
  // Evaluation mode is another graph (dropout, batch-norm statistics are recorded differently).
  const at::Tensor batch = data.slice(0, 0, 4);
  cache.get(GraphKey({batch}, false), [&] { return capture({batch}, &captures); });
  EXPECT_EQ(captures, 3);
}

TEST(GraphCache, EvictsTheLeastRecentlyUsed) {
  GraphCache<StaticBuffers> cache(2, "encoder");
  int captures = 0;
  const auto get = [&](std::vector<int64_t> shape) {
    const at::Tensor x = torch::zeros(shape);
    return &cache.get(GraphKey({x}, true), [&] { return capture({x}, &captures); });
  };
  std::vector<std::string> lines = volt_test::capture_logs([&] {
    get({1});
    get({2});
    get({1});  // hit: {1} is now the most recent, so {2} is the oldest
    get({3});  // evicts {2}
  });
  EXPECT_EQ(cache.keys(), (std::vector<GraphKey>{key_of({3}), key_of({1})}));
  EXPECT_FALSE(cache.contains(key_of({2})));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("[Graphs] encoder: evicting the graph for train(float[2] cpu)"),
            std::string::npos)
      << lines[0];
  EXPECT_NE(lines[0].find("raise max_graphs"), std::string::npos) << lines[0];

  // Later evictions are counted, not logged.
  lines = volt_test::capture_logs([&] {
    get({2});  // evicts {1}
    get({1});  // evicts {3}
  });
  EXPECT_TRUE(lines.empty());
  EXPECT_EQ(cache.keys(), (std::vector<GraphKey>{key_of({1}), key_of({2})}));
  EXPECT_EQ(captures, 5);
  EXPECT_EQ(cache.stats().hits, 1);
  EXPECT_EQ(cache.stats().misses, 5);
  EXPECT_EQ(cache.stats().evictions, 3);
  std::ostringstream os;
  os << cache.stats();
  EXPECT_EQ(os.str(), "GraphCacheStats(hits=1, misses=5, evictions=3)");
}

TEST(GraphCache, EvictionAndClearReleaseTheGraphsMemory) {
  GraphCache<StaticBuffers> cache(1, "big");
  const at::Tensor a = torch::zeros({256, 256});
  StaticBuffers* first = &cache.get(GraphKey({a}, true), [&] {
    return std::make_unique<StaticBuffers>(std::vector<at::Tensor>{a});
  });
  const at::Tensor buffer = first->inputs[0];  // one more reference to the graph's storage
  EXPECT_EQ(buffer.use_count(), 2);
  const at::Tensor b = torch::zeros({8});
  volt_test::capture_logs([&] {
    cache.get(GraphKey({b}, true),
              [&] { return std::make_unique<StaticBuffers>(std::vector<at::Tensor>{b}); });
  });
  EXPECT_EQ(buffer.use_count(), 1);  // the evicted graph freed its buffers
  const at::Tensor held = cache.peek(GraphKey({b}, true))->inputs[0];
  EXPECT_EQ(held.use_count(), 2);
  cache.clear();
  EXPECT_EQ(held.use_count(), 1);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.stats().misses, 2);  // statistics survive clear()
}

TEST(GraphCache, PeekNeitherCountsNorReorders) {
  GraphCache<StaticBuffers> cache(2);
  int captures = 0;
  const at::Tensor x = torch::zeros({1}), y = torch::zeros({2});
  cache.get(GraphKey({x}, true), [&] { return capture({x}, &captures); });
  cache.get(GraphKey({y}, true), [&] { return capture({y}, &captures); });
  EXPECT_NE(cache.peek(GraphKey({x}, true)), nullptr);
  EXPECT_EQ(cache.peek(GraphKey({x}, false)), nullptr);
  EXPECT_EQ(cache.keys().front(), GraphKey({y}, true));
  EXPECT_EQ(cache.stats().hits, 0);
  EXPECT_EQ(cache.name(), "GraphCache");
  EXPECT_EQ(cache.max_graphs(), 2);
}

TEST(GraphCache, AFailedCaptureKeepsNothing) {
  GraphCache<StaticBuffers> cache(2, "net");
  const GraphKey key = key_of({3});
  EXPECT_THROW(cache.get(key,
                         []() -> std::unique_ptr<StaticBuffers> {
                           throw std::runtime_error("capture failed");
                         }),
               std::runtime_error);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.stats().misses, 1);
  const std::string err = error_of<volt::ValueError>(
      [&] { cache.get(key, [] { return std::unique_ptr<StaticBuffers>(); }); });
  EXPECT_NE(
      err.find("[Graphs] net: the capture function returned no graph for train(float[3] cpu)"),
      std::string::npos)
      << err;
  EXPECT_EQ(cache.size(), 0u);
  // The next lookup captures again.
  int captures = 0;
  const at::Tensor x = torch::zeros({3});
  cache.get(key, [&] { return capture({x}, &captures); });
  EXPECT_EQ(captures, 1);
  EXPECT_EQ(cache.size(), 1u);
}

TEST(GraphCache, RejectsAnEmptyCapacity) {
  for (int64_t bad : {0, -3}) {
    const std::string err =
        error_of<volt::ConfigError>([&] { GraphCache<StaticBuffers> c(bad, "m"); });
    EXPECT_NE(err.find("[Graphs] m: max_graphs=" + std::to_string(bad) + " must be >= 1"),
              std::string::npos)
        << err;
  }
}

TEST(GraphOptions, DefaultsFollowTheReferenceAndBadValuesAreNamed) {
  GraphOptions o;
  EXPECT_NO_THROW(o.validate());
  std::ostringstream os;
  os << o;
  EXPECT_EQ(os.str(),
            "GraphOptions(warmup_iters=3, max_graphs=8, asynchronous=0, disable_tensor_cache=0)");
  std::string err = error_of<volt::ConfigError>([] { GraphOptions().warmup_iters(0).validate(); });
  EXPECT_NE(err.find("[Graphs] warmup_iters=0 must be >= 1"), std::string::npos) << err;
  err = error_of<volt::ConfigError>([] { GraphOptions().max_graphs(0).validate(); });
  EXPECT_NE(err.find("[Graphs] GraphOptions: max_graphs=0 must be >= 1"), std::string::npos) << err;
}

TEST(GraphCapture, CpuTensorsAreNamedNotCaptured) {
  const at::Tensor x = torch::randn({2, 3});
  std::string reason = volt::graph_capture_reason({at::Tensor(), x});
  EXPECT_EQ(reason.rfind("input 1 (float[2, 3]) is on cpu; a graph replays CUDA kernels only", 0),
            0u)
      << reason;
  reason = volt::graph_capture_reason({at::Tensor()});
  EXPECT_EQ(reason.rfind("no defined input tensor", 0), 0u) << reason;
  EXPECT_EQ(volt::graph_capture_reason({}).rfind("no defined input tensor", 0), 0u);

  const std::string err =
      error_of<volt::NotAvailable>([&] { volt::check_graph_capture({x}, "wrap_in_graph(net)"); });
  EXPECT_EQ(err.rfind("[Graphs] wrap_in_graph(net): input 0 (float[2, 3]) is on cpu;", 0), 0u)
      << err;
}

TEST(GraphCapture, CudaTensorsAreCapturableOnOneDeviceWhenDense) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  const at::Tensor x = torch::randn({2, 3}, torch::kCUDA);
  EXPECT_EQ(volt::graph_capture_reason({x, at::Tensor(), x.to(torch::kHalf)}), "");
  EXPECT_NO_THROW(volt::check_graph_capture({x}, "test"));
  std::string reason = volt::graph_capture_reason({x, torch::ones({2})});
  EXPECT_EQ(reason.rfind("input 1 (float[2]) is on cpu", 0), 0u) << reason;
  reason = volt::graph_capture_reason({x.to_sparse()});
  EXPECT_NE(reason.find("is not a dense tensor"), std::string::npos) << reason;
}
