#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "error_text.h"
#include "tiny.h"

namespace {

std::shared_ptr<volt::TensorDataset> range_ds(int64_t n) {
  auto x = torch::arange(n, torch::kFloat).unsqueeze(1);
  return std::make_shared<volt::TensorDataset>(x, torch::arange(n));
}

std::vector<int64_t> range_ids(int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

std::vector<int64_t> ids(volt::BatchStream s) {
  std::vector<int64_t> out;
  volt::Batch b;
  while (s.next(b)) {
    for (int64_t i = 0; i < b.size(); ++i) out.push_back(b.target[i].item<int64_t>());
  }
  return out;
}

TEST(DataLoader, BatchesInOrderWithRemainder) {
  volt::DataLoader dl(range_ds(10), volt::DataLoaderOptions(4));
  EXPECT_EQ(dl.num_batches(), 3);
  auto s = dl.stream(0);
  volt::Batch b;
  std::vector<int64_t> sizes;
  while (s.next(b)) sizes.push_back(b.size());
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2}));
  EXPECT_EQ(dl.last_batch_size(), 2);
  EXPECT_EQ(ids(dl.stream(0)), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  // Sharded over 3 ranks: 4 samples each (padded), one full batch.
  EXPECT_EQ(dl.sharded(1, 3).last_batch_size(), 4);
  EXPECT_EQ(
      volt::DataLoader(range_ds(10), volt::DataLoaderOptions(3)).sharded(0, 2).last_batch_size(),
      2);  // 5 samples per rank: 3 + 2
}

TEST(DataLoader, DropLast) {
  volt::DataLoader dl(range_ds(10), volt::DataLoaderOptions(4).drop_last(true));
  EXPECT_EQ(dl.num_batches(), 2);
  EXPECT_EQ(dl.last_batch_size(), 4);
  EXPECT_EQ(ids(dl.stream(0)).size(), 8u);
}

TEST(DataLoader, SeededShuffleIsAPermutationPerEpoch) {
  volt::DataLoader a(range_ds(50), volt::DataLoaderOptions(8).shuffle(true).seed(3));
  volt::DataLoader b(range_ds(50), volt::DataLoaderOptions(8).shuffle(true).seed(3));
  volt::DataLoader c(range_ds(50), volt::DataLoaderOptions(8).shuffle(true).seed(4));
  auto e0 = ids(a.stream(0));
  EXPECT_EQ(e0, ids(b.stream(0)));  // same seed, same epoch: same order
  EXPECT_NE(e0, ids(a.stream(1)));  // new epoch: new order
  EXPECT_NE(e0, ids(c.stream(0)));  // new seed: new order
  EXPECT_EQ(std::set<int64_t>(e0.begin(), e0.end()).size(), 50u);
}

TEST(DataLoader, StreamFromMidEpochIsTheSuffix) {
  volt::DataLoader dl(range_ds(50), volt::DataLoaderOptions(8).shuffle(true).seed(9));
  auto full = ids(dl.stream(2));
  auto tail = ids(dl.stream(2, 3));
  ASSERT_EQ(tail.size(), full.size() - 24);
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), full.begin() + 24));
  EXPECT_EQ(ids(dl.stream(2, 1, 2)), std::vector<int64_t>(full.begin() + 8, full.begin() + 24));
}

TEST(DataLoader, WorkersYieldTheSameBatchesInOrder) {
  auto opts = volt::DataLoaderOptions(7).shuffle(true).seed(1);
  volt::DataLoader inline_dl(range_ds(100), opts);
  volt::DataLoader threaded(range_ds(100),
                            volt::DataLoaderOptions(opts).num_workers(3).prefetch_factor(1));
  EXPECT_EQ(ids(inline_dl.stream(5)), ids(threaded.stream(5)));
  // Per-example path (custom collate) through workers as well.
  auto collate = [](const std::vector<volt::Example>& ex) { return volt::default_collate(ex); };
  volt::DataLoader custom(range_ds(100),
                          volt::DataLoaderOptions(opts).num_workers(2).collate(collate));
  EXPECT_EQ(ids(inline_dl.stream(5)), ids(custom.stream(5)));
}

TEST(DataLoader, AStreamMayOutliveItsLoader) {
  // `for (auto s = make_loader().stream(0); s.next(b);)`: the loader (and the only reference to
  // its data set) is gone before the first batch; the stream keeps what it reads.
  for (int64_t workers : {0, 2}) {
    volt::BatchStream s =
        volt::DataLoader(range_ds(64), volt::DataLoaderOptions(8).num_workers(workers)).stream(0);
    // Memory of the size just freed, filled with something else, in case it is handed back.
    std::vector<at::Tensor> reuse;
    for (int i = 0; i < 8; ++i) reuse.push_back(torch::full({64, 1}, -1.0f));
    EXPECT_EQ(ids(std::move(s)), range_ids(64)) << workers << " workers";
  }
}

TEST(DataLoader, RangeForYieldsWhatNextYields) {
  const auto opts = volt::DataLoaderOptions(7).shuffle(true).seed(3);
  for (int64_t workers : {0, 2}) {
    volt::DataLoader dl(range_ds(50), volt::DataLoaderOptions(opts).num_workers(workers));
    // Over a temporary stream (range-for keeps it alive), the whole epoch in next()'s order.
    std::vector<int64_t> seen, sizes;
    for (volt::Batch& b : dl.stream(1)) {
      sizes.push_back(b.size());
      for (int64_t i = 0; i < b.size(); ++i) seen.push_back(b.target[i].item<int64_t>());
    }
    EXPECT_EQ(seen, ids(dl.stream(1))) << workers << " workers";
    EXPECT_EQ(sizes, (std::vector<int64_t>{7, 7, 7, 7, 7, 7, 7, 1})) << workers << " workers";
    // Part of an epoch, and what is left of a stream next() has started.
    seen.clear();
    for (const volt::Batch& b : dl.stream(1, 2, 3)) {
      for (int64_t i = 0; i < b.size(); ++i) seen.push_back(b.target[i].item<int64_t>());
    }
    const auto full = ids(dl.stream(1));
    EXPECT_EQ(seen, std::vector<int64_t>(full.begin() + 14, full.begin() + 35));
    volt::BatchStream s = dl.stream(1);
    volt::Batch first;
    ASSERT_TRUE(s.next(first));
    seen.clear();
    for (auto it = s.begin(); it != s.end(); ++it) {
      for (int64_t i = 0; i < it->size(); ++i) seen.push_back(it->target[i].item<int64_t>());
    }
    EXPECT_EQ(seen, std::vector<int64_t>(full.begin() + 7, full.end()));
    EXPECT_TRUE(s.begin() == s.end());  // nothing left
    // Leaving the loop early leaves the stream (and its workers) to be destroyed as usual.
    int64_t batches = 0;
    for (volt::Batch& b : dl.stream(0)) {
      EXPECT_TRUE(b.input.defined());
      if (++batches == 2) break;
    }
    EXPECT_EQ(batches, 2);
  }
  // An empty pass never enters the loop.
  volt::DataLoader dl(range_ds(10), volt::DataLoaderOptions(4));
  for (volt::Batch& b : dl.stream(0, 3)) ADD_FAILURE() << "a batch of " << b.size();
}

TEST(DataLoader, EarlyDestructionJoinsWorkers) {
  volt::DataLoader dl(range_ds(1000), volt::DataLoaderOptions(3).num_workers(2));
  auto s = dl.stream(0);
  volt::Batch b;
  ASSERT_TRUE(s.next(b));  // abandon the stream with workers blocked on the bounded queue
  EXPECT_EQ(b.size(), 3);
}

class FailingDataset : public volt::Dataset {
 public:
  int64_t size() const override { return 20; }
  volt::Example get(int64_t i) const override {
    if (i == 13) throw volt::DataError("[FailingDataset] sample 13 is broken");
    return {torch::ones({2}), torch::tensor(i)};
  }
};

TEST(DataLoader, WorkerExceptionsReachTheConsumer) {
  volt::DataLoader dl(std::make_shared<FailingDataset>(),
                      volt::DataLoaderOptions(4).num_workers(2));
  auto s = dl.stream(0);
  volt::Batch b;
  EXPECT_THROW(
      {
        while (s.next(b)) {
        }
      },
      volt::DataError);
}

// Samples in `slow` take 150 ms; samples in `broken` throw, naming themselves (after that
// sleep when they are also slow).
class SlowAndBrokenDataset : public volt::Dataset {
 public:
  SlowAndBrokenDataset(std::set<int64_t> slow, std::set<int64_t> broken)
      : slow_(std::move(slow)), broken_(std::move(broken)) {}
  int64_t size() const override { return 20; }
  volt::Example get(int64_t i) const override {
    if (slow_.count(i) > 0) std::this_thread::sleep_for(std::chrono::milliseconds(150));
    if (broken_.count(i) > 0) {
      throw volt::DataError("[SlowAndBrokenDataset] sample " + std::to_string(i) + " is broken");
    }
    return {torch::ones({2}), torch::tensor(i)};
  }

 private:
  std::set<int64_t> slow_, broken_;
};

// How many batches a stream yields before it throws, and the error's text.
std::pair<int, std::string> batches_before_error(volt::BatchStream s) {
  volt::Batch b;
  int n = 0;
  try {
    while (s.next(b)) ++n;
  } catch (const volt::DataError& e) {
    return {n, e.what()};
  }
  return {n, ""};
}

TEST(DataLoader, AWorkersErrorArrivesAfterTheBatchesBeforeIt) {
  // Batch 3 (sample 13) fails while batch 2 (sample 8 slow) is still being built: the consumer
  // gets batches 0-2 first, as without workers and as PyTorch's DataLoader delivers a worker's
  // error at its index. It was thrown as soon as any worker failed: a fit trained 0-2 steps
  // depending on the threads' timing (here 2).
  for (int64_t workers : {0, 2, 3}) {
    volt::DataLoader dl(
        std::make_shared<SlowAndBrokenDataset>(std::set<int64_t>{8}, std::set<int64_t>{13}),
        volt::DataLoaderOptions(4).num_workers(workers));
    const auto got = batches_before_error(dl.stream(0));
    EXPECT_EQ(got.first, 3) << workers << " workers";
    EXPECT_NE(got.second.find("sample 13 is broken"), std::string::npos) << got.second;
  }
  // Two broken batches: the earlier one's error, even when the later one fails first.
  volt::DataLoader dl(
      std::make_shared<SlowAndBrokenDataset>(std::set<int64_t>{5}, std::set<int64_t>{5, 13}),
      volt::DataLoaderOptions(4).num_workers(3));
  const auto got = batches_before_error(dl.stream(0));
  EXPECT_EQ(got.first, 1);
  EXPECT_NE(got.second.find("sample 5 is broken"), std::string::npos) << got.second;
}

TEST(DataLoader, DefaultCollateNamesTheExampleOfAnotherShape) {
  // torch::stack's c10::Error ("stack expects each tensor to be equal size") named neither the
  // example nor the fix; an undefined input gave libtorch's "undefined Tensor".
  const auto collate_error = [](std::vector<volt::Example> ex) {
    return volt_test::error_of<volt::ValueError>([&] { volt::default_collate(ex); });
  };
  std::string error = collate_error({{torch::zeros({3}), torch::tensor(0)},
                                     {torch::zeros({3}), torch::tensor(1)},
                                     {torch::zeros({4}), torch::tensor(2)}});
  EXPECT_NE(error.find("example 2 of the batch has an input of shape [4] but example 0 [3]"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("a collate that pads them"), std::string::npos) << error;
  error = collate_error(
      {{torch::zeros({3}), torch::zeros({1})}, {torch::zeros({3}), torch::zeros({2})}});
  EXPECT_NE(error.find("example 1 of the batch has a target of shape [2] but example 0 [1]"),
            std::string::npos)
      << error;
  error = collate_error({{torch::zeros({3}), {}}, {at::Tensor(), {}}});
  EXPECT_NE(error.find("example 1 of the batch has no input tensor"), std::string::npos) << error;
  // Through a loader: the same error from next().
  class Ragged : public volt::Dataset {
   public:
    int64_t size() const override { return 2; }
    volt::Example get(int64_t i) const override { return {torch::zeros({2 + 3 * i}), {}}; }
  };
  volt::DataLoader dl(std::make_shared<Ragged>(), volt::DataLoaderOptions(2));
  volt::Batch b;
  error = volt_test::error_of<volt::ValueError>([&] { dl.stream(0).next(b); });
  EXPECT_NE(error.find("[default_collate] example 1"), std::string::npos) << error;
}

TEST(DataLoader, CustomCollate) {
  auto collate = [](const std::vector<volt::Example>& ex) {
    volt::Batch b = volt::default_collate(ex);
    b.extra["double"] = b.input * 2;
    return b;
  };
  volt::DataLoader dl(range_ds(6), volt::DataLoaderOptions(3).collate(collate));
  auto s = dl.stream(0);
  volt::Batch b;
  ASSERT_TRUE(s.next(b));
  EXPECT_TRUE(b.extra.at("double").equal(b.input * 2));
}

TEST(DataLoader, PinMemoryIsANoOpOnCpu) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "CUDA present: pinning is real there";
  volt::DataLoader dl(range_ds(6), volt::DataLoaderOptions(3).pin_memory(true));
  auto s = dl.stream(0);
  volt::Batch b;
  ASSERT_TRUE(s.next(b));
  EXPECT_FALSE(b.input.is_pinned());
}

TEST(DataLoader, InvalidOptions) {
  EXPECT_THROW(volt::DataLoader(range_ds(6), volt::DataLoaderOptions(0)), volt::ConfigError);
  EXPECT_THROW(volt::DataLoader(range_ds(6), volt::DataLoaderOptions(2).num_workers(-1)),
               volt::ConfigError);
  EXPECT_THROW(volt::DataLoader(nullptr, volt::DataLoaderOptions(2)), volt::ConfigError);
  EXPECT_THROW(volt::TensorDataset(torch::ones({4, 2}), torch::ones({3})), volt::ValueError);
  // Settings that overflowed: workers x prefetch_factor wrapped negative (every thread then
  // waited forever), a batch size near 2^63 made the batch count negative.
  EXPECT_THROW(
      volt::DataLoader(range_ds(6),
                       volt::DataLoaderOptions(2).num_workers(2).prefetch_factor(int64_t{1} << 62)),
      volt::ConfigError);
  EXPECT_THROW(volt::DataLoader(range_ds(6), volt::DataLoaderOptions(2).num_workers(100000)),
               volt::ConfigError);
  EXPECT_EQ(volt::DataLoader(range_ds(6), volt::DataLoaderOptions(INT64_MAX)).num_batches(), 1);
}

TEST(Sampler, RanksSplitThePaddedEpoch) {
  volt::Sampler r0(10, true, 5, 0, 3), r1(10, true, 5, 1, 3), r2(10, true, 5, 2, 3);
  EXPECT_EQ(r0.size(), 4);
  std::multiset<int64_t> all;
  for (auto* s : {&r0, &r1, &r2}) {
    auto v = s->indices(0);
    EXPECT_EQ(v.size(), 4u);
    all.insert(v.begin(), v.end());
  }
  for (int64_t i = 0; i < 10; ++i) EXPECT_GE(all.count(i), 1u);
  EXPECT_THROW(volt::Sampler(10, false, 0, 3, 3), volt::ConfigError);
}

TEST(Sampler, UnevenShardsGiveEverySampleToOneRank) {
  // Lightning's UnrepeatedDistributedSampler: 10 samples over 4 ranks are 3, 3, 2, 2, no repeats,
  // each rank's positions those of the padded split without the padding.
  std::multiset<int64_t> all;
  const std::vector<int64_t> sizes = {3, 3, 2, 2};
  for (int64_t r = 0; r < 4; ++r) {
    const volt::Sampler uneven(10, true, 5, r, 4, /*even=*/false);
    const volt::Sampler even(10, true, 5, r, 4);
    EXPECT_EQ(uneven.size(), sizes[r]) << "rank " << r;
    const auto v = uneven.indices(2);
    ASSERT_EQ(static_cast<int64_t>(v.size()), sizes[r]) << "rank " << r;
    const auto padded = even.indices(2);
    EXPECT_TRUE(std::equal(v.begin(), v.end(), padded.begin())) << "rank " << r;
    all.insert(v.begin(), v.end());
  }
  EXPECT_EQ(all.size(), 10u);
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(all.count(i), 1u) << i;
  // More ranks than samples: the ones past the data set have none.
  EXPECT_EQ(volt::Sampler(2, false, 0, 3, 4, false).size(), 0);
  EXPECT_TRUE(volt::Sampler(2, false, 0, 3, 4, false).indices(0).empty());
  EXPECT_EQ(volt::Sampler(2, false, 0, 1, 4, false).indices(0), std::vector<int64_t>{1});
  // A loader sharded so: its batches and last batch follow the rank's own count.
  volt::DataLoader rank3 =
      volt::DataLoader(range_ds(10), volt::DataLoaderOptions(4)).sharded(3, 4, /*even=*/false);
  EXPECT_EQ(rank3.num_batches(), 1);
  EXPECT_EQ(rank3.last_batch_size(), 2);
  EXPECT_EQ(ids(rank3.stream(0)), (std::vector<int64_t>{3, 7}));
  EXPECT_FALSE(rank3.options().even_shards());
}

TEST(DataLoader, WithoutASeedTheShuffleFollowsTheGlobalSeed) {
  // Lightning's distributed sampler shuffles by PL_GLOBAL_SEED, which seed_everything sets: two
  // seeds, two orders; the same seed again, the same order. A loader's own seed is its own.
  const volt::DataLoader dl(range_ds(50), volt::DataLoaderOptions(8).shuffle(true));
  const volt::DataLoader own(range_ds(50), volt::DataLoaderOptions(8).shuffle(true).seed(4));
  const volt::DataLoader four(range_ds(50), volt::DataLoaderOptions(8).shuffle(true).seed(4));
  volt::seed_everything(1);
  const auto one = ids(dl.stream(0));
  const auto own_one = ids(own.stream(0));
  volt::seed_everything(2);
  EXPECT_NE(ids(dl.stream(0)), one);
  EXPECT_EQ(ids(own.stream(0)), own_one);
  volt::seed_everything(4);
  EXPECT_EQ(ids(dl.stream(0)), ids(four.stream(0)));  // the global seed stands in for its own
  EXPECT_EQ(volt::global_seed(), 4u);
  volt::seed_everything(1);
  EXPECT_EQ(ids(dl.stream(0)), one);
  EXPECT_NE(std::getenv("VOLT_GLOBAL_SEED"), nullptr);
  EXPECT_STREQ(std::getenv("VOLT_GLOBAL_SEED"), "1");  // for the processes this one starts
}

TEST(GlobalSeed, AProcessThatNeverSeededTakesTheSeedItsParentSet) {
  // A fresh process (the death test's re-run of this binary), as a worker the launcher starts
  // after its parent seeded: no seed_everything of its own, VOLT_GLOBAL_SEED in its environment.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ::setenv("VOLT_GLOBAL_SEED", "77", 1);
  EXPECT_EXIT(std::exit(volt::global_seed() == 77 ? 0 : 1), testing::ExitedWithCode(0), "");
  ::setenv("VOLT_GLOBAL_SEED", "7x", 1);
  EXPECT_EXIT(
      {
        try {
          volt::global_seed();
        } catch (const volt::ConfigError& e) {
          std::fprintf(stderr, "%s\n", e.what());
          std::exit(3);
        }
        std::exit(0);
      },
      testing::ExitedWithCode(3), "VOLT_GLOBAL_SEED=\"7x\" is not a seed");
  ::unsetenv("VOLT_GLOBAL_SEED");
  EXPECT_EXIT(std::exit(volt::global_seed() == 0 ? 0 : 1), testing::ExitedWithCode(0), "");
}

}  // namespace
