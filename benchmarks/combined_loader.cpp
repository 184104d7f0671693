// What combining loaders costs: volt::combined_loader (max_size_cycle) against reading the same
// two loaders by hand in lockstep (the shorter one started again on its own), batch for batch
// the same tensors.
//
//   volt_bench_combined_loader [--rounds N (default 5)]
//
// Two in-memory data sets of Fashion-MNIST's shape (784 floats and a label per row): 60,000 and
// 10,000 rows, batches of 64 from each (938 combined batches per epoch), shuffled; with the
// batches built on the reading thread (num_workers 0) and by 2 worker threads per loader. Each
// side reads one whole epoch per round; sides alternate; medians of --rounds. The hand loop is
// the reference: what the combined loader adds is its bookkeeping (one pass per loader, the
// batch's tensors as named extras).

#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "timing.h"
#include "volt/volt.h"

namespace {

using volt_bench::median;
using volt_bench::time_ms;

std::shared_ptr<volt::TensorDataset> rows(int64_t n, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return std::make_shared<volt::TensorDataset>(at::rand({n, 784}, gen), at::randint(10, {n}, gen));
}

// Reads loaders a and b as max_size_cycle pairs them, by hand; returns a checksum of the rows.
double by_hand(const volt::DataLoader& a, const volt::DataLoader& b, int64_t epoch) {
  const volt::DataLoader& longer = a.num_batches() >= b.num_batches() ? a : b;
  const volt::DataLoader& shorter = &longer == &a ? b : a;
  double sum = 0;
  volt::BatchStream l = longer.stream(epoch);
  int64_t pass = 0;
  volt::BatchStream s = shorter.stream(epoch);
  volt::Batch x, y;
  while (l.next(x)) {
    if (!s.next(y)) {
      // The combined loader's numbering of later passes (its sampler epochs) is internal; a
      // new epoch number gives the hand loop a new order in the same way.
      s = shorter.stream(epoch + 1000 * ++pass);
      s.next(y);
    }
    sum += static_cast<double>(x.size() + y.size());
  }
  return sum;
}

double combined(const volt::DataLoader& c, int64_t epoch) {
  double sum = 0;
  volt::Batch batch;
  for (volt::BatchStream s = c.stream(epoch); s.next(batch);) {
    sum += static_cast<double>(batch.size());
  }
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
  }
  const auto big = rows(60000, 1), small = rows(10000, 2);
  std::printf("two loaders of 60000 and 10000 rows x 784 floats, batches of 64, max_size_cycle\n");
  std::printf("%-8s %14s %14s %10s\n", "workers", "by hand ms", "combined ms", "combined/by hand");
  for (int64_t workers : {0, 2}) {
    const auto opts = volt::DataLoaderOptions(64).shuffle(true).num_workers(workers);
    const volt::DataLoader a(big, volt::DataLoaderOptions(opts).seed(1));
    const volt::DataLoader b(small, volt::DataLoaderOptions(opts).seed(2));
    const volt::DataLoader c = volt::combined_loader({{"a", a}, {"b", b}});
    std::vector<double> hand_ms, comb_ms;
    double check_hand = 0, check_comb = 0;
    for (int r = 0; r < rounds; ++r) {
      hand_ms.push_back(time_ms([&] { check_hand = by_hand(a, b, r); }));
      comb_ms.push_back(time_ms([&] { check_comb = combined(c, r); }));
    }
    if (check_hand != check_comb) {
      std::printf("the two sides read different numbers of rows: %.0f vs %.0f\n", check_hand,
                  check_comb);
      return 1;
    }
    const double h = median(hand_ms), m = median(comb_ms);
    std::printf("%-8lld %14.1f %14.1f %10.3f\n", static_cast<long long>(workers), h, m, m / h);
  }
  return 0;
}
