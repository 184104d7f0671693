// DdpStrategy on this machine's CPUs (issue #9): weak scaling, the bucket size and
// gradient_as_bucket_view sweep, and how much of the gradient all-reduce hides behind backward;
// and DeepSpeedStrategy's ZeRO stages against DDP at the same world size (issue #12): step time,
// peak RSS and the exact per-rank bytes of parameters, gradients and Adam state; and the stages at
// one rank against the single-device fit (`zero_alone`).
//
//   volt_bench_ddp [--rounds R] [--steps S] [--width H] [--batch B]
//                  [--only weak|sweep|overlap|static|sync_bn|zero|zero_alone|offload|
//                          zero_overlap|master|
//                          host_memory|stop_vote|skip_vote|collectives]
//                  [--nvme DIR]
//
// `zero_overlap`: stages 2 and 3 at 2 ranks with 2 MB gradient buckets, each bucket's reduction
// blocking backward or overlapped with it (overlap_comm), and stage 3 with and without the
// prefetch of the next modules' parameters. `master`: stage 2 at 2 ranks, Adam, fp32 against
// bf16-mixed with fp32 master weights (BF16Optimizer), without, and with the masters on NVMe.
//
// `offload`: ZeRO stage 3 at 2 ranks with the Adam state in memory, offloaded to "cpu" (on a
// CPU run nothing moves) and to NVMe swap files under --nvme (default /tmp: whatever disk backs
// it), through io_uring and through the pread/pwrite reference path; `nvme_params`: the
// parameter chunks on NVMe, the state in memory; `nvme_all`: both on NVMe (ZeRO-Infinity, issue
// #12), with the parameter bytes in RAM at once during the step; then a deeper MLP (8 hidden
// layers of 1024) with the parameter chunks stepping in one sub-group against sub-groups of 6e5
// elements, for both.
//
// `host_memory`: TrainerOptions::reuse_host_memory on and off (the C library's malloc keeping
// freed blocks or returning them to the kernel), with rank 0's page faults per step.
//
// `sync_bn`: TrainerOptions::sync_batchnorm at 2 ranks (BatchNorm over the global batch) against
// BatchNorm on each rank's share and against the same MLP without BatchNorm.
//
// `stop_vote`: the per-batch agreement on stop requests (DdpStrategy::agree_on_stop, an
// all-gather of three ints overlapped with the next batch) against a DdpStrategy whose vote is
// removed, at 2 ranks on a small MLP (784-256-256-10), where a fixed cost per step shows most.
//
// `skip_vote`: Module::set_may_skip_rest_of_epoch(true) (the ranks agree on
// skip_rest_of_epoch() at every batch: one blocking all-reduce of a flag; the module never skips
// here) against the same module without it, same model and ranks as `stop_vote`.
//
// `collectives` (only when asked for): the reduce-scatter ZeRO's gradient buckets use (one
// all-to-all and a local sum) against the all-reduce of the whole bucket it replaced, at 2 and 4
// ranks, for fp32 and bf16 buckets of 64 k to 16 M elements.
//
// The driver runs every configuration as a fresh job of this same binary (`--worker ...`), with
// OPENBLAS_NUM_THREADS=1 so that "1 thread" holds for OpenBLAS too; with devices=2 the job's
// launching process is rank 0 and starts rank 1 itself, as a user's program would. Each rank
// prints one RESULT line; the driver keeps rank 0's step time and the larger peak RSS.
//
// Model: a compute-bound MLP 784 -> H -> H -> 10 (H = 2048: 5.8 M parameters, 23 MB of
// gradients) on synthetic data, SGD with momentum, per-rank batch B (weak scaling).

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <torch/nn/modules/container/modulelist.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <volt/distributed/cluster_environment.h>
#include <volt/distributed/local_launcher.h>
#include <volt/distributed/process_group.h>
#include <volt/strategies/deepspeed.h>
#include <volt/volt.h>

#include "timing.h"

namespace {

using volt_bench::median;

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

long minor_faults() {
  struct rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

struct Mlp : torch::nn::Module {
  // `hidden` width x width layers (fc2, then more.0, more.1, ...); with `batchnorm` a
  // BatchNorm1d after each hidden Linear (fc1 included).
  Mlp(int64_t width, int64_t hidden, bool batchnorm = false)
      : fc1(register_module("fc1", torch::nn::Linear(784, width))),
        fc2(register_module("fc2", torch::nn::Linear(width, width))),
        fc3(register_module("fc3", torch::nn::Linear(width, 10))) {
    if (hidden > 1) {
      more = register_module("more", torch::nn::ModuleList());
      for (int64_t i = 1; i < hidden; ++i) more->push_back(torch::nn::Linear(width, width));
    }
    if (batchnorm) {
      norms = register_module("norms", torch::nn::ModuleList());
      for (int64_t i = 0; i <= hidden; ++i) norms->push_back(torch::nn::BatchNorm1d(width));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    size_t layer = 0;
    auto norm = [&](torch::Tensor h) {
      return norms ? norms[layer++]->as<torch::nn::BatchNorm1d>()->forward(h) : h;
    };
    x = torch::relu(norm(fc2(torch::relu(norm(fc1(x))))));
    if (more) {
      for (const auto& m : *more) x = torch::relu(norm(m->as<torch::nn::Linear>()->forward(x)));
    }
    return fc3(x);
  }
  torch::nn::Linear fc1, fc2, fc3;
  torch::nn::ModuleList more{nullptr}, norms{nullptr};
};

class BenchModule : public volt::Module {
 public:
  BenchModule(int64_t width, int64_t hidden, bool adam, bool batchnorm = false)
      : adam_(adam),
        net_(register_module("net", std::make_shared<Mlp>(width, hidden, batchnorm))) {}
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    return torch::cross_entropy_loss(net_->forward(b.input), b.target);
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    if (adam_)
      opt = std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-3));
    else
      opt = std::make_shared<torch::optim::SGD>(parameters(),
                                                torch::optim::SGDOptions(0.01).momentum(0.9));
    return {volt::OptimizerConfig(opt)};
  }
  std::shared_ptr<torch::optim::Optimizer> opt;

 private:
  bool adam_;
  std::shared_ptr<Mlp> net_;
};

/// The ZeRO engine's exact per-rank bytes during training (stage 3's teardown gathers the
/// parameters back afterwards).
class ZeroBytes : public volt::Callback {
 public:
  ZeroBytes(volt::DeepSpeedStrategy* s, BenchModule* m) : s_(s), m_(m) {}
  std::string state_key() const override { return "ZeroBytes"; }
  // Before each step: gradients complete, Adam state present from the second step on.
  void on_before_optimizer_step(volt::RunContext&, volt::Module&,
                                torch::optim::Optimizer&) override {
    const volt::ZeroEngine* e = m_->opt ? s_->engine(*m_->opt) : nullptr;
    if (e == nullptr) return;
    bytes = s_->memory(*m_->opt);
    // Parameter chunks in RAM at once during the previous step (NVMe parameters).
    step_peak = e->comm_stats().step_chunk_peak * 4;
  }
  volt::ZeroMemory bytes;
  int64_t step_peak = 0;

 private:
  volt::DeepSpeedStrategy* s_;
  BenchModule* m_;
};

/// Step times after the warm-up, and backward times split by whether the micro-batch
/// all-reduced its gradients (accumulate_grad_batches > 1 alternates the two).
class Timing : public volt::Callback {
 public:
  Timing(int64_t warmup, int64_t accum) : warmup_(warmup), accum_(accum) {}
  std::string state_key() const override { return "Timing"; }
  void on_train_batch_start(volt::RunContext&, volt::Module&, const volt::Batch&,
                            int64_t batch_idx) override {
    batch_idx_ = batch_idx;
    batch_start_ = Clock::now();
  }
  void on_before_backward(volt::RunContext&, volt::Module&, const at::Tensor&) override {
    backward_start_ = Clock::now();
  }
  void on_after_backward(volt::RunContext& run, volt::Module&) override {
    if (run.state().global_step < warmup_) return;
    const bool syncs = (batch_idx_ + 1) % accum_ == 0;
    (syncs ? backward_sync_ms : backward_nosync_ms).push_back(ms_since(backward_start_));
  }
  void on_train_batch_end(volt::RunContext& run, volt::Module&, const volt::Batch&,
                          int64_t) override {
    if (run.state().global_step > warmup_) batch_ms.push_back(ms_since(batch_start_));
    // Minor page faults over the timed steps (this process: rank 0 in the driver's reading).
    if (run.state().global_step == warmup_) faults_at_warmup = minor_faults();
    if (run.state().global_step > warmup_) {
      faults_per_step = static_cast<double>(minor_faults() - faults_at_warmup) /
                        static_cast<double>(run.state().global_step - warmup_);
    }
  }
  std::vector<double> batch_ms, backward_sync_ms, backward_nosync_ms;
  long faults_at_warmup = 0;
  double faults_per_step = 0;

 private:
  int64_t warmup_, accum_, batch_idx_ = 0;
  Clock::time_point batch_start_, backward_start_;
};

/// `--collectives 1`: the reduce-scatter that ZeRO's gradient buckets use against what it
/// replaced (an all-reduce of the whole bucket, then this rank's row) on a process group of
/// `devices` local ranks, interleaved per size so that noise hits both alike. Rank 0 prints one
/// COLL line per size.
int collectives_worker(int64_t devices) {
  auto env = volt::detect_cluster_environment(volt::process_env(), devices, 1);
  std::unique_ptr<volt::LocalLauncher> launcher;
  if (env.launches_workers) {
    launcher = std::make_unique<volt::LocalLauncher>(env);
    env = launcher->environment();
  }
  volt::ProcessGroup pg(env, volt::ProcessGroupOptions());
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    for (const int64_t n :
         {int64_t(1) << 16, int64_t(1) << 20, int64_t(1) << 22, int64_t(1) << 24}) {
      auto bucket = torch::ones({devices, n / devices}, dtype);
      std::vector<double> old_ms, new_ms;
      for (int i = 0; i < 12; ++i) {
        auto t0 = Clock::now();
        at::Tensor a_chunk = pg.all_reduce(bucket).select(0, pg.rank()).clone();
        if (i >= 2) old_ms.push_back(ms_since(t0));
        t0 = Clock::now();
        at::Tensor b_chunk = pg.reduce_scatter(bucket).view({-1});
        if (i >= 2) new_ms.push_back(ms_since(t0));
        if (!a_chunk.equal(b_chunk)) throw std::runtime_error("reduce_scatter differs");
      }
      if (pg.rank() == 0) {
        std::printf("COLL rank=0 %s n=%lld allreduce_chunk_ms=%.3f reduce_scatter_ms=%.3f\n",
                    dtype == at::kFloat ? "fp32" : "bf16", static_cast<long long>(n),
                    median(old_ms), median(new_ms));
      }
    }
  }
  pg.barrier();
  if (launcher) launcher->wait_all(std::chrono::seconds(30));
  std::fflush(stdout);
  return 0;
}

/// DdpStrategy without the per-batch stop vote: the reference the vote's cost is measured
/// against (`--no-stop-vote 1`). Only for this benchmark: its ranks could stop apart.
class NoStopVoteDdp : public volt::DdpStrategy {
 public:
  using volt::DdpStrategy::DdpStrategy;
  volt::StopRequest agree_on_stop(const volt::StopRequest& local, bool) override { return local; }
};

int worker(std::map<std::string, std::string>& a) {
  auto num = [&](const char* k, double def) { return a.count(k) ? std::stod(a[k]) : def; };
  const auto devices = static_cast<int64_t>(num("--devices", 1));
  if (num("--collectives", 0) != 0) return collectives_worker(devices);
  const auto width = static_cast<int64_t>(num("--width", 2048));
  const auto batch = static_cast<int64_t>(num("--batch", 64));
  const auto steps = static_cast<int64_t>(num("--steps", 30));
  const auto accum = static_cast<int64_t>(num("--accum", 1));
  const int64_t warmup = 5;

  const auto zero = static_cast<int64_t>(num("--zero", 0));
  torch::manual_seed(0);
  BenchModule model(width, static_cast<int64_t>(num("--hidden", 1)), num("--adam", 0) != 0,
                    num("--batchnorm", 0) != 0);
  model.set_may_skip_rest_of_epoch(num("--may-skip", 0) != 0);
  auto x = torch::randn({8192, 784});
  auto y = torch::randint(0, 10, {8192});
  auto data = std::make_shared<volt::TensorDataset>(x, y);

  auto accelerator = std::make_shared<volt::CpuAccelerator>();
  const std::string precision_name = a.count("--precision") ? a["--precision"] : "32-true";
  std::shared_ptr<volt::Precision> precision = std::make_shared<volt::Fp32Precision>();
  if (precision_name == "bf16-mixed") {
    // Everything in bf16 (no timing-based CPU policy that keeps small ops in fp32).
    precision = std::make_shared<volt::MixedPrecision>(
        volt::MixedPrecisionOptions().read_env_lists(false).cpu_policy(false));
  }
  volt::DdpStrategyOptions ddp;
  ddp.bucket_cap_mb(num("--bucket-mb", 25))
      .gradient_as_bucket_view(num("--view", 0) != 0)
      .find_unused_parameters(num("--find-unused", 0) != 0)
      .static_graph(num("--static", 0) != 0);
  std::shared_ptr<volt::DdpStrategy> strategy;
  std::shared_ptr<ZeroBytes> zero_bytes;
  auto timing = std::make_shared<Timing>(warmup, accum);
  std::vector<std::shared_ptr<volt::Callback>> callbacks{timing};
  if (zero > 0) {
    const std::string offload = a.count("--offload") ? a["--offload"] : "none";
    auto ds = std::make_shared<volt::DeepSpeedStrategy>(
        volt::DeepSpeedStrategyOptions()
            .stage(zero)
            .param_persistence_threshold(0)
            .reduce_bucket_size(static_cast<int64_t>(num("--zero-bucket", 2e8)))
            .allgather_bucket_size(static_cast<int64_t>(num("--zero-bucket", 2e8)))
            .overlap_comm(num("--overlap", 1) != 0)
            .prefetch_bucket_size(static_cast<int64_t>(num("--prefetch", 5e7)))
            .master_weights(num("--master", 1) != 0)
            .offload_optimizer(offload != "none" && offload != "nvme_params")
            .offload_parameters(offload == "nvme_all" || offload == "nvme_params")
            .offload_parameters_device(offload == "nvme_all" || offload == "nvme_params" ? "nvme"
                                                                                         : "cpu")
            .offload_optimizer_device(offload == "cpu" || offload == "none" ? "cpu" : "nvme")
            .aio_use_uring(offload != "nvme_pread")
            .nvme_path(a.count("--nvme") ? a["--nvme"] : "/tmp")
            .sub_group_size(static_cast<int64_t>(num("--sub-group", 1e9))),
        accelerator, precision, devices, 1);
    zero_bytes = std::make_shared<ZeroBytes>(ds.get(), &model);
    callbacks.push_back(zero_bytes);
    strategy = ds;
  } else {
    strategy = num("--no-stop-vote", 0) != 0
                   ? std::make_shared<NoStopVoteDdp>(ddp, accelerator, precision, devices, 1)
                   : std::make_shared<volt::DdpStrategy>(ddp, accelerator, precision, devices, 1);
  }
  volt::Trainer trainer(volt::TrainerOptions()
                            .accelerator(accelerator)
                            .precision(precision)
                            .strategy(devices == 1 && zero == 0
                                          ? volt::Spec<volt::Strategy>("single_device")
                                          : volt::Spec<volt::Strategy>(strategy))
                            .devices(devices)
                            .sync_batchnorm(num("--sync-bn", 0) != 0)
                            .num_threads(1)
                            .reuse_host_memory(num("--reuse-host-memory", 1) != 0)
                            .max_steps(warmup + steps)
                            .accumulate_grad_batches(accum)
                            .logger(false)
                            .enable_checkpointing(false)
                            .enable_progress_bar(false)
                            .num_sanity_val_steps(0)
                            .callbacks(callbacks));
  trainer.fit(model, volt::DataLoader(data, volt::DataLoaderOptions(batch).shuffle(true).seed(1)));

  // The same gradient volume all-reduced alone, as one flat tensor, outside backward.
  double allreduce_ms = 0;
  if (devices > 1 && zero == 0) {
    int64_t n = 0;
    for (const auto& p : model.parameters()) n += p.numel();
    auto flat = torch::ones({n});
    std::vector<double> t;
    for (int i = 0; i < 12; ++i) {
      const auto t0 = Clock::now();
      trainer.strategy().reduce(flat, volt::Reduce::kSum);
      if (i >= 2) t.push_back(ms_since(t0));
    }
    allreduce_ms = median(t);
  }
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  // Without ZeRO every rank holds whole weights, gradients and state: count them alike.
  volt::ZeroMemory bytes;
  if (zero_bytes) {
    bytes = zero_bytes->bytes;
  } else {
    for (const auto& p : model.parameters()) {
      bytes.parameters += p.numel() * 4;
      bytes.gradients += p.numel() * 4;
      bytes.optimizer_state += p.numel() * 4 * (num("--adam", 0) != 0 ? 2 : 1);
    }
  }
  std::printf(
      "RESULT rank=%lld step_ms=%.3f bwd_sync_ms=%.3f bwd_nosync_ms=%.3f "
      "allreduce_ms=%.3f rss_mb=%.1f params=%lld grads=%lld state=%lld files=%lld "
      "master=%lld pfiles=%lld ppeak=%lld faults=%.1f\n",
      static_cast<long long>(trainer.strategy().rank()), median(timing->batch_ms),
      median(timing->backward_sync_ms), median(timing->backward_nosync_ms), allreduce_ms,
      ru.ru_maxrss / 1024.0, static_cast<long long>(bytes.parameters),
      static_cast<long long>(bytes.gradients), static_cast<long long>(bytes.optimizer_state),
      static_cast<long long>(bytes.optimizer_state_in_files),
      static_cast<long long>(bytes.master_weights),
      static_cast<long long>(bytes.parameters_in_files),
      static_cast<long long>(zero_bytes ? zero_bytes->step_peak : 0), timing->faults_per_step);
  std::fflush(stdout);
  return 0;
}

struct Result {
  double step_ms = 0, bwd_sync_ms = 0, bwd_nosync_ms = 0, allreduce_ms = 0, rss_mb = 0, faults = 0;
  long long params = 0, grads = 0, state = 0, files = 0, master = 0, pfiles = 0, ppeak = 0;
  int ranks = 0;
  std::string collectives;  // rank 0's COLL lines (--collectives 1)
};

/// Runs one job of this binary and folds its ranks' RESULT lines: rank 0's times (the ranks
/// step in lockstep), the largest peak RSS.
Result job(const std::string& self, const std::string& args) {
  const std::string cmd = "OPENBLAS_NUM_THREADS=1 " + self + " --worker 1 " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  Result r;
  char line[1024];
  while (p != nullptr && std::fgets(line, sizeof line, p) != nullptr) {
    long long rank = -1;
    Result one;
    if (std::sscanf(line,
                    "RESULT rank=%lld step_ms=%lf bwd_sync_ms=%lf bwd_nosync_ms=%lf "
                    "allreduce_ms=%lf rss_mb=%lf params=%lld grads=%lld state=%lld files=%lld "
                    "master=%lld pfiles=%lld ppeak=%lld faults=%lf",
                    &rank, &one.step_ms, &one.bwd_sync_ms, &one.bwd_nosync_ms, &one.allreduce_ms,
                    &one.rss_mb, &one.params, &one.grads, &one.state, &one.files, &one.master,
                    &one.pfiles, &one.ppeak, &one.faults) == 14) {
      ++r.ranks;
      r.rss_mb = std::max(r.rss_mb, one.rss_mb);
      if (rank == 0) {
        one.rss_mb = r.rss_mb;
        one.ranks = r.ranks;
        one.collectives = std::move(r.collectives);
        r = one;
      }
    } else if (std::strncmp(line, "COLL rank=0 ", 12) == 0) {
      r.collectives += line + 12;
    } else {
      std::fputs(line, stderr);  // a failing job shows why
    }
  }
  const int status = p != nullptr ? ::pclose(p) : -1;
  if (status != 0 || (r.ranks == 0 && r.collectives.empty())) {
    std::fprintf(stderr, "job failed (status %d): %s\n", status, cmd.c_str());
    std::exit(1);
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 1; i + 1 < argc; i += 2) a[argv[i]] = argv[i + 1];
  try {
    if (a.count("--worker")) return worker(a);
    const int rounds = a.count("--rounds") ? std::stoi(a["--rounds"]) : 3;
    std::ostringstream common;
    common << " --steps " << (a.count("--steps") ? a["--steps"] : "30") << " --width "
           << (a.count("--width") ? a["--width"] : "2048") << " --batch "
           << (a.count("--batch") ? a["--batch"] : "64");
    // /proc/self/exe inside popen's shell would be the shell: resolve our own path first.
    char path[4096];
    const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
    if (n <= 0) return 1;
    path[n] = '\0';
    const std::string bin = path;

    std::printf(
        "DDP benchmarks: MLP 784-%s-%s-10, per-rank batch %s, %d rounds, median of "
        "rank 0's step times after 5 warm-up steps; OPENBLAS_NUM_THREADS=1, one torch "
        "thread per rank\n\n",
        a.count("--width") ? a["--width"].c_str() : "2048",
        a.count("--width") ? a["--width"].c_str() : "2048",
        a.count("--batch") ? a["--batch"].c_str() : "64", rounds);

    const std::string only = a.count("--only") ? a["--only"] : "";
    auto wanted = [&](const char* part) { return only.empty() || only == part; };

    // 0. ZeRO's reduce-scatter (one all-to-all, then a local sum) against the all-reduce and
    // chunk it replaced, on a DDP run's group at 2 and 4 ranks; the median of each round's
    // medians. Not in the default set (--only collectives).
    if (only == "collectives") {
      std::printf(
          "reduce-scatter of a [world, n / world] bucket: all_reduce + this rank's row vs "
          "reduce_scatter (ms, median; bf16 all-reduces in fp32)\n");
      std::printf("  ranks  dtype  elements   all_reduce+chunk  reduce_scatter  ratio\n");
      for (const char* n : {"2", "4"}) {
        // "fp32 65536" -> times; std::map orders fp32 after bf16, sizes as text: keep the order
        // the worker printed them in.
        std::vector<std::string> order;
        std::map<std::string, std::vector<double>> old_ms, new_ms;
        for (int r = 0; r < rounds; ++r) {
          const Result res = job(bin, std::string("--devices ") + n + " --collectives 1");
          std::istringstream lines(res.collectives);
          std::string line;
          while (std::getline(lines, line)) {
            char dtype[8] = {0};
            long long elements = 0;
            double o = 0, m = 0;
            if (std::sscanf(line.c_str(), "%7s n=%lld allreduce_chunk_ms=%lf reduce_scatter_ms=%lf",
                            dtype, &elements, &o, &m) == 4) {
              char key[64];
              std::snprintf(key, sizeof key, "%5s  %8lld", dtype, elements);
              if (!old_ms.count(key)) order.push_back(key);
              old_ms[key].push_back(o);
              new_ms[key].push_back(m);
            }
          }
        }
        for (const auto& key : order) {
          const double o = median(old_ms[key]), m = median(new_ms[key]);
          std::printf("  %5s  %s   %16.3f  %14.3f  %5.2fx\n", n, key.c_str(), o, m, o / m);
        }
      }
      std::printf("\n");
      return 0;
    }

    // 1. Weak scaling, rounds interleaved so that machine noise hits both alike.
    if (wanted("weak")) {
      std::vector<double> one, two;
      for (int r = 0; r < rounds; ++r) {
        one.push_back(job(bin, "--devices 1" + common.str()).step_ms);
        two.push_back(job(bin, "--devices 2" + common.str()).step_ms);
      }
      std::printf("weak scaling (goal: 2 ranks / 1 rank <= 1.15)\n");
      std::printf("  1 rank x 1 thread   %8.2f ms/step\n", median(one));
      std::printf("  2 ranks x 1 thread  %8.2f ms/step   ratio %.3f\n\n", median(two),
                  median(two) / median(one));
    }

    // 1b. The stop vote's cost on a small model, rounds interleaved.
    if (wanted("stop_vote")) {
      const std::string small = " --steps 200 --width 256 --batch 64";
      std::vector<double> with, without;
      for (int r = 0; r < rounds; ++r) {
        // Alternating which goes first, so that drift between the two jobs of a round cancels.
        if (r % 2 == 1) without.push_back(job(bin, "--devices 2 --no-stop-vote 1" + small).step_ms);
        with.push_back(job(bin, "--devices 2" + small).step_ms);
        if (r % 2 == 0) without.push_back(job(bin, "--devices 2 --no-stop-vote 1" + small).step_ms);
      }
      std::printf("stop vote per batch, 2 ranks, MLP 784-256-256-10, batch 64, 200 steps\n");
      std::printf("  without the vote  %8.3f ms/step\n", median(without));
      std::printf("  with the vote     %8.3f ms/step   ratio %.3f\n\n", median(with),
                  median(with) / median(without));
    }

    // 1c. The per-batch agreement on skip_rest_of_epoch(), rounds alternating as above.
    if (wanted("skip_vote")) {
      const std::string small = " --steps 200 --width 256 --batch 64";
      std::vector<double> with, without;
      for (int r = 0; r < rounds; ++r) {
        if (r % 2 == 1) without.push_back(job(bin, "--devices 2" + small).step_ms);
        with.push_back(job(bin, "--devices 2 --may-skip 1" + small).step_ms);
        if (r % 2 == 0) without.push_back(job(bin, "--devices 2" + small).step_ms);
      }
      std::printf(
          "skip_rest_of_epoch agreement per batch (may_skip_rest_of_epoch), 2 ranks, MLP "
          "784-256-256-10, batch 64, 200 steps\n");
      std::printf("  without it  %8.3f ms/step\n", median(without));
      std::printf("  with it     %8.3f ms/step   ratio %.3f\n\n", median(with),
                  median(with) / median(without));
    }

    // 2. bucket_cap_mb x gradient_as_bucket_view.
    if (wanted("sweep")) {
      std::printf("bucket sweep, 2 ranks (peak RSS: the larger rank)\n");
      std::printf("  bucket_cap_mb  bucket_view  ms/step  peak RSS MB\n");
      for (const char* mb : {"1", "5", "25", "100"}) {
        for (const char* view : {"0", "1"}) {
          std::vector<double> t, rss;
          for (int r = 0; r < rounds; ++r) {
            const Result res = job(bin, std::string("--devices 2 --bucket-mb ") + mb + " --view " +
                                            view + common.str());
            t.push_back(res.step_ms);
            rss.push_back(res.rss_mb);
          }
          std::printf("  %13s  %11s  %7.2f  %11.1f\n", mb, view[0] == '1' ? "yes" : "no", median(t),
                      median(rss));
        }
      }
      std::printf("\n");
    }

    // 3. Overlap: accumulate 2 so that backward alternates no_sync and all-reducing micro-batches.
    if (wanted("overlap")) {
      for (const char* mb : {"5", "25"}) {
        std::vector<double> sync, nosync, alone;
        for (int r = 0; r < rounds; ++r) {
          const Result res =
              job(bin, std::string("--devices 2 --accum 2 --bucket-mb ") + mb + common.str());
          sync.push_back(res.bwd_sync_ms);
          nosync.push_back(res.bwd_nosync_ms);
          alone.push_back(res.allreduce_ms);
        }
        const double exposed = median(sync) - median(nosync);
        const double hidden = 1.0 - exposed / median(alone);
        std::printf("all-reduce overlap, 2 ranks, bucket_cap_mb %s\n", mb);
        std::printf("  backward without all-reduce (no_sync)   %8.2f ms\n", median(nosync));
        std::printf("  backward with the bucketed all-reduce   %8.2f ms\n", median(sync));
        std::printf("  the same gradients all-reduced alone    %8.2f ms\n", median(alone));
        std::printf("  hidden behind backward                  %7.0f %%\n\n",
                    100.0 * std::max(0.0, std::min(1.0, hidden)));
      }
    }
    // 3b. find_unused_parameters costs a search of the autograd graph every step (and an extra
    // all-reduce of the used-parameter bitmap); static_graph records the graph once and skips
    // both. A deeper MLP (10 Linear layers) so that there is a graph to search.
    if (wanted("static")) {
      std::printf(
          "static_graph, 2 ranks, MLP 784-1024x8-10, per-rank batch 64: step and backward ms\n");
      const char* modes[][2] = {{"plain DDP", ""},
                                {"find_unused_parameters", " --find-unused 1"},
                                {"find_unused + static_graph", " --find-unused 1 --static 1"}};
      std::vector<std::vector<double>> step(3), bwd(3);
      for (int r = 0; r < rounds; ++r) {  // interleaved: machine noise hits every mode alike
        for (int m = 0; m < 3; ++m) {
          const Result res = job(bin, std::string("--devices 2") + modes[m][1] + common.str() +
                                          " --width 1024 --hidden 8");
          step[m].push_back(res.step_ms);
          bwd[m].push_back(res.bwd_sync_ms);
        }
      }
      for (int m = 0; m < 3; ++m) {
        std::printf("  %-28s step %7.2f ms (%.2fx plain)  backward %7.2f ms\n", modes[m][0],
                    median(step[m]), median(step[m]) / median(step[0]), median(bwd[m]));
      }
      std::printf("\n");
    }
    // 3c. sync_batchnorm: every BatchNorm's statistics over both ranks (two all-reduces of C
    // values per layer forward, two in backward), against BatchNorm on each rank's share.
    if (wanted("sync_bn")) {
      std::printf(
          "sync_batchnorm, 2 ranks, MLP 784-1024x8-10 with a BatchNorm1d after each of its 9 "
          "hidden layers, per-rank batch 64: step ms\n");
      const char* modes[][2] = {{"no BatchNorm", ""},
                                {"BatchNorm per rank", " --batchnorm 1"},
                                {"BatchNorm, sync_batchnorm", " --batchnorm 1 --sync-bn 1"}};
      std::vector<std::vector<double>> step(3);
      for (int r = 0; r < rounds; ++r) {  // interleaved: machine noise hits every mode alike
        for (int m = 0; m < 3; ++m) {
          step[m].push_back(job(bin, std::string("--devices 2") + modes[m][1] + common.str() +
                                         " --width 1024 --hidden 8")
                                .step_ms);
        }
      }
      for (int m = 0; m < 3; ++m) {
        std::printf("  %-28s step %7.2f ms (%.2fx per-rank BatchNorm)\n", modes[m][0],
                    median(step[m]), median(step[m]) / median(step[1]));
      }
      std::printf("\n");
    }
    // 4. ZeRO stages against DDP at the same world size (Adam: 16 bytes per parameter).
    if (wanted("zero")) {
      for (const char* n : {"2", "4"}) {
        std::printf(
            "ZeRO vs DDP, %s ranks, Adam (bytes per rank counted exactly; Psi = "
            "parameters)\n",
            n);
        std::printf("  strategy  ms/step  vs DDP  peak RSS MB  params+grads+state MB  bytes/Psi\n");
        double ddp_ms = 0;
        for (const char* stage : {"0", "1", "2", "3"}) {
          std::vector<double> t, rss;
          Result last;
          for (int r = 0; r < rounds; ++r) {
            last = job(bin,
                       std::string("--adam 1 --devices ") + n + " --zero " + stage + common.str());
            t.push_back(last.step_ms);
            rss.push_back(last.rss_mb);
          }
          if (stage[0] == '0') ddp_ms = median(t);
          const double total = static_cast<double>(last.params + last.grads + last.state);
          const double psi =
              static_cast<double>(last.params) / (stage[0] == '3' ? 4.0 / std::stod(n) : 4.0);
          std::printf("  %-8s  %7.2f  %6.2fx  %11.1f  %21.1f  %9.2f\n",
                      stage[0] == '0' ? "ddp" : (std::string("stage ") + stage).c_str(), median(t),
                      median(t) / ddp_ms, median(rss), total / 1e6, total / psi);
        }
        std::printf("\n");
      }
    }
    // 4b. ZeRO at one rank (a DeepSpeed config run in one process, or ZeRO-Infinity on one
    // machine): the partitions are whole, so the stages can only cost time against the
    // single-device fit. Rounds interleaved.
    if (wanted("zero_alone")) {
      std::printf("ZeRO at 1 rank vs the single-device fit, Adam\n");
      std::printf("  strategy       ms/step  vs single device\n");
      std::map<std::string, std::vector<double>> t;
      for (int r = 0; r < rounds; ++r) {
        for (const char* stage : {"0", "1", "2", "3"}) {
          t[stage].push_back(
              job(bin, std::string("--adam 1 --devices 1 --zero ") + stage + common.str()).step_ms);
        }
      }
      const double single = median(t["0"]);
      for (const char* stage : {"0", "1", "2", "3"}) {
        std::printf("  %-13s  %7.2f  %6.2fx\n",
                    stage[0] == '0' ? "single device" : (std::string("stage ") + stage).c_str(),
                    median(t[stage]), median(t[stage]) / single);
      }
      std::printf("\n");
    }
    // 5. ZeRO-Infinity: stage 3 at 2 ranks, the Adam state in memory, "cpu" or NVMe files.
    if (wanted("offload")) {
      const std::string nvme = a.count("--nvme") ? a["--nvme"] : "/tmp";
      std::printf("ZeRO stage 3, 2 ranks, Adam: optimizer offload (NVMe swap files in %s)\n",
                  nvme.c_str());
      std::printf(
          "  offload                      ms/step  vs memory  state in RAM MB  in files MB"
          "  params in RAM MB  in files MB  params in RAM during step MB\n");
      double base = 0;
      for (const char* mode : {"none", "cpu", "nvme", "nvme_pread", "nvme_params", "nvme_all"}) {
        for (const char* sub : {"1000000000", "1000000"}) {
          const bool whole = std::string(sub).size() == 10;  // one sub-group
          if (std::string(mode).rfind("nvme", 0) != 0 && !whole) continue;
          std::vector<double> t;
          Result last;
          for (int r = 0; r < rounds; ++r) {
            last = job(bin, std::string("--adam 1 --devices 2 --zero 3 --offload ") + mode +
                                " --nvme " + nvme + " --sub-group " + sub + common.str());
            t.push_back(last.step_ms);
          }
          if (std::string(mode) == "none") base = median(t);
          const std::string label = std::string(mode == std::string("none") ? "in memory" : mode) +
                                    (std::string(mode).rfind("nvme", 0) == 0
                                         ? (whole ? " (1 sub-group)" : " (sub-group 1e6)")
                                         : "");
          std::printf("  %-27s  %7.2f  %8.2fx  %15.2f  %11.2f  %16.2f  %11.2f  %29.2f\n",
                      label.c_str(), median(t), median(t) / base, last.state / 1e6,
                      last.files / 1e6, last.params / 1e6, last.pfiles / 1e6, last.ppeak / 1e6);
        }
      }
      // The step by sub-group needs more than two parameter chunks to show: a deeper model
      // (784-1024x8-10, Psi = 8.2 M; a hidden layer's chunk is 0.52 M elements per rank).
      // Parameters on NVMe with the state in memory (nvme_params) or on NVMe too (nvme_all).
      std::printf(
          "  deeper MLP 784-1024x8-10, NVMe parameters: parameters in RAM during the step\n"
          "  offload      sub_group_size   ms/step  params in files MB  peak in RAM during step "
          "MB\n");
      for (const char* mode : {"nvme_params", "nvme_all"}) {
        for (const char* sub : {"1000000000", "600000"}) {
          std::vector<double> t;
          Result last;
          for (int r = 0; r < rounds; ++r) {
            last = job(bin, std::string("--adam 1 --devices 2 --zero 3 --offload ") + mode +
                                " --nvme " + nvme + " --sub-group " + sub + common.str() +
                                " --width 1024 --hidden 8");
            t.push_back(last.step_ms);
          }
          std::printf("  %-11s  %14s  %8.2f  %18.2f  %27.2f\n", mode, sub, median(t),
                      last.pfiles / 1e6, last.ppeak / 1e6);
        }
      }
      std::printf("\n");
    }
    // 6. ZeRO's overlap of communication with computation: blocking vs overlapped reductions
    // (stages 2, 3) and stage 3's prefetch. 500k-element buckets: ~12 per backward.
    if (wanted("zero_overlap")) {
      std::printf("ZeRO overlap, 2 ranks, Adam, reduce/allgather buckets of 500k elements\n");
      std::printf("  stage  overlap_comm  prefetch  ms/step  backward ms  vs blocking\n");
      for (const char* stage : {"2", "3"}) {
        double base = 0;
        for (const char* mode : {"00", "10", "11"}) {
          if (stage[0] == '2' && mode[1] == '1') continue;  // nothing to prefetch in stage 2
          std::vector<double> t, bwd;
          for (int r = 0; r < rounds; ++r) {
            const Result res =
                job(bin, std::string("--adam 1 --devices 2 --zero ") + stage +
                             " --zero-bucket 500000 --overlap " + mode[0] + " --prefetch " +
                             (mode[1] == '1' ? "50000000" : "0") + common.str());
            t.push_back(res.step_ms);
            bwd.push_back(res.bwd_sync_ms);
          }
          if (mode[0] == '0') base = median(t);
          std::printf("  %5s  %12s  %8s  %7.2f  %11.2f  %10.2fx\n", stage,
                      mode[0] == '1' ? "on" : "off",
                      stage[0] == '2' ? "-" : (mode[1] == '1' ? "on" : "off"), median(t),
                      median(bwd), median(t) / base);
        }
      }
      std::printf("\n");
    }
    // 7. BF16Optimizer: bf16-mixed under ZeRO with and without fp32 master weights.
    // 9. Host memory reuse (TrainerOptions::reuse_host_memory): the C library's malloc keeping
    // freed blocks against its defaults, one process, DDP and the ZeRO stages at 2 ranks (Adam),
    // the two settings alternating in every round.
    if (wanted("host_memory")) {
      std::printf(
          "host memory reuse (glibc malloc keeps freed blocks) vs its defaults, Adam; page "
          "faults per step of rank 0\n");
      std::printf(
          "  configuration   defaults ms  faults/step   reuse ms  faults/step  speed-up  peak "
          "RSS MB (defaults / reuse)\n");
      const std::vector<std::pair<const char*, std::string>> configs{
          {"1 process", "--devices 1"},
          {"DDP, 2 ranks", "--devices 2"},
          {"ZeRO-1, 2", "--devices 2 --zero 1"},
          {"ZeRO-2, 2", "--devices 2 --zero 2"},
          {"ZeRO-3, 2", "--devices 2 --zero 3"}};
      for (const auto& [label, args] : configs) {
        std::vector<double> t[2], f[2], rss[2];
        for (int r = 0; r < rounds; ++r) {
          for (int reuse = 0; reuse < 2; ++reuse) {
            const Result res = job(bin, "--adam 1 " + args + " --reuse-host-memory " +
                                            std::to_string(reuse) + common.str());
            t[reuse].push_back(res.step_ms);
            f[reuse].push_back(res.faults);
            rss[reuse].push_back(res.rss_mb);
          }
        }
        std::printf("  %-14s  %11.2f  %11.0f  %9.2f  %11.0f  %7.2fx  %6.1f / %.1f\n", label,
                    median(t[0]), median(f[0]), median(t[1]), median(f[1]),
                    median(t[0]) / median(t[1]), median(rss[0]), median(rss[1]));
      }
      std::printf("\n");
    }

    if (wanted("master")) {
      std::printf(
          "ZeRO stage 2, 2 ranks, Adam: fp32 vs bf16-mixed with master weights (module in bf16) "
          "and without (autocast over fp32 weights)\n");
      std::printf(
          "  precision                    ms/step  vs fp32  params+grads+state+master MB  in "
          "files MB\n");
      const std::string nvme = a.count("--nvme") ? a["--nvme"] : "/tmp";
      double base = 0;
      // Without master weights the module stays fp32 under ZeRO and bf16-mixed is autocast.
      // And the masters on NVMe with their Adam state (optimizer offload, sub-groups of 1e6).
      for (const char* mode :
           {"fp32", "bf16 + masters", "bf16, no masters", "bf16 + masters, NVMe"}) {
        const std::string m(mode);
        std::vector<double> t;
        Result last;
        for (int r = 0; r < rounds; ++r) {
          last = job(bin, std::string("--adam 1 --devices 2 --zero 2") +
                              (m == "fp32" ? "" : " --precision bf16-mixed") +
                              (m == "bf16, no masters" ? " --master 0" : "") +
                              (m == "bf16 + masters, NVMe"
                                   ? " --offload nvme --sub-group 1000000 --nvme " + nvme
                                   : "") +
                              common.str());
          t.push_back(last.step_ms);
        }
        if (m == "fp32") base = median(t);
        std::printf("  %-27s  %7.2f  %6.2fx  %29.1f  %11.1f\n", mode, median(t), median(t) / base,
                    (last.params + last.grads + last.state + last.master) / 1e6, last.files / 1e6);
      }
      std::printf("\n");
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
