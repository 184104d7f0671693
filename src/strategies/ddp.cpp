#include "volt/strategies/ddp.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <sched.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>

#include "core/detail/print.h"
#include "distributed/detail/async_collective.h"
#include "distributed/detail/bucket_cap.h"
#include "distributed/detail/net.h"
#include "strategies/detail/agree.h"
#include "strategies/detail/rank_key.h"
#include "strategies/detail/timeout.h"
#include "volt/core/check.h"
#include "volt/core/env.h"
#include "volt/core/log.h"
#include "volt/core/module.h"
#include "volt/distributed/gradient_reducer.h"
#include "volt/distributed/local_launcher.h"
#include "volt/distributed/process_group.h"
#include "volt/distributed/sync_batchnorm.h"
#include "volt/io/state.h"

namespace volt {
namespace {

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

// N ranks on one node share its CPUs: each gets cpus / N intra-op threads and as many OpenBLAS
// threads (torchrun sets OMP_NUM_THREADS=1 for the same reason). Explicit settings win: a lower
// intra-op count is kept, and OPENBLAS_NUM_THREADS / OMP_NUM_THREADS in the environment leave
// OpenBLAS alone.
void share_cpus(int64_t local_world_size) {
  if (local_world_size <= 1) return;
  const int per_rank = std::max<int>(1, available_cpus() / static_cast<int>(local_world_size));
  if (at::get_num_threads() > per_rank) at::set_num_threads(per_rank);
  if (!env_value("OPENBLAS_NUM_THREADS") && !env_value("OMP_NUM_THREADS")) {
    using SetThreads = void (*)(int);
    if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
      set(per_rank);
    }
  }
}

constexpr const char* kRestartCountVar = "VOLT_RESTART_COUNT";
constexpr const char* kRestartCheckpointVar = "VOLT_RESTART_CHECKPOINT";

}  // namespace

// One set-up module's gradient reducer, SyncBatchNorm layers and buffers.
struct DdpStrategy::ModuleSync {
  const Module* module = nullptr;
  std::unique_ptr<GradientReducer> reducer;
  std::unique_ptr<SyncBatchNorm> sync_bn;
  std::vector<at::Tensor> buffers;
  bool buffers_moved = false;  // a training forward ran since the last broadcast
};

// The ranks' agreement on stop requests (agree_on_stop). A vote every batch cost 8-12 % of a
// 3 ms step on this 2-CPU machine (volt_bench_ddp --only stop_vote), so the ranks vote about
// every kStopVotePeriod seconds instead: each vote also carries every rank's proposal for the
// number of batches until the next one (from its own batch time), and all ranks take the
// smallest, so the schedule is the same everywhere.
struct DdpStrategy::StopVote {
  detail::PendingCollective pending;
  int64_t interval = 1;  // batches from one lagged vote to the next, as agreed
  int64_t calls = 0;     // calls since the last vote
  int64_t batches = 0;   // of which lagged (training batch ends)
  std::chrono::steady_clock::time_point last;
};

DdpStrategy::DdpStrategy(DdpStrategyOptions options, std::shared_ptr<Accelerator> accelerator,
                         std::shared_ptr<Precision> precision, int64_t devices, int64_t num_nodes,
                         std::shared_ptr<CheckpointIO> checkpoint_io)
    : Strategy(std::move(accelerator), std::move(precision), std::move(checkpoint_io)),
      options_(std::move(options)),
      devices_(devices),
      num_nodes_(num_nodes) {
  // The upper bounds refuse inf (and values that overflow the millisecond / byte counts).
  detail::check_bucket_cap_mb(options_.bucket_cap_mb(), "[DdpStrategy]");
  detail::check_timeout_s(options_.timeout_s(), "[DdpStrategy]");
  VOLT_CHECK(options_.max_restarts() >= 0, ConfigError,
             "[DdpStrategy] max_restarts=", options_.max_restarts(), " must be >= 0.");
  VOLT_CHECK(devices_ >= 1 && num_nodes_ >= 1, ConfigError, "[DdpStrategy] devices=", devices_,
             " num_nodes=", num_nodes_, " is invalid; both must be >= 1.");
  // Checked here, so a bad name fails when the Trainer is built, not after launching workers.
  resolve_backend(options_.process_group_backend(), accelerator_->device(0).type());
}

DdpStrategy::~DdpStrategy() {
  // The run is over. On global rank 0 the group's end also stops the store (unless a restart
  // kept it, or torchrun's agent hosts it), so a worker failing from here on could not be
  // reported there: trying would only print connection timeouts for seconds before exiting.
  if (launcher_ && env_.global_rank == 0 && !env_.agent_store && !rendezvous_) {
    launcher_->on_failure(nullptr);
  }
  synced_.clear();  // the reducers' autograd hooks and their group go first
  group_.reset();
  if (launcher_) {
    // Local ranks finish the same program; give them the timeout to exit, then the launcher
    // kills whatever is left (never an orphan).
    launcher_->wait_all(to_ms(options_.timeout_s()));
    launcher_.reset();
  }
}

std::shared_ptr<DdpStrategy> DdpStrategy::sharing_processes_of(
    const DdpStrategy& run, std::shared_ptr<Precision> precision) {
  VOLT_CHECK(run.group_ != nullptr, InternalError,
             "[DdpStrategy] a trial strategy needs the run's process group; make it once the run "
             "has set up its environment (on_fit_start and later).");
  auto trial = std::make_shared<DdpStrategy>(run.options_, run.accelerator_, std::move(precision),
                                             run.devices_, run.num_nodes_);
  // Launched and joined already: launch() and setup_environment() return at once, no launcher
  // (nothing to wait for at its end) and no store of its own.
  trial->env_ = run.env_;
  trial->group_ = run.group_;
  trial->launched_ = true;
  return trial;
}

void DdpStrategy::launch() {
  if (launched_) return;
  // A restarted attempt meets at the store rank 0 kept serving, on the port it had.
  const int kept_port = rendezvous_ ? env_.main_port : 0;
  env_ = detect_cluster_environment(process_env(), devices_, num_nodes_);
  if (kept_port != 0 && env_.main_port == 0) env_.main_port = kept_port;
  if (env_.launches_workers) {
    launcher_ = std::make_unique<LocalLauncher>(env_);
    env_ = launcher_->environment();
    const ClusterEnvironment env = env_;
    launcher_->on_failure([env](const WorkerExit& exit) {
      report_lost_rank(env, exit.describe(), std::chrono::seconds(5));
    });
  } else if (env_.world_size == 1 && env_.main_port == 0) {
    env_.main_port = detail::find_free_port();  // a one-process group still rendezvouses
  }
  if (env_.launched_child) {
    // Set by a restart of the launching process (restart_after_failure).
    restart_checkpoint_ = env_value(kRestartCheckpointVar).value_or("");
  } else if (env_.kind == ClusterKind::kTorchrun && env_.restart_count > 0) {
    // torchrun restarted every worker (--max-restarts): resume as volt's own restarts do.
    restart_checkpoint_ = "last";
  }
  set_log_rank(env_.global_rank);
  launched_ = true;
}

bool DdpStrategy::restart_after_failure(const std::exception& error,
                                        const std::string& checkpoint) {
  if (!launcher_ || restarts_ >= options_.max_restarts()) return false;
  ++restarts_;
  // Every node's launching process restarts its own workers, so every node says so: ranks
  // other than 0 print errors only (the log's rank-zero rule), and a failure is one, prefixed
  // with the rank ("[volt rank 2] error: ...").
  log_message(env_.global_rank == 0 ? LogLevel::kWarning : LogLevel::kError, "DdpStrategy",
              "restart " + std::to_string(restarts_) + " of " +
                  std::to_string(options_.max_restarts()) + " after: " + error.what() +
                  "; resuming from " +
                  (checkpoint.empty() ? std::string("where fit() began (no last checkpoint yet)")
                                      : checkpoint));
  // Everything of the failed attempt goes: the reducer, the group and the surviving workers; not
  // the store rank 0 hosts, where every node's ranks of the next attempt meet (under keys of
  // that attempt), so that no node's processes find a store that is about to close. The new
  // workers learn the attempt and the checkpoint from their environment, which they inherit.
  stop_vote_.reset();
  synced_.clear();  // setup_module of the next attempt builds them again over its group
  if (group_ && env_.global_rank == 0) rendezvous_ = group_->rendezvous_store();
  group_.reset();
  launcher_->kill_all();
  launcher_.reset();
  launched_ = false;
  ::setenv(kRestartCountVar, std::to_string(restarts_).c_str(), 1);
  ::setenv(kRestartCheckpointVar, checkpoint.c_str(), 1);
  restart_checkpoint_ = checkpoint;
  return true;
}

void DdpStrategy::setup_environment() {
  launch();
  if (group_) return;
  share_cpus(env_.local_world_size);
  accelerator_->setup_device(root_device());
  ProcessGroupOptions o;
  o.backend(resolve_backend(options_.process_group_backend(), root_device().type()))
      .timeout(to_ms(options_.timeout_s()))
      .config_hash(config_fingerprint())
      .store(rendezvous_);
  group_ = std::make_shared<ProcessGroup>(env_, o);
}

ProcessGroup& DdpStrategy::group() const {
  VOLT_CHECK(group_ != nullptr, InternalError,
             "[DdpStrategy] collective before setup_environment(); the Trainer sets it up.");
  return *group_;
}

void DdpStrategy::teardown() {
  // A vote still under way here belongs to a run that failed (one that ends normally waits for
  // its last vote): abandoned, as the ranks are out of step anyway.
  stop_vote_.reset();
  for (auto& m : synced_) m->sync_bn.reset();
  Strategy::teardown();
}

c10::Device DdpStrategy::root_device() const {
  // On the CPU every rank shares the host; on CUDA local rank i owns device i.
  if (accelerator_->name() == "cpu") return accelerator_->device(0);
  return accelerator_->device(env_.local_rank);
}

DdpStrategy::ModuleSync* DdpStrategy::find_sync(const Module& module) const {
  for (const auto& m : synced_) {
    if (m->module == &module) return m.get();
  }
  return nullptr;
}

DdpStrategy::ModuleSync& DdpStrategy::sync_of(const Module& module) {
  if (ModuleSync* m = find_sync(module)) return *m;
  synced_.push_back(std::make_unique<ModuleSync>());
  synced_.back()->module = &module;
  return *synced_.back();
}

GradientReducer* DdpStrategy::reducer(const Module& module) const {
  const ModuleSync* m = find_sync(module);
  return m != nullptr ? m->reducer.get() : nullptr;
}

void DdpStrategy::broadcast_module_state(Module& module) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> state;
  for (const auto& p : module.named_parameters(true)) state.push_back(p.value().detach());
  std::vector<at::Tensor>& buffers = sync_of(module).buffers;
  buffers.clear();
  for (const auto& b : module.named_buffers(true)) {
    state.push_back(b.value().detach());
    buffers.push_back(b.value().detach());
  }
  // Every rank starts from rank 0's weights and buffers.
  if (!state.empty()) group().broadcast_(state, 0);
}

void DdpStrategy::setup_module(Module& module) {
  Strategy::setup_module(module);
  broadcast_module_state(module);
  // validate / test / predict of a model with nothing to train (loaded for inference) have no
  // gradients to reduce: no reducer, as Lightning wraps in DDP only to fit. (It refused, "no
  // parameter requires a gradient".) A fit or a Fabric module with optimizers still needs one.
  bool trainable = false;
  for (const auto& p : module.parameters()) trainable = trainable || p.requires_grad();
  if (!loop_.fitting && !trainable) {
    drop_reducer(module);
  } else {
    build_reducer(module);
  }
  sync_batchnorm_over(module, sync_batchnorm() && world_size() > 1 ? group_ : nullptr);
}

void DdpStrategy::sync_batchnorm_over(Module& module, std::shared_ptr<ProcessGroup> over) {
  std::unique_ptr<SyncBatchNorm>& sync_bn = sync_of(module).sync_bn;
  sync_bn.reset();
  if (!over) return;
  sync_bn = std::make_unique<SyncBatchNorm>(module, over);
  const auto layers = sync_bn->layers();
  if (!layers.empty()) {
    const std::string n = std::to_string(over->world_size());
    log_info("DdpStrategy",
             "sync_batchnorm: " + std::to_string(layers.size()) +
                 " BatchNorm layers normalise over " +
                 (over->world_size() == world_size() ? "all " + n + " processes' batches"
                                                     : n + " data-parallel replicas' batches"));
  }
}

std::shared_ptr<void> DdpStrategy::sync_batchnorm_scope(const Module& module) {
  ModuleSync* m = find_sync(module);
  if (m == nullptr || !m->sync_bn) return nullptr;
  return std::make_shared<SyncBatchNorm::Scope>(*m->sync_bn);
}

void DdpStrategy::build_reducer(Module& module, std::shared_ptr<ProcessGroup> over) {
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  for (const auto& p : module.named_parameters(true)) {
    if (p.value().requires_grad()) {
      params.push_back(p.value());
      names.push_back(p.key());
    }
  }
  std::unique_ptr<GradientReducer>& reducer = sync_of(module).reducer;
  reducer.reset();  // its autograd hooks go before the new reducer registers its own
  reducer = std::make_unique<GradientReducer>(
      params, over ? std::move(over) : group_,
      GradientReducerOptions()
          .bucket_cap_mb(options_.bucket_cap_mb())
          .gradient_as_bucket_view(options_.gradient_as_bucket_view())
          .find_unused_parameters(options_.find_unused_parameters())
          .static_graph(options_.static_graph()),
      names);
}

void DdpStrategy::drop_reducer(const Module& module) {
  if (ModuleSync* m = find_sync(module)) m->reducer.reset();
}

void DdpStrategy::trainable_parameters_changed(Module& module) {
  // Every rank changes the same layers at the same point (the callbacks run everywhere); the
  // buckets are built from the parameters that require a gradient now, in the same order on
  // every rank, so the all-reduces keep matching. Gradients accumulated so far (a step resumed
  // part accumulated) are copied into the new buckets by the Reducer. With gradients as bucket
  // views a frozen parameter still holds a zeroed view of the old buckets, which the optimizer
  // would step (momentum, weight decay) where one process holds none: it goes.
  if (options_.gradient_as_bucket_view()) {
    for (auto& p : module.parameters()) {
      if (!p.requires_grad() && p.grad().defined()) p.mutable_grad() = at::Tensor();
    }
  }
  build_reducer(module);
}

std::shared_ptr<void> DdpStrategy::training_forward_context(Module& module) {
  ModuleSync* m = find_sync(module);
  if (m == nullptr) return nullptr;
  if (options_.broadcast_buffers() && !m->buffers.empty()) {
    torch::NoGradGuard no_grad;
    group().broadcast_(m->buffers, 0);
    m->buffers_moved = true;  // the forward about to run updates each rank's own
  }
  // Backward needs no scope: the statistics' gradients are all-reduced by their autograd nodes.
  return sync_batchnorm_scope(module);
}

void DdpStrategy::validation_step(Module& module, const Batch& batch, int64_t batch_idx) {
  // Every rank runs the same validation steps (the sampler pads the shards), so all take part.
  // Buffers do not move in evaluation: once per pass is DDP's once per forward.
  ModuleSync* m = find_sync(module);
  if (m != nullptr && m->buffers_moved) {
    torch::NoGradGuard no_grad;
    group().broadcast_(m->buffers, 0);
    m->buffers_moved = false;
  }
  Strategy::validation_step(module, batch, batch_idx);
}

void DdpStrategy::backward(const at::Tensor& loss, Module& module, bool sync_gradients) {
  backward_through(loss, {{&module, sync_gradients}});
}

void DdpStrategy::backward_through(const at::Tensor& loss, const std::vector<Reached>& modules) {
  // Each reducer arms its buckets and runs the next one's backward inside its own, the last
  // running the one real backward: the modules' gradients all reach their buckets in one pass.
  std::function<void()> run = [&] {
    precision_->backward(loss, modules.empty() ? nullptr : modules.front().module);
  };
  for (auto it = modules.rbegin(); it != modules.rend(); ++it) {
    GradientReducer* r = reducer(*it->module);
    VOLT_CHECK(r != nullptr, InternalError,
               "[DdpStrategy] backward before setup_module(); the Trainer sets it up.");
    r->set_sync(it->sync_gradients);
    run = [r, &loss, inner = std::move(run)] { r->backward(loss, inner); };
  }
  run();
  agree_on_precision_state();
}

void DdpStrategy::agree_on_precision_state() {
  std::vector<at::Tensor> state = precision_->rank_max_state();
  if (state.empty() || world_size() == 1) return;
  group().all_reduce_(state, Reduce::kMax);  // in place (grad mode off), one per dtype
}

void DdpStrategy::zero_grad(torch::optim::Optimizer& optimizer) {
  if (!options_.gradient_as_bucket_view()) {
    Strategy::zero_grad(optimizer);
    return;
  }
  // Setting .grad to none would break its aliasing with the bucket: zero it in place. A frozen
  // parameter has no bucket any more (trainable_parameters_changed built them without it): its
  // gradient goes, or the optimizer would go on stepping it (weight decay, momentum) on zeros.
  torch::NoGradGuard no_grad;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (p.requires_grad()) {
        p.mutable_grad().zero_();
      } else {
        p.mutable_grad() = at::Tensor();
      }
    }
  }
}

at::Tensor DdpStrategy::reduce(const at::Tensor& value, Reduce op) const {
  return group().all_reduce(value, op);
}

at::Tensor DdpStrategy::broadcast(const at::Tensor& value, int64_t src) const {
  at::Tensor out = value.clone();
  group().broadcast_(out, src);
  return out;
}

std::vector<at::Tensor> DdpStrategy::all_gather(const at::Tensor& value) const {
  return group().all_gather(value);
}

void DdpStrategy::barrier(const std::string& name) {
  group().barrier();
}

void DdpStrategy::run_preparation(const std::string& name, bool per_node,
                                  const std::function<void()>& work) {
  // global_rank = node_rank * local_world_size + local_rank: each node's local rank 0.
  std::vector<int64_t> leaders{0};
  if (per_node) {
    for (int64_t node = 1; node < env_.num_nodes; ++node) {
      leaders.push_back(node * env_.local_world_size);
    }
  }
  group().run_on_leaders(name, leaders, work);
}

bool DdpStrategy::reduce_boolean_decision(bool decision, bool all) const {
  return all ? group().all_of(decision) : group().any_of(decision);
}

namespace {

constexpr double kStopVotePeriod = 0.1;  // seconds between votes, about
constexpr int64_t kMaxStopVoteInterval = 1000;

// Every rank's [signal, should_stop, time_up, proposed interval, val_due] combined: the largest
// signal, any should_stop, time_up or val_due, the smallest interval.
StopRequest combine_stop_votes(const std::vector<at::Tensor>& per_rank, int64_t* interval) {
  StopRequest out;
  int64_t next = kMaxStopVoteInterval;
  for (const auto& t : per_rank) {
    const at::Tensor v = t.to(at::kCPU);
    const int32_t* p = v.data_ptr<int32_t>();
    out.signal = std::max(out.signal, static_cast<int>(p[0]));
    out.should_stop = out.should_stop || p[1] != 0;
    out.time_up = out.time_up || p[2] != 0;
    next = std::min<int64_t>(next, std::max<int32_t>(p[3], 1));
    out.val_due = out.val_due || p[4] != 0;
  }
  *interval = next;
  return out;
}

bool any_request(const StopRequest& r) {
  return r.signal != 0 || r.should_stop || r.time_up;
}

}  // namespace

StopRequest DdpStrategy::agree_on_stop(const StopRequest& local, bool lagged) {
  if (world_size() == 1) return local;
  if (!stop_vote_) stop_vote_ = std::make_unique<StopVote>();
  StopVote& v = *stop_vote_;
  // Lagged calls between two votes send and receive nothing (a counter).
  ++v.calls;
  if (lagged) ++v.batches;
  if (lagged && v.calls < v.interval) return {};
  // This rank's proposal: the batches that take about kStopVotePeriod at its pace since the
  // last vote (1 before there is one).
  // Votes with no batch between them (back to back at the fit's start or an epoch's boundary)
  // measure no pace: the interval stays. Measured there, the pace read as microseconds a batch
  // and proposed 1000 batches, so no lagged vote came in the whole first epoch: a
  // request_stop() on one rank or a due time-based validation waited for the epoch's end.
  const auto now = std::chrono::steady_clock::now();
  int64_t proposal = 1;
  if (v.last != std::chrono::steady_clock::time_point{}) {
    const double per_call =
        std::chrono::duration<double>(now - v.last).count() / static_cast<double>(v.calls);
    proposal = v.batches == 0  ? v.interval
               : per_call <= 0 ? kMaxStopVoteInterval
                               : std::clamp<int64_t>(std::llround(kStopVotePeriod / per_call), 1,
                                                     kMaxStopVoteInterval);
  }
  v.batches = 0;
  v.calls = 0;
  v.last = now;
  // The previous vote ran on Gloo's threads while the batches since computed; the k-th result
  // is the same on every rank, since every rank starts the same votes in the same order.
  StopRequest agreed;
  if (v.pending.pending()) {
    agreed = combine_stop_votes(v.pending.wait(), &v.interval);
    // The ranks leave the loop on this result, and none starts another vote: still paired.
    if (any_request(agreed)) return agreed;
  }
  const at::Tensor mine =
      at::tensor({static_cast<int32_t>(local.signal), static_cast<int32_t>(local.should_stop),
                  static_cast<int32_t>(local.time_up), static_cast<int32_t>(proposal),
                  static_cast<int32_t>(local.val_due)},
                 at::kInt);
  v.pending = detail::start_all_gather(group_, mine);
  if (lagged) return agreed;
  return combine_stop_votes(v.pending.wait(), &v.interval);
}

void DdpStrategy::save_accumulated_gradients(const Module& module,
                                             torch::serialize::OutputArchive& ar) const {
  // Every rank's partial sums differ (no_sync): keep each, under "rank<r>.<name>". The plain
  // name holds their mean, which is what one process on the global batch would have
  // accumulated; a resume at another world size reads it (ranks without their own entry).
  for (const auto& p : module.named_parameters(true)) {
    if (!p.value().requires_grad()) continue;
    const at::Tensor g =
        p.value().grad().defined() ? p.value().grad() : torch::zeros_like(p.value());
    const auto all = group().all_gather(g.contiguous());
    for (size_t r = 0; r < all.size(); ++r) ar.write(detail::rank_key(r, p.key()), all[r]);
    ar.write(p.key(), torch::stack(all).mean(0));
  }
}

void DdpStrategy::load_accumulated_gradients(Module& module, torch::serialize::InputArchive& ar) {
  // Each rank's own partial sum when the checkpoint's world was this one or smaller (a rank it
  // lacks reads the mean, so the next average is the mean of the micro-batches seen); a larger
  // world's partial sums are all in the mean only, so every rank reads that (its own would drop
  // the ranks beyond this world's).
  auto params = module.named_parameters(true);
  bool larger_world = false;
  for (const auto& p : params) {
    at::Tensor probe;
    larger_world = larger_world || ar.try_read(detail::rank_key(world_size(), p.key()), probe);
  }
  for (auto& p : params) {
    at::Tensor g;
    if ((!larger_world && ar.try_read(detail::rank_key(rank(), p.key()), g)) ||
        ar.try_read(p.key(), g)) {
      p.value().mutable_grad() = g.to(p.value().device());
    }
  }
}

std::map<std::string, at::Tensor> DdpStrategy::rng_states() const {
  std::map<std::string, at::Tensor> own = Strategy::rng_states();
  std::map<std::string, at::Tensor> out = own;
  for (const auto& kv : own) {
    const auto all = group().all_gather(kv.second.contiguous());
    for (size_t r = 0; r < all.size(); ++r) out[detail::rank_key(r, kv.first)] = all[r];
  }
  return out;
}

void DdpStrategy::set_rng_states(const std::map<std::string, at::Tensor>& states) {
  // This rank's own stream when the checkpoint has it (same world size), else rank 0's.
  std::map<std::string, at::Tensor> mine;
  for (const auto& kv : states) {
    if (kv.first.rfind("rank", 0) == 0) continue;
    auto it = states.find(detail::rank_key(rank(), kv.first));
    mine[kv.first] = it != states.end() ? it->second : kv.second;
  }
  Strategy::set_rng_states(mine);
}

namespace {

// `write` on this rank, then every rank learns whether rank 0's succeeded (where a barrier
// stood): rank 0 rethrows its own error, the others stop at once with a CheckpointError saying
// so, instead of going on into collectives rank 0 never reaches.
void agree_on_write(DdpStrategy& s, const std::string& path, const std::function<void()>& write) {
  VOLT_CHECK(detail::run_agreeing(s, /*mine=*/true, write), CheckpointError,
             "[DdpStrategy] rank 0 could not write the checkpoint",
             path.empty() ? std::string() : " '" + path + "'",
             " (its error says why); every rank stops.");
}

}  // namespace

void DdpStrategy::save_checkpoint(torch::serialize::OutputArchive& archive,
                                  const std::string& path) {
  // Rank 0 writes, or queues the write (AsyncCheckpointIO; flush_checkpoints waits for it).
  agree_on_write(*this, path, [&] { Strategy::save_checkpoint(archive, path); });
}

void DdpStrategy::flush_checkpoints() {
  agree_on_write(*this, "", [&] { Strategy::flush_checkpoints(); });
}

std::ostream& operator<<(std::ostream& os, const DdpStrategyOptions& o) {
  return os << "DdpStrategyOptions(bucket_cap_mb=" << o.bucket_cap_mb()
            << ", gradient_as_bucket_view=" << o.gradient_as_bucket_view()
            << ", static_graph=" << o.static_graph()
            << ", find_unused_parameters=" << o.find_unused_parameters()
            << ", broadcast_buffers=" << o.broadcast_buffers() << ", timeout_s=" << o.timeout_s()
            << ", process_group_backend=" << detail::quoted(o.process_group_backend())
            << ", max_restarts=" << o.max_restarts() << ")";
}

}  // namespace volt
