// One rank of the distributed tests (tests/distributed/). Started by a test with the cluster
// variables of one environment (plain, torchrun, Slurm, Open MPI), or as a plain process that
// launches its local workers itself (LocalLauncher re-executes this binary).
//
//   volt_dist_worker SCENARIO [--devices N] [--nodes M] [--timeout-ms T] [--victim R]
//                    [--config-hash H]
//
// Scenarios: collectives, call-checks (run it with TORCH_DISTRIBUTED_DEBUG=DETAIL), leaders,
// reducer, start-fails, zero-masters, zero-resync, tp-train, config-hash, hold, orphan, reap.
// Each prints one
// line per finding ("rank R: ...") and exits 0 when every check passed, 1 when a check failed, 3
// when the expected volt error was raised (its message printed on one line).

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <torch/torch.h>
#include <unistd.h>
#include <volt/core/errors.h>
#include <volt/distributed/cluster_environment.h>
#include <volt/distributed/functional.h>
#include <volt/distributed/gradient_reducer.h>
#include <volt/distributed/local_launcher.h>
#include <volt/distributed/process_group.h>
#include <volt/distributed/tensor_parallel.h>
#include <volt/distributed/zero_engine.h>
#include <volt/nn/checkpoint.h>
#include <volt/precision/autocast.h>

#include "distributed/detail/async_collective.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <thread>

namespace {

using std::chrono::milliseconds;

struct Args {
  std::string scenario;
  int64_t devices = 2;
  int64_t nodes = 1;
  int64_t timeout_ms = 20000;
  int64_t victim = 1;
  std::string config_hash = "same";
};

// One write per line, so that lines of concurrent ranks never interleave.
void say(const std::string& line) {
  std::string s = line + "\n";
  [[maybe_unused]] auto n = ::write(1, s.data(), s.size());
}

int g_rank = -1;

[[noreturn]] void fail(const std::string& what) {
  say("rank " + std::to_string(g_rank) + ": CHECK FAILED: " + what);
  std::_Exit(1);
}

#define CHECK_TRUE(cond, what)                             \
  do {                                                     \
    if (!(cond)) fail(std::string(what) + " (" #cond ")"); \
  } while (false)

void check_close(const at::Tensor& a, const at::Tensor& b, double tol, const std::string& what) {
  if (!a.sizes().equals(b.sizes())) fail(what + ": shapes differ");
  double diff = (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
  if (!(diff <= tol)) {
    std::ostringstream os;
    os << what << ": max diff " << diff << " > " << tol;
    fail(os.str());
  }
}

// Expects `fn` to throw E containing `phrase`.
template <typename E, typename F>
void expect_throw(F&& fn, const std::string& phrase, const std::string& what) {
  try {
    fn();
  } catch (const E& e) {
    if (std::string(e.what()).find(phrase) == std::string::npos) {
      fail(what + ": message lacks '" + phrase + "': " + e.what());
    }
    return;
  }
  fail(what + ": no exception");
}

// ---------------------------------------------------------------------------- collectives

// Dtypes Gloo (1.13) lacks, each through every collective: bool, int16 and complex travel as
// their bytes where a collective only copies and are widened where it computes. Mistakes (an
// undefined or sparse tensor, an order of complex numbers) are ValueErrors that leave the group
// usable.
void run_other_dtypes(volt::ProcessGroup& pg) {
  const int64_t r = pg.rank(), w = pg.world_size();
  const auto bools = [](std::vector<int64_t> v) { return at::tensor(v).to(at::kBool); };
  const auto flags = bools({r == 0, r == w - 1, false, true});  // rank r's
  CHECK_TRUE(pg.all_reduce(flags, volt::Reduce::kSum).equal(bools({true, true, false, true})),
             "all_reduce bool sum is or");
  CHECK_TRUE(pg.all_reduce(flags, volt::Reduce::kMin).equal(bools({w == 1, w == 1, false, true})),
             "all_reduce bool min is and");
  CHECK_TRUE(pg.all_reduce(flags, volt::Reduce::kMax).scalar_type() == at::kBool,
             "bool stays bool");
  // int16 near its limit: the sum wraps as int16 arithmetic does, the extremes are exact.
  const auto shorts = at::tensor(std::vector<int64_t>{30000, -7, r}).to(at::kShort);
  const auto short_sum = pg.all_reduce(shorts, volt::Reduce::kSum);
  CHECK_TRUE(
      short_sum.scalar_type() == at::kShort &&
          short_sum.equal(
              at::tensor(std::vector<int64_t>{30000 * w, -7 * w, w * (w - 1) / 2}).to(at::kShort)),
      "all_reduce int16 sum");
  CHECK_TRUE(pg.all_reduce(shorts, volt::Reduce::kMax)[2].item<int64_t>() == w - 1,
             "all_reduce int16 max");
  // Complex: a scalar too (0-dim), and a conjugate view.
  const auto z = at::complex(at::full({3}, float(r)), at::full({3}, float(-2 * r - 1)));
  const float re = w * (w - 1) / 2.0f, im = -float(w * w);
  const auto z_sum = pg.all_reduce(z, volt::Reduce::kSum);
  CHECK_TRUE(z_sum.scalar_type() == at::kComplexFloat &&
                 z_sum.equal(at::complex(at::full({3}, re), at::full({3}, im))),
             "all_reduce complex sum");
  CHECK_TRUE(pg.all_reduce(z.conj(), volt::Reduce::kSum)
                 .equal(at::complex(at::full({3}, re), at::full({3}, -im))),
             "all_reduce of a conjugate view");
  const auto z0 = at::scalar_tensor(c10::complex<double>(1.0, r), at::kComplexDouble);
  const auto z0_mean = pg.all_reduce(z0, volt::Reduce::kMean);
  CHECK_TRUE(z0_mean.dim() == 0 && z0_mean.scalar_type() == at::kComplexDouble &&
                 z0_mean.item<c10::complex<double>>() == c10::complex<double>(1.0, (w - 1) / 2.0),
             "all_reduce complex128 scalar mean");
  // Copied: broadcast_ (alone, in place; and in a list), all_gather, reduce_scatter, send/recv.
  auto bflags = flags.clone();
  pg.broadcast_(bflags, w - 1);
  CHECK_TRUE(bflags.equal(bools({w == 1, true, false, true})), "broadcast_ bool");
  std::vector<at::Tensor> mixed{shorts.clone(), z.clone(), z0.clone(), flags.clone()};
  pg.broadcast_(mixed, 0);
  CHECK_TRUE(
      mixed[0].equal(at::tensor(std::vector<int64_t>{30000, -7, 0}).to(at::kShort)) &&
          mixed[1].equal(at::complex(at::zeros({3}), at::full({3}, -1.0f))) &&
          mixed[2].equal(at::scalar_tensor(c10::complex<double>(1.0, 0.0), at::kComplexDouble)) &&
          mixed[3].equal(bools({true, w == 1, false, true})),
      "broadcast_ of a list of other dtypes");
  const auto zg = pg.all_gather(z0);
  const auto fg = pg.all_gather(flags.view({2, 2}));
  for (int64_t q = 0; q < w; ++q) {
    CHECK_TRUE(
        zg[q].dim() == 0 && zg[q].item<c10::complex<double>>() == c10::complex<double>(1.0, q),
        "all_gather complex128 scalar");
    CHECK_TRUE(fg[q].equal(bools({q == 0, q == w - 1, false, true}).view({2, 2})),
               "all_gather bool");
  }
  const auto zr = pg.reduce_scatter(
      at::complex(at::arange(2 * w, at::kFloat), at::full({2 * w}, float(r))).view({w, 2}));
  CHECK_TRUE(zr.equal(at::complex(at::arange(2 * r, 2 * r + 2, at::kFloat) * w,
                                  at::full({2}, w * (w - 1) / 2.0f))
                          .view({1, 2})),
             "reduce_scatter complex");
  CHECK_TRUE(pg.reduce_scatter(at::full({w, 3}, r + 1, at::kShort), volt::Reduce::kMax)
                 .equal(at::full({1, 3}, w, at::kShort)),
             "reduce_scatter int16 max");
  if (w > 1) {
    const int64_t next = (r + 1) % w, prev = (r + w - 1) % w;
    auto got = at::zeros({2}, at::kComplexDouble);
    auto got_flags = at::zeros({4}, at::kBool);
    auto s1 = pg.isend(at::full({2}, c10::complex<double>(r, 1), at::kComplexDouble), next);
    auto s2 = pg.isend(flags, next);
    auto r1 = pg.irecv_(got, prev);
    auto r2 = pg.irecv_(got_flags, prev);
    for (auto* t : {&r1, &r2, &s1, &s2}) t->wait();
    CHECK_TRUE(got.equal(at::full({2}, c10::complex<double>(prev, 1), at::kComplexDouble)),
               "send/recv complex128");
    CHECK_TRUE(got_flags.equal(bools({prev == 0, prev == w - 1, false, true})), "send/recv bool");
  }
  // Mistakes: ValueErrors, on every rank alike, and the group goes on.
  expect_throw<volt::ValueError>([&] { pg.all_reduce(z, volt::Reduce::kMax); },
                                 "complex numbers have no order", "all_reduce max of complex");
  expect_throw<volt::ValueError>(
      [&] {
        pg.reduce_scatter(at::zeros({w, 1}, at::kComplexFloat), volt::Reduce::kMin);
      },
      "complex numbers have no order", "reduce_scatter min of complex");
  expect_throw<volt::ValueError>([&] { pg.all_reduce(shorts, volt::Reduce::kMean); }, "floating",
                                 "all_reduce mean of int16");
  expect_throw<volt::ValueError>([&] { pg.all_reduce(at::Tensor(), volt::Reduce::kSum); },
                                 "all_reduce got an undefined tensor", "all_reduce undefined");
  expect_throw<volt::ValueError>([&] { pg.all_gather(at::Tensor()); },
                                 "all_gather got an undefined tensor", "all_gather undefined");
  expect_throw<volt::ValueError>([&] { pg.reduce_scatter(at::Tensor()); },
                                 "reduce_scatter got an undefined tensor",
                                 "reduce_scatter undefined");
  std::vector<at::Tensor> with_hole{at::ones({2}), at::Tensor()};
  expect_throw<volt::ValueError>([&] { pg.broadcast_(with_hole, 0); },
                                 "broadcast_ got an undefined tensor at index 1",
                                 "broadcast_ list with an undefined tensor");
  expect_throw<volt::ValueError>([&] { pg.all_reduce(at::eye(3).to_sparse(), volt::Reduce::kSum); },
                                 "to_dense()", "all_reduce of a sparse tensor");
  if (w > 1) {
    expect_throw<volt::ValueError>([&] { pg.isend(at::Tensor(), (r + 1) % w); },
                                   "send got an undefined tensor", "isend undefined");
  }
  check_close(pg.all_reduce(at::ones({2}), volt::Reduce::kSum), at::full({2}, float(w)), 0,
              "the group still works after the ValueErrors");
  say("rank " + std::to_string(r) + ": other dtypes ok");
}

void run_collectives(volt::ProcessGroup& pg) {
  const int64_t r = pg.rank(), w = pg.world_size();
  auto in = at::full({3}, static_cast<float>(r + 1));
  auto sum = pg.all_reduce(in, volt::Reduce::kSum);
  check_close(sum, at::full({3}, w * (w + 1) / 2.0f), 0, "all_reduce sum");
  check_close(in, at::full({3}, static_cast<float>(r + 1)), 0, "all_reduce leaves input");
  check_close(pg.all_reduce(in, volt::Reduce::kMean), at::full({3}, (w + 1) / 2.0f), 1e-6,
              "all_reduce mean");
  check_close(pg.all_reduce(in, volt::Reduce::kMin), at::full({3}, 1.0f), 0, "all_reduce min");
  check_close(pg.all_reduce(in, volt::Reduce::kMax), at::full({3}, float(w)), 0, "all_reduce max");
  // Non-contiguous input.
  auto nc = at::arange(6, at::kFloat).view({2, 3}).t() * (r + 1);
  check_close(pg.all_reduce(nc, volt::Reduce::kSum),
              at::arange(6, at::kFloat).view({2, 3}).t() * (w * (w + 1) / 2), 0,
              "all_reduce non-contiguous");
  expect_throw<volt::ValueError>(
      [&] { pg.all_reduce(at::ones({2}, at::kLong), volt::Reduce::kMean); }, "floating",
      "all_reduce mean of ints");

  auto b = at::full({2, 3}, float(r));
  pg.broadcast_(b, w - 1);
  check_close(b, at::full({2, 3}, float(w - 1)), 0, "broadcast_");
  auto bt = at::full({3, 2}, float(r)).t();
  pg.broadcast_(bt, 0);
  check_close(bt, at::zeros({2, 3}), 0, "broadcast_ non-contiguous");
  auto p = torch::full({4}, float(r), torch::requires_grad());
  std::vector<at::Tensor> many{p, at::full({2}, r * 10, at::kLong),
                               at::full({1}, r + 0.5, at::kDouble), at::empty({0})};
  pg.broadcast_(many, 0);
  check_close(many[0], at::zeros({4}), 0, "broadcast_ list float (requires_grad)");
  CHECK_TRUE(many[1].equal(at::zeros({2}, at::kLong)), "broadcast_ list long");
  check_close(many[2], at::full({1}, 0.5, at::kDouble), 0, "broadcast_ list double");
  expect_throw<volt::ValueError>([&] { pg.broadcast_(b, w); }, "outside world size",
                                 "broadcast_ bad src");

  auto g = pg.all_gather(at::full({2}, float(r)));
  CHECK_TRUE(static_cast<int64_t>(g.size()) == w, "all_gather size");
  for (int64_t q = 0; q < w; ++q) check_close(g[q], at::full({2}, float(q)), 0, "all_gather item");
  expect_throw<volt::ValueError>([&] { pg.all_gather(at::zeros({r == 0 ? 3 : 2})); },
                                 "same shape and dtype", "all_gather shape mismatch");
  // volt::all_gather: stacked in rank order; with sync_grads differentiable. Rank k's loss is
  // sum_j (j + k + 1) * |x_j|^2 over every rank's x_j, so the gradient one process computing
  // every rank's loss gives x_r is 2 x_r * sum_k (r + k + 1) = 2 x_r (w (r + 1) + w (w - 1) / 2).
  {
    auto mine = (at::arange(6, at::kFloat).view({2, 3}) + 10 * r).requires_grad_();
    auto plain = volt::all_gather(pg, mine);
    CHECK_TRUE(plain.sizes() == at::IntArrayRef({w, 2, 3}) && !plain.requires_grad(),
               "all_gather stacked, no gradient without sync_grads");
    for (int64_t q = 0; q < w; ++q) {
      check_close(plain[q], at::arange(6, at::kFloat).view({2, 3}) + 10 * q, 0, "stacked item");
    }
    auto gathered = volt::all_gather(pg, mine, /*sync_grads=*/true);
    CHECK_TRUE(gathered.requires_grad(), "all_gather with sync_grads needs a gradient");
    auto weights = (at::arange(w, at::kFloat) + r + 1).view({w, 1, 1});
    (weights * gathered.square()).sum().backward();
    check_close(mine.grad(), 2 * mine.detach() * static_cast<float>(w * (r + 1) + w * (w - 1) / 2),
                0, "all_gather sync_grads gradient");
  }
  auto flat = pg.all_gather_flat(at::full({2, 2}, float(r)));
  CHECK_TRUE(flat.size(0) == 2 * w, "all_gather_flat rows");
  for (int64_t q = 0; q < w; ++q) {
    check_close(flat.narrow(0, 2 * q, 2), at::full({2, 2}, float(q)), 0, "all_gather_flat block");
  }
  auto rs_in = at::arange(2 * w, at::kFloat) + r;
  auto rs = pg.reduce_scatter(rs_in, volt::Reduce::kSum);
  auto full = at::arange(2 * w, at::kFloat) * w + w * (w - 1) / 2.0f;
  check_close(rs, full.narrow(0, 2 * r, 2), 0, "reduce_scatter");
  expect_throw<volt::ValueError>([&] { pg.reduce_scatter(at::zeros({2 * w + 1})); }, "divisible",
                                 "reduce_scatter size");
  // Rows of several columns, given transposed (not contiguous), and the other reductions: rank q
  // holds q - 3 * (q % 2) + i in element i, so the minimum and maximum come from different ranks.
  auto rows_t = (at::arange(3 * w, at::kFloat).view({3, w}) + float(r - 3 * (r % 2))).t();
  auto of_rank = [&](int64_t q) {
    return at::arange(3 * w, at::kFloat).view({3, w}).t() + float(q - 3 * (q % 2));
  };
  auto lo = of_rank(0), hi = of_rank(0), total = of_rank(0);
  for (int64_t q = 1; q < w; ++q) {
    lo = at::minimum(lo, of_rank(q));
    hi = at::maximum(hi, of_rank(q));
    total = total + of_rank(q);
  }
  check_close(pg.reduce_scatter(rows_t, volt::Reduce::kMin), lo.narrow(0, r, 1), 0,
              "reduce_scatter min");
  check_close(pg.reduce_scatter(rows_t, volt::Reduce::kMax), hi.narrow(0, r, 1), 0,
              "reduce_scatter max");
  check_close(pg.reduce_scatter(rows_t, volt::Reduce::kMean), total.narrow(0, r, 1) / w, 0,
              "reduce_scatter mean");
  CHECK_TRUE(pg.reduce_scatter(at::full({w}, r + 1, at::kLong))
                 .equal(at::full({1}, w * (w + 1) / 2, at::kLong)),
             "reduce_scatter long");
  CHECK_TRUE(pg.reduce_scatter(at::empty({0, 2})).numel() == 0, "reduce_scatter empty");
  // bf16, which Gloo in libtorch 1.13 lacks: reduced in fp32 and rounded back, copied as bits.
  // 1/3 + r is not a bf16 value: the results must be exactly the roundings of fp32 arithmetic.
  const auto bf = (at::full({5}, 1.0f / 3) + r).to(at::kBFloat16);
  float bf_sum = 0;
  for (int64_t q = 0; q < w; ++q)
    bf_sum += (at::full({1}, 1.0f / 3) + q).to(at::kBFloat16).item<float>();
  const auto bsum = pg.all_reduce(bf, volt::Reduce::kSum);
  CHECK_TRUE(bsum.scalar_type() == at::kBFloat16, "all_reduce bf16 dtype");
  CHECK_TRUE(bsum.equal(at::full({5}, bf_sum).to(at::kBFloat16)), "all_reduce bf16 sum");
  auto bb = bf.clone();
  pg.broadcast_(bb, w - 1);
  CHECK_TRUE(bb.equal((at::full({5}, 1.0f / 3) + (w - 1)).to(at::kBFloat16)), "broadcast_ bf16");
  auto bg = pg.all_gather(bf);
  for (int64_t q = 0; q < w; ++q) {
    CHECK_TRUE(bg[q].scalar_type() == at::kBFloat16 &&
                   bg[q].equal((at::full({5}, 1.0f / 3) + q).to(at::kBFloat16)),
               "all_gather bf16 item");
  }
  const auto brs = pg.reduce_scatter((at::full({w}, 1.0f / 3) + r).to(at::kBFloat16));
  CHECK_TRUE(
      brs.scalar_type() == at::kBFloat16 && brs.equal(at::full({1}, bf_sum).to(at::kBFloat16)),
      "reduce_scatter bf16 sum");
  // In inference mode (the Trainer's evaluation loops, a program's own inference): Gloo runs
  // each collective on a thread of its own, outside that mode, where an inference tensor cannot
  // be written, so every collective must hand it normal buffers and only read the caller's.
  {
    c10::InferenceMode inference;
    const auto x = at::full({3}, static_cast<float>(r + 1));
    CHECK_TRUE(x.is_inference(), "an inference tensor");
    check_close(pg.all_reduce(x, volt::Reduce::kSum), at::full({3}, w * (w + 1) / 2.0f), 0,
                "all_reduce in inference mode");
    check_close(pg.all_reduce(x.to(at::kBFloat16), volt::Reduce::kMax).to(at::kFloat),
                at::full({3}, float(w)), 0, "all_reduce bf16 in inference mode");
    auto xb = at::full({2, 3}, float(r));
    pg.broadcast_(xb, w - 1);
    check_close(xb, at::full({2, 3}, float(w - 1)), 0, "broadcast_ in inference mode");
    // Two floats travel in one buffer and are copied back into the caller's tensors.
    std::vector<at::Tensor> xs{at::full({2}, float(r)), at::full({3}, r + 0.5f),
                               at::full({1}, r, at::kLong)};
    pg.broadcast_(xs, w - 1);
    check_close(xs[0], at::full({2}, float(w - 1)), 0, "broadcast_ list in inference mode");
    check_close(xs[1], at::full({3}, w - 0.5f), 0, "broadcast_ list in inference mode");
    CHECK_TRUE(xs[2].equal(at::full({1}, w - 1, at::kLong)), "broadcast_ list long, inference");
    const auto xg = pg.all_gather(x);
    for (int64_t q = 0; q < w; ++q) {
      check_close(xg[q], at::full({3}, float(q + 1)), 0, "all_gather in inference mode");
    }
    check_close(pg.reduce_scatter(at::arange(2 * w, at::kFloat) + r, volt::Reduce::kSum),
                full.narrow(0, 2 * r, 2), 0, "reduce_scatter in inference mode");
    CHECK_TRUE(pg.all_of(true) && !pg.any_of(false), "all_of / any_of in inference mode");
  }
  pg.barrier();
  CHECK_TRUE(pg.all_of(true), "all_of(true)");
  CHECK_TRUE(pg.all_of(r != 0) == (w == 1), "all_of(r != 0)");
  CHECK_TRUE(pg.any_of(r == w - 1), "any_of(last)");
  CHECK_TRUE(!pg.any_of(false), "any_of(false)");
  if (w > 1) {
    // Every rank sends to the next and receives from the one before, both started before either
    // is waited for (with blocking sends each rank would wait for the next to receive: a cycle).
    const int64_t next = (r + 1) % w, prev = (r + w - 1) % w;
    const at::Tensor mine = at::arange(12, at::kFloat).view({3, 4}) * (r + 1);
    at::Tensor got = at::zeros({3, 4});
    at::Tensor got_t = at::zeros({4, 3}).t();  // not contiguous: through a buffer
    at::Tensor got_bf16 = at::zeros({5}, at::kBFloat16);
    volt::ProcessGroup::Transfer s1 = pg.isend(mine, next);
    volt::ProcessGroup::Transfer s2 = pg.isend(mine * 2, next);
    volt::ProcessGroup::Transfer s3 = pg.isend(at::full({5}, 0.5 + r, at::kBFloat16), next);
    volt::ProcessGroup::Transfer r1 = pg.irecv_(got, prev);
    volt::ProcessGroup::Transfer r2 = pg.irecv_(got_t, prev);
    volt::ProcessGroup::Transfer r3;
    CHECK_TRUE(!r3.pending(), "an empty transfer is not pending");
    r3 = pg.irecv_(got_bf16, prev);
    CHECK_TRUE(r1.pending() && r3.pending() && s1.pending(), "started transfers are pending");
    for (auto* t : {&r3, &r2, &r1, &s3, &s2, &s1}) t->wait();
    CHECK_TRUE(!r1.pending() && !s3.pending(), "waited transfers are not pending");
    r1.wait();  // at once
    const at::Tensor theirs = at::arange(12, at::kFloat).view({3, 4}) * (prev + 1);
    check_close(got, theirs, 0, "irecv_");
    check_close(got_t, theirs * 2, 0, "irecv_ into a non-contiguous tensor");
    check_close(got_bf16, at::full({5}, 0.5 + prev, at::kBFloat16), 0, "irecv_ of bf16");
    expect_throw<volt::ValueError>([&] { pg.isend(mine, r); }, "must be another rank",
                                   "isend to itself");
    expect_throw<volt::ValueError>([&] { pg.irecv_(got, w); }, "must be another rank",
                                   "irecv_ from a rank outside the group");
    pg.barrier();
  }
  run_other_dtypes(pg);
  say("rank " + std::to_string(r) + ": collectives ok");
}

// ---------------------------------------------------------------------------- call checks

// With TORCH_DISTRIBUTED_DEBUG=DETAIL: ranks whose calls differ (a broadcast of another size,
// an all_reduce of another dtype, different collectives, an all_gather of another shape) all get
// the ValueError naming each rank's call, and the group goes on working. Without the switch the
// first case aborts a rank inside Gloo. Prints "rank R: call error: MESSAGE" for each and "rank R:
// call checks ok".
void run_call_checks(const std::shared_ptr<volt::ProcessGroup>& group) {
  volt::ProcessGroup& pg = *group;
  const int64_t r = pg.rank();
  const std::string me = "rank " + std::to_string(r);
  const auto expect_error = [&](const std::function<void()>& call) {
    try {
      call();
    } catch (const volt::ValueError& e) {
      say(me + ": call error: " + e.what());
      return;
    }
    fail("the mismatched call succeeded");
  };
  at::Tensor sized = at::zeros({r == 0 ? 6 : 1});
  expect_error([&] { pg.broadcast_(sized, 0); });
  expect_error([&] { pg.all_reduce(at::ones({2, 3}, r == 0 ? at::kFloat : at::kDouble)); });
  expect_error([&] {
    if (r == 0) {
      pg.barrier();
    } else {
      pg.all_reduce(at::ones({4}), volt::Reduce::kMax);
    }
  });
  // all_gather's own shape check is left to the call check here.
  expect_error([&] { pg.all_gather(at::zeros({2, r == 0 ? 2 : 5})); });
  // The collectives ZeRO starts and waits for later are checked when they start.
  expect_error([&] { volt::detail::start_all_gather(group, at::zeros({r == 0 ? 3 : 4})).wait(); });
  expect_error([&] {
    volt::detail::start_reduce_scatter(group, at::zeros({pg.world_size(), 2}),
                                       r == 0 ? volt::Reduce::kSum : volt::Reduce::kMax)
        .wait();
  });
  // Matching calls pass the check and run.
  at::Tensor value = at::full({3}, static_cast<float>(r + 1));
  pg.broadcast_(value, 1);
  check_close(value, at::full({3}, 2.0f), 0, "broadcast after the errors");
  pg.barrier();
  check_close(pg.all_reduce(at::ones({2}), volt::Reduce::kSum),
              at::full({2}, static_cast<float>(pg.world_size())), 0, "all_reduce after them");
  const auto gathered = pg.all_gather(at::full({2, 2}, static_cast<float>(r)));
  CHECK_TRUE(static_cast<int64_t>(gathered.size()) == pg.world_size(), "all_gather's size");
  for (int64_t q = 0; q < pg.world_size(); ++q) {
    check_close(gathered[q], at::full({2, 2}, static_cast<float>(q)), 0, "all_gather after them");
  }
  say(me + ": call checks ok");
}

// ---------------------------------------------------------------------------- leaders

// run_on_leaders on three ranks: on the whole group (ranks 0 and 2 lead), then ranks 1 and 2 lead
// a call whose work is two rounds of their own subgroup's run_on_leaders (its rank 0, global 1,
// leads, its work outlasting the timeout). Each call's keys are its own (the subgroup's first
// call is not the root's first), the subgroup's leader beats where its members look, and a
// member returns only after its leader's work ended.
void run_leaders(const std::shared_ptr<volt::ProcessGroup>& pg, milliseconds timeout) {
  const int64_t r = pg->rank();
  const std::string me = "rank " + std::to_string(r);
  CHECK_TRUE(pg->world_size() == 3, "three ranks");
  const auto now_ms = [] {
    using namespace std::chrono;
    return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
  };
  int64_t led = 0;
  pg->run_on_leaders("world", {0, 2}, [&] { ++led; });
  CHECK_TRUE(led == (r != 1 ? 1 : 0), "the world's leaders ran its work, once");
  std::shared_ptr<volt::ProcessGroup> pair;
  if (r != 0) pair = pg->new_group({1, 2}, "pair");
  pg->run_on_leaders("pairs", {1, 2}, [&] {
    for (int round = 1; round <= 2; ++round) {
      int64_t finished = 0;
      pair->run_on_leaders("pair", {0}, [&] {
        std::this_thread::sleep_for(timeout * 3 / 2);
        finished = now_ms();
      });
      const int64_t returned = now_ms();
      auto when = at::full({1}, finished, at::kLong);
      pair->broadcast_(when, 0);
      CHECK_TRUE(returned >= when.item<int64_t>(), me + " returned from the pair's round " +
                                                       std::to_string(round) +
                                                       " before its leader's work ended");
    }
    say(me + ": pair rounds ok");
  });
  pg->barrier();
  say(me + ": leaders ok");
}

// ---------------------------------------------------------------------------- reducer

struct Mlp : torch::nn::Module {
  explicit Mlp(int64_t hidden = 16) {
    fc1 = register_module("fc1", torch::nn::Linear(8, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 4));
    unused = register_module("unused", torch::nn::Linear(4, 4));
  }
  at::Tensor forward(const at::Tensor& x, bool use_unused = false) {
    auto h = fc2->forward(torch::tanh(fc1->forward(x)));
    return use_unused ? unused->forward(h) : h;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, unused{nullptr};
};

std::shared_ptr<Mlp> make_mlp(int64_t hidden = 16) {
  torch::manual_seed(0);  // identical weights on every rank
  return std::make_shared<Mlp>(hidden);
}

at::Tensor batch_for(int64_t rank, int64_t step) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(1000 + 97 * rank + step));
  return at::randn({6, 8}, gen);
}

at::Tensor loss_of(Mlp& m, const at::Tensor& x, bool use_unused = false) {
  return m.forward(x, use_unused).pow(2).mean();
}

// Per-rank gradients without touching .grad (autograd::grad runs no AccumulateGrad, so the
// Reducer's hooks stay quiet).
std::vector<at::Tensor> local_grads(Mlp& m, const std::vector<at::Tensor>& params,
                                    const at::Tensor& x, bool use_unused = false) {
  auto g = torch::autograd::grad({loss_of(m, x, use_unused)}, params, {}, false, false,
                                 /*allow_unused=*/true);
  for (size_t i = 0; i < g.size(); ++i) {
    if (!g[i].defined()) g[i] = at::zeros_like(params[i]);
  }
  return g;
}

std::vector<at::Tensor> mean_over_ranks(volt::ProcessGroup& pg, const std::vector<at::Tensor>& t) {
  std::vector<at::Tensor> out;
  for (const auto& x : t) out.push_back(pg.all_reduce(x, volt::Reduce::kMean));
  return out;
}

bool inside(const at::Tensor& t, const at::Tensor& buffer) {
  auto* p = static_cast<char*>(t.data_ptr());
  auto* b = static_cast<char*>(buffer.data_ptr());
  return p >= b && p + t.nbytes() <= b + buffer.nbytes();
}

// Checks .grad against `expected` and, with bucket views, that every .grad lives in a bucket.
void check_grads(volt::GradientReducer& red, const std::vector<at::Tensor>& params,
                 const std::vector<at::Tensor>& expected, const std::string& what) {
  auto buckets = red.bucket_buffers();
  for (size_t i = 0; i < params.size(); ++i) {
    auto g = params[i].grad();
    CHECK_TRUE(g.defined(), what + ": grad " + std::to_string(i) + " defined");
    check_close(g, expected[i], 2e-6, what + ": grad " + std::to_string(i));
    bool aliased = false;
    for (const auto& b : buckets) aliased = aliased || inside(g, b);
    CHECK_TRUE(aliased == red.options().gradient_as_bucket_view(),
               what + ": grad " + std::to_string(i) + " aliases a bucket iff bucket views are on");
  }
}

void reset_grads(const std::vector<at::Tensor>& params, bool keep_storage) {
  for (auto p : params) {
    if (!p.grad().defined()) continue;
    if (keep_storage) {
      p.mutable_grad().zero_();  // keeps bucket views
    } else {
      p.mutable_grad() = at::Tensor();
    }
  }
}

void sgd_step(const std::vector<at::Tensor>& params, double lr) {
  torch::NoGradGuard g;
  for (auto p : params) p.sub_(p.grad() * lr);
}

// Gradients equal the mean over ranks, for several steps (the Reducer rebuilds its buckets after
// the first), with and without bucket views, one or many buckets.
void reducer_averages(volt::ProcessGroup& pg, std::shared_ptr<volt::ProcessGroup> shared,
                      volt::GradientReducerOptions opt, const std::string& name) {
  auto m = make_mlp();
  std::vector<at::Tensor> params;
  for (auto& p : m->parameters()) params.push_back(p);
  params.resize(4);  // fc1, fc2 (unused is not in the loss)
  volt::GradientReducer red(params, shared, opt);
  CHECK_TRUE(red.parameters().size() == 4, name + ": parameters");
  const size_t initial_buckets = red.bucket_buffers().size();
  for (int64_t step = 0; step < 3; ++step) {
    auto x = batch_for(pg.rank(), step);
    auto expected = mean_over_ranks(pg, local_grads(*m, params, x));
    red.backward(loss_of(*m, x));
    check_grads(red, params, expected, name + " step " + std::to_string(step));
    sgd_step(params, 0.1);
    reset_grads(params, /*keep_storage=*/step % 2 == 0);
  }
  say("rank " + std::to_string(pg.rank()) + ": reducer " + name + " ok (" +
      std::to_string(initial_buckets) + " buckets, " + std::to_string(red.bucket_buffers().size()) +
      " after the rebuild)");
}

// no_sync: gradients stay local while accumulating; the synced backward reduces the sum.
void reducer_no_sync(volt::ProcessGroup& pg, std::shared_ptr<volt::ProcessGroup> shared,
                     bool views) {
  auto m = make_mlp();
  std::vector<at::Tensor> params;
  for (auto& p : m->parameters()) params.push_back(p);
  params.resize(4);
  volt::GradientReducer red(params, shared,
                            volt::GradientReducerOptions().gradient_as_bucket_view(views));
  const std::string name = std::string("no_sync") + (views ? " (bucket views)" : "");
  for (int64_t round = 0; round < 2; ++round) {  // round 1 runs after the bucket rebuild
    auto xa = batch_for(pg.rank(), 10 + 2 * round), xb = batch_for(pg.rank(), 11 + 2 * round);
    auto ga = local_grads(*m, params, xa), gb = local_grads(*m, params, xb);
    {
      volt::NoSyncGuard guard(red);
      CHECK_TRUE(!red.sync(), name + ": guard turns sync off");
      red.backward(loss_of(*m, xa));
    }
    CHECK_TRUE(red.sync(), name + ": guard restores sync");
    for (size_t i = 0; i < params.size(); ++i) {
      check_close(params[i].grad(), ga[i], 1e-6, name + ": local grad after no_sync backward");
    }
    // The local gradients really differ across ranks (so the check above means something).
    auto spread = pg.all_reduce(params[0].grad(), volt::Reduce::kMax) -
                  pg.all_reduce(params[0].grad(), volt::Reduce::kMin);
    CHECK_TRUE(pg.world_size() == 1 || spread.abs().max().item<double>() > 1e-4,
               name + ": ranks' local gradients differ");
    red.backward(loss_of(*m, xb));
    std::vector<at::Tensor> acc;
    for (size_t i = 0; i < params.size(); ++i) acc.push_back(ga[i] + gb[i]);
    check_grads(red, params, mean_over_ranks(pg, acc), name + " synced sum");
    reset_grads(params, /*keep_storage=*/true);
  }
  say("rank " + std::to_string(pg.rank()) + ": reducer " + name + " ok");
}

// Tied weights: one tensor listed twice is reduced once; its gradient sums both uses.
void reducer_tied(volt::ProcessGroup& pg, std::shared_ptr<volt::ProcessGroup> shared) {
  torch::manual_seed(0);
  auto w = torch::randn({8, 8}, torch::requires_grad());
  auto bias = torch::randn({8}, torch::requires_grad());
  std::vector<at::Tensor> listed{w, bias, w};  // e.g. embedding and output layer sharing W
  volt::GradientReducer red(listed, shared);
  CHECK_TRUE(red.parameters().size() == 2, "tied: the shared weight appears once");
  auto loss_fn = [&](const at::Tensor& x) {
    return torch::tanh(at::matmul(torch::tanh(at::matmul(x, w.t()) + bias), w)).pow(2).mean();
  };
  auto x = batch_for(pg.rank(), 20);
  auto g = torch::autograd::grad({loss_fn(x)}, {w, bias});
  auto expected = mean_over_ranks(pg, {g[0], g[1]});
  red.backward(loss_fn(x));
  check_close(w.grad(), expected[0], 2e-6, "tied: weight grad");
  check_close(bias.grad(), expected[1], 2e-6, "tied: bias grad");
  say("rank " + std::to_string(pg.rank()) + ": reducer tied ok");
}

// A parameter outside the loss: without find_unused_parameters the step never finishes and the
// next one fails with volt's explanation; with it, used parameters are averaged.
void reducer_unused(volt::ProcessGroup& pg, std::shared_ptr<volt::ProcessGroup> shared) {
  {
    auto m = make_mlp();
    auto params = m->parameters();  // includes `unused`
    volt::GradientReducer red(params, shared,
                              volt::GradientReducerOptions().find_unused_parameters(true));
    for (int64_t step = 0; step < 2; ++step) {
      auto x = batch_for(pg.rank(), 30 + step);
      const bool use = step == 1;  // the used set changes between steps
      auto expected = mean_over_ranks(pg, local_grads(*m, params, x, use));
      red.backward(loss_of(*m, x, use));
      for (size_t i = 0; i < 4; ++i) {
        check_close(params[i].grad(), expected[i], 2e-6, "find_unused: used grad");
      }
      reset_grads(params, false);
    }
  }
  {
    auto m = make_mlp();
    volt::GradientReducer red(m->parameters(), shared);
    red.backward(loss_of(*m, batch_for(pg.rank(), 40)));
    expect_throw<volt::ValueError>([&] { red.backward(loss_of(*m, batch_for(pg.rank(), 41))); },
                                   "find_unused_parameters(true)", "unused without find_unused");
    expect_throw<volt::DistributedError>(
        [&] { red.backward(loss_of(*m, batch_for(pg.rank(), 42))); }, "earlier failure",
        "backward after a failure");
  }
  say("rank " + std::to_string(pg.rank()) + ": reducer find_unused ok");
}

// static_graph: the first step reduces after backward (delay_all_reduce), later ones overlap.
void reducer_static(volt::ProcessGroup& pg, std::shared_ptr<volt::ProcessGroup> shared) {
  auto m = make_mlp();
  std::vector<at::Tensor> params;
  for (auto& p : m->parameters()) params.push_back(p);
  params.resize(4);
  volt::GradientReducer red(params, shared, volt::GradientReducerOptions().static_graph(true));
  for (int64_t step = 0; step < 3; ++step) {
    auto x = batch_for(pg.rank(), 50 + step);
    auto expected = mean_over_ranks(pg, local_grads(*m, params, x));
    red.backward(loss_of(*m, x));
    check_grads(red, params, expected, "static_graph step " + std::to_string(step));
    reset_grads(params, false);
  }
  say("rank " + std::to_string(pg.rank()) + ": reducer static_graph ok");
}

// Data-parallel SGD over the ranks' shards equals one process training on the whole batch.
void reducer_matches_single_process(volt::ProcessGroup& pg,
                                    std::shared_ptr<volt::ProcessGroup> shared) {
  auto m = make_mlp(), ref = make_mlp();
  std::vector<at::Tensor> params, ref_params;
  for (auto& p : m->parameters()) params.push_back(p);
  for (auto& p : ref->parameters()) ref_params.push_back(p);
  params.resize(4);
  ref_params.resize(4);
  volt::GradientReducer red(params, shared, volt::GradientReducerOptions().bucket_cap_mb(0.0005));
  for (int64_t step = 0; step < 5; ++step) {
    red.backward(loss_of(*m, batch_for(pg.rank(), 60 + step)));
    sgd_step(params, 0.2);
    reset_grads(params, false);
    std::vector<at::Tensor> shards;
    for (int64_t q = 0; q < pg.world_size(); ++q) shards.push_back(batch_for(q, 60 + step));
    loss_of(*ref, at::cat(shards)).backward();  // equal shards: mean of means = global mean
    sgd_step(ref_params, 0.2);
    reset_grads(ref_params, false);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    check_close(params[i], ref_params[i], 1e-5, "weights vs single process");
  }
  auto flat = at::cat({params[0].detach().flatten(), params[2].detach().flatten()});
  auto all = pg.all_gather(flat);
  for (const auto& t : all) CHECK_TRUE(t.equal(flat), "weights identical on every rank");
  say("rank " + std::to_string(pg.rank()) + ": reducer matches single process");
}

// Different models on different ranks fail at construction, naming the mismatch.
void reducer_model_mismatch(volt::ProcessGroup& pg, std::shared_ptr<volt::ProcessGroup> shared) {
  auto m = make_mlp(pg.rank() == 0 ? 16 : 17);
  expect_throw<volt::ConfigError>([&] { volt::GradientReducer red(m->parameters(), shared); },
                                  "the model differs across ranks", "model mismatch");
  say("rank " + std::to_string(pg.rank()) + ": reducer model mismatch detected");
}

void run_reducer(std::shared_ptr<volt::ProcessGroup> shared) {
  auto& pg = *shared;
  reducer_averages(pg, shared, volt::GradientReducerOptions(), "default");
  reducer_averages(pg, shared, volt::GradientReducerOptions().gradient_as_bucket_view(true),
                   "bucket views");
  // 0.0005 MiB = 524 bytes: one bucket per parameter or so.
  reducer_averages(pg, shared, volt::GradientReducerOptions().bucket_cap_mb(0.0005),
                   "small buckets");
  reducer_averages(
      pg, shared,
      volt::GradientReducerOptions().bucket_cap_mb(0.0005).gradient_as_bucket_view(true),
      "small buckets with views");
  reducer_no_sync(pg, shared, false);
  reducer_no_sync(pg, shared, true);
  reducer_tied(pg, shared);
  reducer_unused(pg, shared);
  reducer_static(pg, shared);
  reducer_matches_single_process(pg, shared);
  reducer_model_mismatch(pg, shared);
}

// ---------------------------------------------------------------------------- zero-masters

// ZeroEngine's master weights at two ranks, bucket by bucket (allgather_bucket_size 1: one
// parameter per all-gather): the last bias has one element, so rank 1 owns none of it.
// write_master_weights() with the module still bf16 must send the masters' dtype from both
// ranks (rank 1 has no master of that bias to take it from) and leave every rank with the
// masters rounded, which is what gather_parameters() had written.
void run_zero_masters(const std::shared_ptr<volt::ProcessGroup>& pg) {
  torch::manual_seed(7);
  torch::nn::Sequential net(torch::nn::Linear(6, 8), torch::nn::ReLU(), torch::nn::Linear(8, 1));
  net->to(torch::kBFloat16);
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& p : net->named_parameters()) names[p.value().unsafeGetTensorImpl()] = p.key();
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-2));
  volt::ZeroEngine engine(opt, pg, volt::ZeroEngineOptions().stage(2).allgather_bucket_size(1),
                          names);
  const auto& bias = engine.chunks().back();
  CHECK_TRUE(bias.numel == 1 && bias.length == (pg->rank() == 0 ? 1 : 0), "the last bias");
  torch::manual_seed(100 + pg->rank());
  const at::Tensor x = torch::randn({4, 6}).to(torch::kBFloat16);
  engine.zero_grad();
  at::Tensor loss = net->forward(x).to(torch::kFloat).pow(2).sum();
  engine.backward([&] { loss.backward(); }, /*sync=*/true);
  engine.prepare_step();
  opt.step();
  engine.gather_parameters();
  std::vector<at::Tensor> stepped;
  for (const auto& p : net->parameters()) stepped.push_back(p.detach().clone());
  engine.write_master_weights();
  const auto params = net->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    CHECK_TRUE(params[i].scalar_type() == torch::kBFloat16, "the module stays bf16");
    CHECK_TRUE(
        torch::equal(params[i], stepped[i]),
        "write_master_weights rounds the masters as the step did: " + engine.chunks()[i].name);
  }
  const auto all = pg->all_gather(
      torch::cat({params[0].reshape({-1}), params[3].reshape({-1})}).to(torch::kFloat));
  CHECK_TRUE(torch::equal(all[0], all[1]), "both ranks hold the same weights");
  say("rank " + std::to_string(pg->rank()) + ": zero masters ok");
}

// ---------------------------------------------------------------------------- zero-resync

// Several backwards in one window, some synced (manual_backward syncs every one): each rank's
// chunk of each gradient must be the average over the ranks of the sum of its backwards, at
// every stage. Stage 1 reduced the mix a synced backward leaves (the averaged chunk beside this
// rank's own gradient) again and got a wrong chunk.
void run_zero_resync(const std::shared_ptr<volt::ProcessGroup>& pg) {
  const std::vector<std::vector<bool>> patterns = {
      {true, true}, {true, false, true}, {false, true}};
  for (int64_t stage : {1, 2}) {
    for (const auto& syncs : patterns) {
      torch::manual_seed(7);
      torch::nn::Sequential net(torch::nn::Linear(6, 5), torch::nn::Tanh(),
                                torch::nn::Linear(5, 3));
      torch::nn::Sequential ref(torch::nn::Linear(6, 5), torch::nn::Tanh(),
                                torch::nn::Linear(5, 3));
      {
        torch::NoGradGuard g;
        for (size_t i = 0; i < net->parameters().size(); ++i) {
          ref->parameters()[i].copy_(net->parameters()[i]);
        }
      }
      std::map<const c10::TensorImpl*, std::string> names;
      for (const auto& p : net->named_parameters())
        names[p.value().unsafeGetTensorImpl()] = p.key();
      torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
      volt::ZeroEngine engine(opt, pg, volt::ZeroEngineOptions().stage(stage), names);
      engine.zero_grad();
      for (size_t k = 0; k < syncs.size(); ++k) {
        torch::manual_seed(1000 + 10 * pg->rank() + static_cast<int64_t>(k));
        const at::Tensor x = torch::randn({4, 6});
        at::Tensor loss = net->forward(x).pow(2).sum();
        engine.backward([&] { loss.backward(); }, syncs[k]);
        ref->forward(x).pow(2).sum().backward();  // this rank's own gradients, summed
      }
      const auto params = ref->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        const auto& c = engine.chunks()[i];
        if (c.length == 0) continue;
        const at::Tensor mean =
            pg->all_reduce(params[i].grad().clone(), volt::Reduce::kSum) / pg->world_size();
        check_close(c.view.grad(), mean.view({-1}).narrow(0, c.start, c.length), 1e-6,
                    "stage " + std::to_string(stage) + ", " + std::to_string(syncs.size()) +
                        " backwards: the chunk of " + c.name);
      }
    }
  }
  say("rank " + std::to_string(pg->rank()) + ": zero resync ok");
}

// ---------------------------------------------------------------------------- tp-train
// Tensor-parallel training (TensorParallelEngine with autograd): every rank holds the same data
// and a split model; each step's loss, gradient norm and input gradient, and the weights after
// the steps, equal one process training the whole model (built alike here on every rank).

// A small language-model block: vocabulary-split embedding, packed q/k/v (heads split), a
// row-parallel projection and a column/row MLP, LayerNorms and the head whole. The attention
// computes the heads it is given (q's features / head_dim), as a tensor-parallel model must.
struct TinyLmImpl : torch::nn::Module {
  TinyLmImpl() {
    embed = register_module("embed", torch::nn::Embedding(40, 32));
    norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({32})));
    qkv = register_module("qkv", torch::nn::Linear(32, 96));
    proj = register_module("proj", torch::nn::Linear(32, 32));
    norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({32})));
    l1 = register_module("l1", torch::nn::Linear(32, 64));
    l2 = register_module("l2", torch::nn::Linear(64, 32));
    head = register_module("head", torch::nn::Linear(32, 5));
  }
  at::Tensor forward(const at::Tensor& ids) {
    at::Tensor h = embed->forward(ids);  // [B, T, 32]
    const auto parts = qkv->forward(norm1->forward(h)).chunk(3, -1);
    const int64_t b = ids.size(0), t = ids.size(1), dh = 8, heads = parts[0].size(-1) / dh;
    auto split = [&](const at::Tensor& z) { return z.reshape({b, t, heads, dh}).transpose(1, 2); };
    const at::Tensor q = split(parts[0]), k = split(parts[1]), v = split(parts[2]);
    const at::Tensor att = torch::softmax(q.matmul(k.transpose(-2, -1)) / std::sqrt(8.0), -1);
    h = h + proj->forward(att.matmul(v).transpose(1, 2).reshape({b, t, heads * dh}));
    h = h + l2->forward(torch::gelu(l1->forward(norm2->forward(h))));
    return head->forward(h.mean(1));
  }
  torch::nn::Embedding embed{nullptr};
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, l1{nullptr}, l2{nullptr}, head{nullptr};
};
TORCH_MODULE(TinyLm);

// A vocabulary-split Embedding with a padding row in the last rank's shard (libtorch checks the
// row against the weight it is given, a shard: before, every forward failed) and one with
// max_norm (refused: libtorch renormalises rows by id on the shard).
struct PaddedEmbeddingImpl : torch::nn::Module {
  explicit PaddedEmbeddingImpl(double max_norm = 0) {
    auto o = torch::nn::EmbeddingOptions(40, 8).padding_idx(-1);  // row 39
    if (max_norm > 0) o.max_norm(max_norm);
    embed = register_module("embed", torch::nn::Embedding(o));
    head = register_module("head", torch::nn::Linear(8, 3));
  }
  at::Tensor forward(const at::Tensor& ids) { return head->forward(embed->forward(ids).mean(1)); }
  torch::nn::Embedding embed{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(PaddedEmbedding);

// The MLP's split layers inside activation checkpointing: backward recomputes them, and the
// recomputation must run as the forward did (the row-parallel sums over the group).
struct CheckpointedMlpImpl : torch::nn::Module {
  CheckpointedMlpImpl() {
    body =
        register_module("body", torch::nn::Sequential(torch::nn::Linear(12, 16), torch::nn::Tanh(),
                                                      torch::nn::Linear(16, 8), torch::nn::Tanh()));
    out = register_module("out", torch::nn::Linear(8, 4));
  }
  at::Tensor forward(const at::Tensor& x) {
    return out->forward(
        volt::checkpoint([this](const at::Tensor& t) { return body->forward(t); }, x));
  }
  torch::nn::Sequential body{nullptr};
  torch::nn::Linear out{nullptr};
};
TORCH_MODULE(CheckpointedMlp);

template <typename Make, typename Batch, typename Loss>
void tp_train_case(const std::shared_ptr<volt::ProcessGroup>& pg, const std::string& what,
                   Make make, const std::vector<std::string>& plan, Batch batch, Loss loss_of,
                   bool input_grad) {
  const int64_t tp = pg->world_size();
  auto ref = make(), net = make();
  volt::TensorParallelEngine engine(
      *net, pg,
      volt::TensorParallelOptions().tp_size(tp).plan(volt::parse_tp_plan(plan)).num_heads(4));
  // Built after the split: the momentum buffers have the shards' shapes.
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const double max_norm = 0.5;
  bool clipped = false;
  for (int step = 0; step < 4; ++step) {
    auto [x, y] = batch(step);
    at::Tensor rx = x.clone(), tx = x.clone();
    if (input_grad) {
      rx.requires_grad_(true);
      tx.requires_grad_(true);
    }
    ref_opt.zero_grad();
    const at::Tensor ref_loss = loss_of(ref->forward(rx), y);
    ref_loss.backward();
    const double ref_norm = torch::nn::utils::clip_grad_norm_(ref->parameters(), max_norm);
    ref_opt.step();

    opt.zero_grad();
    at::Tensor loss;
    {
      volt::TensorParallelEngine::Scope scope(engine);
      loss = loss_of(net->forward(tx), y);
    }
    loss.backward();
    const double norm = engine.clip_grad_norm_(net->parameters(), max_norm);
    opt.step();

    const std::string at_step = what + " step " + std::to_string(step);
    check_close(loss.detach(), ref_loss.detach(), 1e-5, at_step + " loss");
    CHECK_TRUE(std::abs(norm - ref_norm) <= 1e-5 * std::max(1.0, ref_norm),
               at_step + " gradient norm " + std::to_string(norm) + " vs one process's " +
                   std::to_string(ref_norm));
    clipped = clipped || ref_norm > max_norm;
    if (input_grad) check_close(tx.grad(), rx.grad(), 1e-6, at_step + " input gradient");
  }
  CHECK_TRUE(clipped, what + ": the norm exceeded max_norm at least once (clipping ran)");
  // Every rank trained only its shards; whole again, they are one process's weights.
  engine.restore();
  const auto ref_params = ref->named_parameters(), params = net->named_parameters();
  for (const auto& p : ref_params) {
    check_close(params[p.key()], p.value(), 1e-5, what + " weight " + p.key());
  }
  say("rank " + std::to_string(pg->rank()) + ": tp-train " + what + " ok (" +
      std::to_string(engine.layers().size()) + " layers split)");
}

// SplitRegionRng: inside a split Scope each rank draws masks of its own, outside the guard the
// ranks draw alike and their shared streams stay in step; without a Scope the guard does
// nothing; activation checkpointing recomputes the split masks the forward drew.
void tp_rng_case(const std::shared_ptr<volt::ProcessGroup>& pg) {
  const int64_t tp = pg->world_size();
  torch::manual_seed(21);  // the same stream on every rank
  torch::nn::Linear col(6, 16), row(16, 6);
  torch::nn::Sequential net(col, row);
  volt::TensorParallelEngine engine(*net, pg,
                                    volt::TensorParallelOptions().tp_size(tp).plan(
                                        volt::parse_tp_plan({"0=colwise", "1=rowwise"})));
  auto differs = [&](const at::Tensor& t) {  // whether any two ranks' t differ
    const auto all = pg->all_gather(t.contiguous());
    bool any = false;
    for (const auto& other : all) any = any || !torch::equal(other, all[0]);
    return any;
  };
  auto shared_state = [] { return at::Tensor(at::detail::getDefaultCPUGenerator().get_state()); };
  {
    volt::TensorParallelEngine::Scope scope(engine);
    at::Tensor split_mask;
    {
      volt::SplitRegionRng split_rng;
      split_mask = torch::dropout(torch::ones({64, 16 / tp}), 0.5, true);
    }
    const at::Tensor whole_mask = torch::dropout(torch::ones({64, 16}), 0.5, true);
    CHECK_TRUE(differs(split_mask), "inside SplitRegionRng the ranks draw different masks");
    CHECK_TRUE(!differs(whole_mask), "outside it the ranks draw the same mask");
    CHECK_TRUE(!differs(shared_state()), "the shared streams stay in step across the ranks");
  }
  {
    const at::Tensor before = shared_state();
    at::Tensor guarded;
    {
      volt::SplitRegionRng split_rng;
      guarded = torch::rand({8});
    }
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    gen.set_state(before);
    CHECK_TRUE(torch::equal(guarded, torch::rand({8})),
               "without a Scope the guard draws from the shared stream");
  }
  auto block = [&](const at::Tensor& x) {
    at::Tensor h = col->forward(x);  // this rank's features
    {
      volt::SplitRegionRng split_rng;
      h = torch::dropout(h, 0.5, true);
    }
    return row->forward(h);  // summed over the ranks
  };
  auto grads = [&](bool checkpointed) {
    torch::manual_seed(33);
    net->zero_grad();
    const at::Tensor x = torch::randn({5, 6}).requires_grad_(true);
    at::Tensor y;
    {
      volt::TensorParallelEngine::Scope scope(engine);
      y = checkpointed ? volt::checkpoint(block, x) : block(x);
    }
    y.pow(2).sum().backward();
    std::vector<at::Tensor> g{x.grad().clone()};
    for (const auto& p : net->parameters()) g.push_back(p.grad().clone());
    return g;
  };
  const auto plain = grads(false), checkpointed = grads(true);
  for (size_t i = 0; i < plain.size(); ++i) {
    CHECK_TRUE(torch::equal(plain[i], checkpointed[i]),
               "gradient " + std::to_string(i) + " through recomputed split masks");
  }
  say("rank " + std::to_string(pg->rank()) + ": tp-train rng ok");
}

void run_tp_train(const std::shared_ptr<volt::ProcessGroup>& pg) {
  // An MLP: the first layer's input gradient goes through "f", the chain colwise -> rowwise,
  // and a row-parallel layer taking a whole input (each rank its slice).
  tp_train_case(
      pg, "mlp",
      [] {
        torch::manual_seed(11);
        return torch::nn::Sequential(torch::nn::Linear(12, 16), torch::nn::Tanh(),
                                     torch::nn::Linear(16, 8), torch::nn::Tanh(),
                                     torch::nn::Linear(8, 4));
      },
      {"0=colwise", "2=rowwise", "4=rowwise"},
      [](int step) {
        torch::manual_seed(100 + step);
        return std::make_pair(torch::randn({6, 12}), torch::randn({6, 4}));
      },
      [](const at::Tensor& out, const at::Tensor& y) { return (out - y).pow(2).mean(); },
      /*input_grad=*/true);
  tp_train_case(
      pg, "checkpointed",
      [] {
        torch::manual_seed(14);
        return CheckpointedMlp();
      },
      {"body.0=colwise", "body.2=rowwise"},
      [](int step) {
        torch::manual_seed(300 + step);
        return std::make_pair(torch::randn({6, 12}), torch::randn({6, 4}));
      },
      [](const at::Tensor& out, const at::Tensor& y) { return (out - y).pow(2).mean(); },
      /*input_grad=*/true);
  tp_train_case(
      pg, "lm",
      [] {
        torch::manual_seed(12);
        return TinyLm();
      },
      {"embed=rowwise", "qkv=colwise_qkv", "proj=rowwise", "l1=colwise", "l2=rowwise"},
      [](int step) {
        torch::manual_seed(200 + step);
        return std::make_pair(torch::randint(0, 40, {3, 7}), torch::randint(0, 5, {3}));
      },
      [](const at::Tensor& out, const at::Tensor& y) {
        return torch::nn::functional::cross_entropy(out, y);
      },
      /*input_grad=*/false);

  tp_train_case(
      pg, "padded",
      [] {
        torch::manual_seed(15);
        return PaddedEmbedding();
      },
      {"embed=rowwise"},
      [](int step) {
        torch::manual_seed(400 + step);
        at::Tensor ids = torch::randint(0, 40, {4, 6});
        ids.select(1, 0).fill_(39);  // the padding row in every sequence
        return std::make_pair(ids, torch::randint(0, 3, {4}));
      },
      [](const at::Tensor& out, const at::Tensor& y) {
        return torch::nn::functional::cross_entropy(out, y);
      },
      /*input_grad=*/false);
  {
    PaddedEmbedding padded;
    {
      volt::TensorParallelEngine split(*padded, pg,
                                       volt::TensorParallelOptions()
                                           .tp_size(pg->world_size())
                                           .plan(volt::parse_tp_plan({"embed=rowwise"})));
      CHECK_TRUE(padded->embed->weight.size(0) == 40 / pg->world_size(), "the rows are split");
      split.restore();
    }
    CHECK_TRUE(padded->embed->options.padding_idx() == c10::optional<int64_t>(39),
               "restore() puts the padding row back");
    PaddedEmbedding normed(1.0);
    expect_throw<volt::ConfigError>(
        [&] {
          volt::TensorParallelEngine e(*normed, pg,
                                       volt::TensorParallelOptions()
                                           .tp_size(pg->world_size())
                                           .plan(volt::parse_tp_plan({"embed=rowwise"})));
        },
        "max_norm", "splitting an Embedding with max_norm");
  }

  // Under bf16 autocast a row-parallel Linear returns the dtype the whole one returns (before,
  // its fp32 bias promoted the bf16 sum to fp32), with and without autograd recording.
  for (const bool grad : {true, false}) {
    torch::manual_seed(16);
    torch::nn::Linear whole(16, 8);
    torch::manual_seed(16);
    torch::nn::Sequential split(torch::nn::Linear(16, 8));
    volt::TensorParallelEngine e(*split, pg,
                                 volt::TensorParallelOptions()
                                     .tp_size(pg->world_size())
                                     .plan(volt::parse_tp_plan({"0=rowwise"})));
    torch::manual_seed(17);
    const at::Tensor x = torch::randn({4, 16});
    torch::AutoGradMode mode(grad);
    volt::AutocastGuard bf16(c10::kCPU);
    const at::Tensor want = whole->forward(x);
    at::Tensor got;
    {
      volt::TensorParallelEngine::Scope scope(e);
      got = split->forward(x);
    }
    CHECK_TRUE(want.scalar_type() == at::kBFloat16 && got.scalar_type() == want.scalar_type(),
               std::string("a row-parallel Linear under bf16 autocast gives bf16") +
                   (grad ? " (recording)" : " (no grad)"));
    check_close(got.to(at::kFloat), want.to(at::kFloat), 0.05, "its bf16 output");
  }

  // A vocabulary-split Embedding cannot count frequencies across ranks: a ValueError when it
  // would train, while inference still works.
  torch::manual_seed(13);
  torch::nn::Sequential freq(
      torch::nn::Embedding(torch::nn::EmbeddingOptions(8, 4).scale_grad_by_freq(true)));
  volt::TensorParallelEngine engine(*freq, pg,
                                    volt::TensorParallelOptions()
                                        .tp_size(pg->world_size())
                                        .plan(volt::parse_tp_plan({"0=rowwise"})));
  const auto ids = torch::tensor({1, 6, 3}, torch::kLong);
  volt::TensorParallelEngine::Scope scope(engine);
  expect_throw<volt::ValueError>([&] { freq->forward(ids); }, "scale_grad_by_freq",
                                 "training a split Embedding with scale_grad_by_freq");
  {
    torch::NoGradGuard no_grad;
    CHECK_TRUE(freq->forward(ids).sizes() == at::IntArrayRef({3, 4}), "inference still works");
  }
  say("rank " + std::to_string(pg->rank()) + ": tp-train errors ok");
}

// ---------------------------------------------------------------------------- main

Args parse(int argc, char** argv) {
  Args a;
  if (argc < 2) fail("usage: volt_dist_worker SCENARIO [options]");
  a.scenario = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--devices")
      a.devices = std::stoll(v);
    else if (k == "--nodes")
      a.nodes = std::stoll(v);
    else if (k == "--timeout-ms")
      a.timeout_ms = std::stoll(v);
    else if (k == "--victim")
      a.victim = std::stoll(v);
    else if (k == "--config-hash")
      a.config_hash = v;
    else
      fail("unknown option " + k);
  }
  return a;
}

// The names in a /proc folder (thread ids, descriptors; the listing's own descriptor among them).
std::set<std::string> proc_entries(const char* dir) {
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.insert(e.path().filename());
  return names;
}

// The processes whose parent is this one, zombies included.
std::vector<int> children_of_this_process() {
  std::vector<int> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    std::istringstream rest(line.substr(line.rfind(')') + 2));  // after "pid (comm) "
    char state = 0;
    int ppid = 0;
    rest >> state >> ppid;
    if (ppid == ::getpid()) out.push_back(std::stoi(name));
  }
  return out;
}

// A launcher whose constructor fails after starting a worker (this process may open one more
// descriptor: the launcher's eventfd takes it, the worker's pidfd finds none) throws
// NotAvailable and leaves nothing behind: no worker (not even a zombie), no thread, no
// descriptor, and it does not wait for a worker it cannot watch.
int start_fails(volt::ClusterEnvironment env) {
  // A port of its own, so that the launcher opens no socket to pick one (nothing listens on it:
  // this process makes no group, its worker is killed at once).
  env.main_port = 29500;
  const auto threads = proc_entries("/proc/self/task"), fds = proc_entries("/proc/self/fd");
  rlimit old{};
  CHECK_TRUE(::getrlimit(RLIMIT_NOFILE, &old) == 0, "getrlimit");
  rlim_t limit = 0;
  for (int free_slots = 0; free_slots < 1; ++limit) {
    if (::fcntl(static_cast<int>(limit), F_GETFD) < 0) ++free_slots;
  }
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  rlimit tight = old;
  tight.rlim_cur = limit;
  CHECK_TRUE(::setrlimit(RLIMIT_NOFILE, &tight) == 0, "setrlimit");
  try {
    volt::LocalLauncher launcher(env);
  } catch (const volt::NotAvailable& e) {
    error = e.what();
  }
  CHECK_TRUE(::setrlimit(RLIMIT_NOFILE, &old) == 0, "setrlimit back");
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  say("launcher: " + (error.empty() ? std::string("no error") : error));
  CHECK_TRUE(error.find("[LocalLauncher] cannot start the local workers: pidfd_open failed") !=
                 std::string::npos,
             "the constructor's error");
  CHECK_TRUE(took < 5.0, "the failed start took " + std::to_string(took) + " s");
  CHECK_TRUE(children_of_this_process().empty(), "no worker left, not even a zombie");
  // No thread of its own (one of libtorch's start-up may have ended meanwhile), and the same
  // descriptors (the listing's own is a new one each time: one may differ).
  for (const auto& t : proc_entries("/proc/self/task")) {
    CHECK_TRUE(threads.count(t) == 1, "no thread left: " + t + " is new");
  }
  std::vector<std::string> fd_change;
  const auto fds_after = proc_entries("/proc/self/fd");
  std::set_symmetric_difference(fds.begin(), fds.end(), fds_after.begin(), fds_after.end(),
                                std::back_inserter(fd_change));
  CHECK_TRUE(fd_change.size() <= 2 && fds.size() == fds_after.size(), "no descriptor left");
  say("launcher: a failed start left nothing behind");
  return 0;
}

int run(const Args& a) {
  auto env = volt::detect_cluster_environment(volt::process_env(), a.devices, a.nodes);
  if (a.scenario == "start-fails") return start_fails(env);
  std::unique_ptr<volt::LocalLauncher> launcher;
  if (env.launches_workers) {
    launcher = std::make_unique<volt::LocalLauncher>(env);
    env = launcher->environment();
    std::string pids;
    for (int p : launcher->pids()) pids += (pids.empty() ? "" : ",") + std::to_string(p);
    say("launcher: pid " + std::to_string(::getpid()) + " started workers " + pids);
    // The DdpStrategy wiring: a worker's death is written to the store, so that every rank's
    // failing collective names it.
    const auto timeout = milliseconds(a.timeout_ms);
    launcher->on_failure([env, timeout](const volt::WorkerExit& e) {
      say("launcher: lost " + e.describe());
      volt::report_lost_rank(env, e.describe(), timeout);
    });
  }
  g_rank = static_cast<int>(env.global_rank);
  say("rank " + std::to_string(env.global_rank) + ": pid " + std::to_string(::getpid()) + " " +
      volt::to_string(env.kind) + " local " + std::to_string(env.local_rank) + " node " +
      std::to_string(env.node_rank) + (env.launched_child ? " launched" : ""));
  if (a.scenario == "orphan" || a.scenario == "reap") {
    if (launcher && a.scenario == "reap") {
      auto pids = launcher->pids();
      launcher->kill_all();
      auto exits = launcher->exits();
      CHECK_TRUE(exits.size() == pids.size(), "every worker recorded");
      for (const auto& e : exits) CHECK_TRUE(e.signaled && e.code == SIGKILL, e.describe());
      CHECK_TRUE(!launcher->wait_for_failure(milliseconds(0)),
                 "workers killed by the launcher are no failure");
      launcher.reset();
      for (int p : pids) {
        CHECK_TRUE(::kill(p, 0) != 0 && errno == ESRCH, "worker " + std::to_string(p) + " gone");
      }
      say("launcher: reaped all workers");
      return 0;
    }
    say("rank " + std::to_string(env.global_rank) + ": waiting");
    ::pause();  // until killed
    return 0;
  }
  auto options =
      volt::ProcessGroupOptions().timeout(milliseconds(a.timeout_ms)).config_hash(a.config_hash);
  std::shared_ptr<volt::ProcessGroup> pg;
  try {
    pg = std::make_shared<volt::ProcessGroup>(env, options);
  } catch (const volt::Error& e) {
    say("rank " + std::to_string(env.global_rank) + ": error: " + e.what());
    if (launcher) launcher->wait_all(milliseconds(a.timeout_ms));
    return 3;
  }
  if (a.scenario == "collectives") {
    run_collectives(*pg);
  } else if (a.scenario == "reducer") {
    run_reducer(pg);
  } else if (a.scenario == "call-checks") {
    run_call_checks(pg);
  } else if (a.scenario == "leaders") {
    run_leaders(pg, milliseconds(a.timeout_ms));
  } else if (a.scenario == "zero-masters") {
    run_zero_masters(pg);
  } else if (a.scenario == "zero-resync") {
    run_zero_resync(pg);
  } else if (a.scenario == "tp-train") {
    run_tp_train(pg);
    tp_rng_case(pg);
  } else if (a.scenario == "hold") {
    if (env.global_rank == a.victim) {
      say("rank " + std::to_string(env.global_rank) + ": victim waiting");
      ::pause();
    }
    say("rank " + std::to_string(env.global_rank) + ": entering all_reduce");
    try {
      pg->all_reduce(at::ones({4}));
      fail("all_reduce without the victim succeeded");
    } catch (const volt::DistributedError& e) {
      say("rank " + std::to_string(env.global_rank) + ": error: " + e.what());
      // Let the workers report their own errors before the launcher kills what is left.
      if (launcher) launcher->wait_all(milliseconds(a.timeout_ms));
      return 3;
    }
  } else {
    fail("unknown scenario " + a.scenario);
  }
  if (launcher) {
    CHECK_TRUE(launcher->wait_all(milliseconds(a.timeout_ms)), "workers end");
    for (const auto& e : launcher->exits()) CHECK_TRUE(e.ok(), "worker ok: " + e.describe());
    say("launcher: all " + std::to_string(launcher->exits().size()) + " workers exited 0");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  try {
    return run(a);
  } catch (const std::exception& e) {
    say("rank " + std::to_string(g_rank) + ": unexpected exception: " + e.what());
    return 1;
  }
}
