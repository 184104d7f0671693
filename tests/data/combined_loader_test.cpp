// combined_loader (Lightning's CombinedLoader): several loaders as one, each batch a batch of
// each. The Trainer's side (training on one, exact resume):
// tests/trainer/combined_training_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "error_text.h"
#include "tiny.h"

namespace {

using volt::CombineMode;
using volt_test::error_of;

std::shared_ptr<volt::TensorDataset> range_ds(int64_t n) {
  auto x = torch::arange(n, torch::kFloat).unsqueeze(1);
  return std::make_shared<volt::TensorDataset>(x, torch::arange(n));
}

volt::DataLoader range_loader(int64_t n, int64_t bs, bool shuffle = false, int64_t workers = 0,
                              uint64_t seed = 0) {
  return volt::DataLoader(
      range_ds(n), volt::DataLoaderOptions(bs).shuffle(shuffle).seed(seed).num_workers(workers));
}

std::vector<int64_t> targets(const at::Tensor& t) {
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

// Each batch of a pass as {part: its targets}; an absent part is missing from the map.
using Parts = std::map<std::string, std::vector<int64_t>>;
std::vector<Parts> read(volt::BatchStream s) {
  std::vector<Parts> out;
  volt::Batch b;
  while (s.next(b)) {
    Parts p;
    for (const auto& name : b.part_names()) p[name] = targets(b.part(name).target);
    out.push_back(p);
  }
  return out;
}

std::vector<int64_t> ids(volt::BatchStream s) {
  std::vector<int64_t> out;
  volt::Batch b;
  while (s.next(b)) {
    const auto t = targets(b.target);
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

std::vector<int64_t> range(int64_t a, int64_t b) {
  std::vector<int64_t> v;
  for (int64_t i = a; i < b; ++i) v.push_back(i);
  return v;
}

// Lightning's documented example: {'a': range(6) in batches of 4, 'b': range(15) in batches of 5}.
volt::DataLoader lightning_example(CombineMode mode) {
  return volt::combined_loader({{"a", range_loader(6, 4)}, {"b", range_loader(15, 5)}}, mode);
}

TEST(CombinedLoader, ModesFollowLightningsExample) {
  const auto cycle = lightning_example(CombineMode::kMaxSizeCycle);
  EXPECT_TRUE(cycle.is_combined());
  const auto parts = cycle.parts();  // the loaders given, by name, in order
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].first, "a");
  EXPECT_EQ(parts[0].second.num_batches(), 2);
  EXPECT_EQ(parts[1].first, "b");
  EXPECT_EQ(parts[1].second.num_batches(), 3);
  EXPECT_TRUE(range_loader(6, 4).parts().empty());
  EXPECT_EQ(cycle.num_batches(), 3);
  EXPECT_EQ(cycle.options().batch_size(), 9);  // a full batch: 4 + 5 samples
  EXPECT_EQ(cycle.last_batch_size(), 9);       // a's first batch again + b's last
  EXPECT_EQ(read(cycle.stream(0)),
            (std::vector<Parts>{{{"a", range(0, 4)}, {"b", range(0, 5)}},
                                {{"a", range(4, 6)}, {"b", range(5, 10)}},
                                {{"a", range(0, 4)}, {"b", range(10, 15)}}}));

  const auto min = lightning_example(CombineMode::kMinSize);
  EXPECT_EQ(min.num_batches(), 2);
  EXPECT_EQ(min.last_batch_size(), 7);
  EXPECT_EQ(read(min.stream(0)), (std::vector<Parts>{{{"a", range(0, 4)}, {"b", range(0, 5)}},
                                                     {{"a", range(4, 6)}, {"b", range(5, 10)}}}));

  const auto max = lightning_example(CombineMode::kMaxSize);
  EXPECT_EQ(max.num_batches(), 3);
  EXPECT_EQ(max.last_batch_size(), 5);  // a has run out
  EXPECT_EQ(read(max.stream(0)), (std::vector<Parts>{{{"a", range(0, 4)}, {"b", range(0, 5)}},
                                                     {{"a", range(4, 6)}, {"b", range(5, 10)}},
                                                     {{"b", range(10, 15)}}}));
  // Sizes: a combined batch counts every part's samples.
  std::vector<int64_t> sizes;
  volt::Batch b;
  for (auto s = max.stream(0); s.next(b);) {
    sizes.push_back(b.size());
    EXPECT_FALSE(b.input.defined());
    EXPECT_TRUE(b.has_part("b"));
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{9, 7, 5}));
  EXPECT_FALSE(b.has_part("a"));
  EXPECT_EQ(b.part_names(), (std::vector<std::string>{"b"}));
}

TEST(CombinedLoader, AShortLoaderStartsAgainInANewOrderEachPass) {
  // a: 10 samples in batches of 4 (3 batches), b: 40 in batches of 4 (10 batches).
  const auto c = volt::combined_loader(
      {{"a", range_loader(10, 4, true, 0, 5)}, {"b", range_loader(40, 4, true, 0, 6)}});
  ASSERT_EQ(c.num_batches(), 10);
  for (int64_t epoch : {0, 3}) {
    const auto batches = read(c.stream(epoch));
    ASSERT_EQ(batches.size(), 10u);
    std::vector<int64_t> a, b;
    for (const auto& p : batches) {
      a.insert(a.end(), p.at("a").begin(), p.at("a").end());
      b.insert(b.end(), p.at("b").begin(), p.at("b").end());
    }
    // b, the longest, reads its epoch's order once; a's first pass is its epoch's order.
    EXPECT_EQ(b, ids(range_loader(40, 4, true, 0, 6).stream(epoch)));
    const auto a_alone = ids(range_loader(10, 4, true, 0, 5).stream(epoch));
    ASSERT_EQ(a.size(), 10u * 3 + 4);  // three whole passes and one batch
    EXPECT_TRUE(std::equal(a_alone.begin(), a_alone.end(), a.begin()));
    // Every later pass is a permutation of its own: not the first pass's order again.
    std::vector<std::vector<int64_t>> passes;
    for (int p = 0; p < 3; ++p) passes.emplace_back(a.begin() + 10 * p, a.begin() + 10 * p + 10);
    for (const auto& pass : passes) {
      EXPECT_EQ(std::set<int64_t>(pass.begin(), pass.end()).size(), 10u);
    }
    EXPECT_NE(passes[1], passes[0]);
    EXPECT_NE(passes[2], passes[1]);
    EXPECT_EQ(batches, read(c.stream(epoch)));  // reproducible
  }
  EXPECT_NE(read(c.stream(0)), read(c.stream(1)));
  // Without shuffling every pass is the same order, as Lightning's example shows.
  const auto plain =
      volt::combined_loader({{"a", range_loader(10, 4)}, {"b", range_loader(40, 4)}});
  const auto batches = read(plain.stream(0));
  EXPECT_EQ(batches[3].at("a"), range(0, 4));
  EXPECT_EQ(batches[5].at("a"), range(8, 10));
}

TEST(CombinedLoader, AStreamFromAnyBatchIsTheRestOfTheEpoch) {
  // What exact resume needs: starting at batch k gives the batches a whole pass gives from k,
  // also with each loader's own worker threads.
  for (CombineMode mode :
       {CombineMode::kMaxSizeCycle, CombineMode::kMinSize, CombineMode::kMaxSize}) {
    for (int64_t workers : {0, 2}) {
      const auto c = volt::combined_loader({{"short", range_loader(9, 2, true, workers, 1)},
                                            {"long", range_loader(30, 3, true, workers, 2)},
                                            {"mid", range_loader(12, 5, false, workers)}},
                                           mode);
      const auto whole = read(c.stream(4));
      ASSERT_EQ(static_cast<int64_t>(whole.size()), c.num_batches());
      for (int64_t k = 0; k <= c.num_batches(); ++k) {
        EXPECT_EQ(read(c.stream(4, k)), std::vector<Parts>(whole.begin() + k, whole.end()))
            << mode << " from batch " << k << " with " << workers << " workers";
        if (k + 2 <= c.num_batches()) {
          EXPECT_EQ(read(c.stream(4, k, 2)),
                    std::vector<Parts>(whole.begin() + k, whole.begin() + k + 2));
        }
      }
    }
  }
}

TEST(CombinedLoader, ShardingShardsEachLoader) {
  const auto a = range_loader(10, 2, true, 0, 3);
  const auto b = range_loader(7, 3, false);
  const auto c = volt::combined_loader({{"a", a}, {"b", b}});
  std::set<int64_t> seen_b;
  for (int64_t rank : {0, 1}) {
    const auto mine = c.sharded(rank, 2);
    EXPECT_TRUE(mine.is_combined());
    const auto expected = read(
        volt::combined_loader({{"a", a.sharded(rank, 2)}, {"b", b.sharded(rank, 2)}}).stream(1));
    EXPECT_EQ(read(mine.stream(1)), expected);
    EXPECT_EQ(mine.num_batches(), 3);  // a: 5 samples per rank in batches of 2
    for (const auto& p : expected) seen_b.insert(p.at("b").begin(), p.at("b").end());
  }
  EXPECT_EQ(seen_b.size(), 7u);  // the ranks' shards of b cover it
  // Shuffling off (overfit_batches) turns it off in each loader.
  const auto unshuffled = c.with_shuffle(false);
  EXPECT_FALSE(unshuffled.options().shuffle());
  EXPECT_TRUE(c.options().shuffle());
  EXPECT_EQ(read(unshuffled.stream(0)),
            read(volt::combined_loader({{"a", a.with_shuffle(false)}, {"b", b}}).stream(0)));
}

TEST(CombinedLoader, TheTrainersShardingKeepsAPartTheProgramSharded) {
  // sharded_where_unsharded (use_distributed_sampler): part by part, a part sharded by the
  // program keeps its shard (even another rank's), the others are sharded; in either order.
  const auto a = range_loader(10, 2, true, 0, 3);
  const auto b = range_loader(7, 3, false);
  for (bool a_first : {true, false}) {
    std::vector<std::pair<std::string, volt::DataLoader>> parts = {{"a", a.sharded(1, 2)},
                                                                   {"b", b}};
    if (!a_first) std::swap(parts[0], parts[1]);
    const auto mine = volt::combined_loader(parts).sharded_where_unsharded(0, 2);
    for (const auto& p : mine.parts()) {
      EXPECT_EQ(p.second.options().world_size(), 2) << p.first;
      EXPECT_EQ(p.second.options().rank(), p.first == "a" ? 1 : 0) << p.first;
    }
  }
  // One loader: kept when sharded, sharded otherwise.
  EXPECT_EQ(a.sharded(1, 2).sharded_where_unsharded(0, 2).options().rank(), 1);
  EXPECT_EQ(b.sharded_where_unsharded(1, 2).options().rank(), 1);
  EXPECT_EQ(b.sharded_where_unsharded(1, 2).options().world_size(), 2);
}

TEST(CombinedLoader, PartsTravelAsExtraTensors) {
  auto collate = [](const std::vector<volt::Example>& ex) {
    volt::Batch b = volt::default_collate(ex);
    b.extra["double"] = b.input * 2;
    return b;
  };
  const volt::DataLoader with_extra(range_ds(6), volt::DataLoaderOptions(3).collate(collate));
  const auto inner = volt::combined_loader({{"x", with_extra}, {"y", range_loader(6, 2)}});
  const auto outer = volt::combined_loader({{"outer", inner}, {"z", range_loader(4, 4)}});
  auto s = outer.stream(0);
  volt::Batch b;
  ASSERT_TRUE(s.next(b));
  EXPECT_EQ(b.part_names(), (std::vector<std::string>{"outer", "z"}));
  EXPECT_EQ(b.size(), 3 + 2 + 4);
  EXPECT_TRUE(b.extra.count("outer/x/double"));
  // What moves a batch (Batch::to, pinning, casts) moves its parts with it.
  const volt::Batch moved = b.to(torch::kCPU);
  const volt::Batch x = moved.part("outer").part("x");
  EXPECT_EQ(targets(x.target), range(0, 3));
  EXPECT_TRUE(x.extra.at("double").equal(x.input * 2));
  EXPECT_EQ(targets(moved.part("z").target), range(0, 4));

  const std::string missing = error_of<volt::ValueError>([&] { b.part("w"); });
  EXPECT_NE(missing.find("no part 'w'"), std::string::npos) << missing;
  EXPECT_NE(missing.find("its parts: outer, z"), std::string::npos) << missing;
  const std::string plain = error_of<volt::ValueError>([&] {
    volt::Batch one;
    ASSERT_TRUE(range_loader(4, 2).stream(0).next(one));
    one.part("a");
  });
  EXPECT_NE(plain.find("not a combined loader's batch"), std::string::npos) << plain;
}

TEST(CombinedLoader, LastIndicesNumberTheRowsAsTheDataSetsLaidEndToEnd) {
  // range_ds(n)'s target is the sample's index, so a batch's parts say which samples it holds:
  // the indices are theirs in loader order, each loader's offset by the sizes before it (torch's
  // ConcatDataset), in every mode, with workers, sharded, and nested.
  auto expected_of = [](const volt::Batch& b, const std::vector<std::string>& names,
                        const std::vector<int64_t>& offsets) {
    std::vector<int64_t> out;
    for (size_t j = 0; j < names.size(); ++j) {
      if (!b.has_part(names[j])) continue;
      for (int64_t t : targets(b.part(names[j]).target)) out.push_back(offsets[j] + t);
    }
    return out;
  };
  for (CombineMode mode :
       {CombineMode::kMaxSizeCycle, CombineMode::kMinSize, CombineMode::kMaxSize}) {
    for (int64_t workers : {0, 2}) {
      for (int64_t rank : {-1, 1}) {
        auto c = volt::combined_loader({{"short", range_loader(9, 2, true, workers, 1)},
                                        {"long", range_loader(30, 4, true, workers, 2)}},
                                       mode);
        if (rank >= 0) c = c.sharded(rank, 2);
        auto s = c.stream(3);
        EXPECT_TRUE(s.last_indices().empty());  // before the first batch
        volt::Batch b;
        int64_t batches = 0;
        std::set<int64_t> seen;
        while (s.next(b)) {
          const auto got = s.last_indices();
          EXPECT_EQ(got, expected_of(b, {"short", "long"}, {0, 9}))
              << mode << ", " << workers << " workers, rank " << rank << ", batch " << batches;
          EXPECT_EQ(static_cast<int64_t>(got.size()), b.size());
          seen.insert(got.begin(), got.end());
          ++batches;
        }
        EXPECT_EQ(batches, c.num_batches());
        if (rank < 0 && mode != CombineMode::kMinSize) {
          EXPECT_EQ(seen.size(), 39u) << mode;  // every sample of both data sets, each once
        }
      }
    }
  }
  // Nested: the inner loader's rows come first, numbered over its two data sets (6 + 6).
  const auto inner = volt::combined_loader({{"x", range_loader(6, 3)}, {"y", range_loader(6, 2)}});
  const auto outer = volt::combined_loader({{"in", inner}, {"z", range_loader(4, 4, true)}});
  auto s = outer.stream(0);
  volt::Batch b;
  ASSERT_TRUE(s.next(b));
  std::vector<int64_t> expected = {0, 1, 2, 6, 7};
  for (int64_t t : targets(b.part("z").target)) expected.push_back(12 + t);
  EXPECT_EQ(s.last_indices(), expected);
}

TEST(CombinedLoader, BadInputIsATypedError) {
  auto has = [](const std::string& text, const std::string& phrase) {
    return text.find(phrase) != std::string::npos;
  };
  EXPECT_TRUE(
      has(error_of<volt::ConfigError>([] { volt::combined_loader({}); }), "was given no loaders"));
  EXPECT_TRUE(has(error_of<volt::ConfigError>([] {
                    volt::combined_loader({{"", range_loader(4, 2)}});
                  }),
                  "empty or has a '/'"));
  EXPECT_TRUE(has(error_of<volt::ConfigError>([] {
                    volt::combined_loader({{"a/b", range_loader(4, 2)}});
                  }),
                  "empty or has a '/'"));
  EXPECT_TRUE(has(error_of<volt::ConfigError>([] {
                    volt::combined_loader({{"a", range_loader(4, 2)}, {"a", range_loader(6, 2)}});
                  }),
                  "two loaders are named 'a'"));
  const auto c = volt::combined_loader({{"a", range_loader(4, 2)}, {"b", range_loader(6, 2)}});
  EXPECT_TRUE(has(error_of<volt::ConfigError>([&] { c.with_options(volt::DataLoaderOptions(2)); }),
                  "set them on each loader"));
  // Batch sizes whose sum wraps int64 (undefined behaviour before).
  const int64_t huge = std::numeric_limits<int64_t>::max() / 2 + 1;
  EXPECT_TRUE(
      has(error_of<volt::ConfigError>([&] {
            volt::combined_loader({{"a", range_loader(4, huge)}, {"b", range_loader(4, huge)}});
          }),
          "batch sizes add up past 2^63"));
  // An empty loader cannot be started again; max_size leaves it out, min_size has no batches.
  const auto empty = range_loader(0, 2);
  EXPECT_TRUE(has(error_of<volt::ConfigError>([&] {
                    volt::combined_loader({{"a", range_loader(4, 2)}, {"e", empty}}).stream(0);
                  }),
                  "combined loader 'e' has no batches"));
  EXPECT_EQ(
      read(volt::combined_loader({{"a", range_loader(4, 2)}, {"e", empty}}, CombineMode::kMaxSize)
               .stream(0)),
      (std::vector<Parts>{{{"a", range(0, 2)}}, {{"a", range(2, 4)}}}));
  EXPECT_EQ(volt::combined_loader({{"a", range_loader(4, 2)}, {"e", empty}}, CombineMode::kMinSize)
                .num_batches(),
            0);
  // A loader whose batches carry an extra tensor named like a part's input.
  auto clash = [](const std::vector<volt::Example>& ex) {
    volt::Batch b = volt::default_collate(ex);
    b.extra["target"] = b.target;
    return b;
  };
  const volt::DataLoader clashing(range_ds(4), volt::DataLoaderOptions(2).collate(clash));
  EXPECT_TRUE(has(error_of<volt::ConfigError>([&] {
                    volt::Batch b;
                    volt::combined_loader({{"c", clashing}}).stream(0).next(b);
                  }),
                  "extra tensor named 'target'"));
}

}  // namespace
