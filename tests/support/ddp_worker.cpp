// One DDP training job for tests/strategies/ddp_test.cpp. Started as a plain process it launches
// its local workers itself (the Trainer's DdpStrategy re-executes this binary); started with
// torchrun / Slurm variables it is one rank of that job. Every rank writes its final flat
// parameters to <out>.rank<R>.pt and prints one line "rank R done step=S sum=X".
//
//   volt_ddp_worker --root DIR --out PREFIX --devices N [--nodes M] [--batch B] [--epochs E]
//       [--accum K] [--bucket-view 0|1] [--dropout 0|1] [--tied 0|1] [--ckpt-every-step 0|1]
//       [--ckpt-every-batch 0|1|2 (2: rank R names <root>/every_batch_rank<R>.ckpt)]
//       [--async-ckpt 0|1 (AsyncCheckpointIO)] [--resume CKPT] [--die-rank
//       R (--die-step S | --die-batch B)] [--die-signal N]  (the signal rank R raises; default 9,
//       SIGKILL; 15 or 2 ask for a graceful stop)
//       [--stop-rank R --stop-batch B]  (rank R alone calls request_stop() after B batches)
//       [--skip-rank R --skip-batch B]  (rank R, -2 every rank, calls skip_rest_of_epoch() in
//       on_train_batch_start at batch B of epoch 0; the module sets may_skip_rest_of_epoch
//       unless --skip-undeclared 1)
//       [--on-exception-ckpt 0|1]  (an OnExceptionCheckpoint writing <root>/oe/on_exception.ckpt)
//       [--sleep-ms MS]  (every training batch sleeps that long: time to send signals)
//       [--val-every-s S --val-end-sleep-ms MS]  (val_check_interval_s S; rank 1 sleeps MS at
//       each validation's end, so its clock lags rank 0's; prints "rank R validated_at=a,b,")
//       [--timeout S] [--samples N] [--sync-dist 0|1] [--max-restarts K]
//       [--evaluate CKPT]  (no fit: validate from CKPT and predict the validation set; prints
//                           "rank R evaluated val_loss=... infer_params=..." and writes the
//                           weights and predictions; --predict-rows N predicts N other rows)
//       [--ignore-sigchld 1]  (SIGCHLD set to SIG_IGN before anything else)
//       [--own-zero-grad 1]  (optimizer_zero_grad calls optimizer.zero_grad() itself)
//       [--cxx-locale NAME --locale-rank R]  (local rank R, default 1, first makes NAME the C++
//       global locale, as a program calling std::locale::global(std::locale("")) does)
//       [--unused 0|1] [--spare-on-rank R] [--find-unused 0|1] [--static-graph 0|1] [--precision
//       NAME] [--bf16-all 1]
//       [--loss-scale INIT]  (with --bf16-all: dynamic loss scaling, growth every 2 steps)
//       [--linear-min-macs N]  (bf16-mixed whose GEMMs under N multiply-adds stay fp32)
//       [--nan-grad-at CALL]  (that training_step call gives one element of b2 a NaN gradient)
//       [--profile 0|1]  (a TorchProfiler writing <root>/prof/fit-ddp-rank<R>.pt.trace.json)
//       [--zero STAGE]  (DeepSpeedStrategy with ZeRO stage 1 or 2 instead of DdpStrategy)
//       [--tp N]  (ModelParallelStrategy, tensor_parallel_size N: fc1 rowwise, deep.0 colwise,
//       head rowwise; needs --depth >= 1; --find-unused and --static-graph set its options; each
//       rank prints its gradient reducer's bucket elements at the first step)
//       [--tp-plan "ENTRY,ENTRY"]  (another plan for --tp, e.g. "fc1=rowwise")
//       [--deep-scale 1]  (a whole scalar parameter "scale" multiplies each deep layer's output:
//       under --tp it meets deep.0's split output, so each rank gets part of its gradient)
//       [--partial-grads "NAME,NAME"]  (--tp: ModelParallelStrategyOptions::partial_grads)
//       [--save-distributed 0|1]  (--tp: save_distributed_checkpoint; default the option's)
//       [--optimizer sgd|adam|adamw|fused_adamw|none] [--clip NORM] [--width W] [--bucket ELEMENTS]
//       [--ds-config JSON]  (DeepSpeedStrategy configured by a DeepSpeed JSON file or text)
//       [--persist ELEMENTS] [--max-live ELEMENTS]  (stage 3: persistence threshold, live bound)
//       [--depth D]  (D more Linear(width, width) layers)
//       [--batchnorm 0|1]  (a BatchNorm1d after fc1) [--sync-bn 0|1]
//       [--trace 0|1]  (TrainerOptions::trace_training_step)
//       [--own-shard 1]  (the training loader sharded by the program, unpadded: with --samples
//       129 and --batch 8 rank 0 has 9 batches, rank 1 8)
//       [--combined 1]  (trains on volt::combined_loader: "a" the training set, "b" 48 more
//       samples in batches of half the batch; max_size_cycle; the step sums the parts' losses)
//       [--ema D]  (EMAWeightAveraging with decay D: the written weights are the average)
//       [--prune F]  (ModelPruning: global L1 pruning of fraction F after each epoch, with the
//       lottery ticket rewind)
//       [--freeze-at E]  (a callback freezing fc1 when epoch E starts)
//       [--freeze-all 1]  (with --evaluate: no parameter requires a gradient)
//       [--epoch-metric 1]  (logs "rank_mean", sync_dist per epoch; prints its last value)
//       [--es-diverge-rank R]  (an EarlyStopping, verbose, divergence_threshold 10, on
//       "es_metric": 1 on every rank, 100 on rank R from epoch 1; prints its stopping_reason)
//       [--es-rank-zero-only 0|1]  (its log_rank_zero_only)
//       [--frozen-fc1 1]  (fc1 frozen from the start, its parameters in the optimizer all the
//                          same, as Adam(module.parameters()) with a frozen backbone)
//       [--buffer-probe 1]  (prints how far each rank's buffers are from rank 0's at the end
//                            of each validation of fit)
//       [--finetune E]  (BackboneFinetuning of fc1, unfrozen at epoch E: from then on its
//       gradients are reduced too, DDP rebuilding its buckets)
//       (TrainerOptions::sync_batchnorm)
//       [--checkpoint-activations 0|1]  (fc1+dropout and each deep layer under volt::checkpoint)
//       [--master-weights 0|1]  (DeepSpeedStrategyOptions::master_weights; default 1)
//       [--nvme DIR] [--sub-group ELEMENTS] [--aio-uring 0|1]  (optimizer state offloaded to NVMe
//       swap files under DIR, ZeRO-Infinity)
//       (with --zero, rank lines add "zero_memory params=P grads=G state=S master=M numel=N
//       nvme=F", F: optimizer state bytes in the NVMe swap file)
//       [--lr-find N]  (LearningRateFinder: N rates from 1e-3 to 1 when fit starts; every rank
//       writes its lrs, losses and the suggested rate to <out>.lrfind.rank<R>.pt)
//       [--spike-rank R --spike-call K]  (rank R's loss is 50 times its value in training_step
//                                         call K; with SpikeDetection writing <root>/skip.json)
//       [--die-call K]  (with --die-rank R: rank R SIGKILLs itself in training_step call K,
//       counted from 0 over the process's trials and fit; prints "rank R dies in call K")
//       [--prepare-ms MS]  (prepare_data sleeps MS, then appends "rank R" to <root>/prepared;
//       setup throws unless that file has a line) [--prepare-fail 1] (prepare_data throws after
//       the sleep) [--prepare-die R] (rank R SIGKILLs itself there, after the sleep)
//
// Exit: 0 done, 1 a volt error (printed on one line), 2 bad usage, 128 + N stopped by signal N
// (volt::Interrupted; prints "rank R interrupted: <what>").

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <locale>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "tiny.h"
#include "volt/nn/checkpoint.h"
#include "volt/nn/parameters.h"
#include "volt/strategies/deepspeed.h"
#include "volt/strategies/model_parallel.h"

namespace {

/// An MLP (optionally with dropout, tied weights, or a layer forward never uses) logging train
/// and val loss.
class Net : public volt::Module {
 public:
  Net(bool dropout, bool tied, bool sync_dist, bool unused, int64_t width, std::string optimizer,
      int64_t depth, bool batchnorm)
      : sync_dist_(sync_dist), optimizer_(std::move(optimizer)) {
    fc1 = register_module("fc1", torch::nn::Linear(8, width));
    if (batchnorm) bn = register_module("bn", torch::nn::BatchNorm1d(width));
    // Weight sharing (reference 003 "Weight Sharing"): with `tied` the second layer's weight is
    // fc1's tensor under a second name, as `module.a = module.b` in the reference.
    w2 = register_parameter("w2", tied ? fc1->weight : torch::randn({width, width}) * 0.3);
    b2 = register_parameter("b2", torch::zeros({width}));
    head = register_module("head", torch::nn::Linear(width, 2));
    drop = register_module("drop", torch::nn::Dropout(dropout ? 0.2 : 0.0));
    if (unused) spare = register_module("spare", torch::nn::Linear(8, 8));  // gets no gradient
    deep = register_module("deep", torch::nn::ModuleList());
    for (int64_t i = 0; i < depth; ++i) deep->push_back(torch::nn::Linear(width, width));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto first = [this](const torch::Tensor& t) {
      auto h = fc1(t);
      if (bn) h = bn(h);
      return drop->forward(torch::relu(h));
    };
    auto h = checkpoint_activations ? volt::checkpoint(first, x) : first(x);
    h = torch::relu(torch::linear(h, w2, b2));
    for (const auto& layer : *deep) {
      auto* lin = layer->as<torch::nn::Linear>();
      auto block = [this, lin](const torch::Tensor& t) {
        auto y = torch::relu(lin->forward(t));
        return scale.defined() ? y * scale : y;
      };
      h = checkpoint_activations ? volt::checkpoint(block, h) : block(h);
    }
    auto out = head->forward(h);
    // --spare-on-rank R: only rank R's forward uses the spare layer (a data-dependent branch).
    if (spare && spare_on_rank >= 0 && run() != nullptr && run()->global_rank() == spare_on_rank) {
      out = out + 0.1 * spare->forward(x).mean();
    }
    return out;
  }
  // --prepare-ms / --prepare-fail / --prepare-die: what prepare_data does ("" log: nothing).
  std::string prepare_log;
  int64_t prepare_ms = 0;
  bool prepare_fail = false;
  int64_t prepare_die = -1;
  void prepare_data() override {
    if (prepare_log.empty()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(prepare_ms));
    if (run()->global_rank() == prepare_die) ::raise(SIGKILL);
    if (prepare_fail) throw std::runtime_error("no network to download the data set from");
    std::filesystem::create_directories(std::filesystem::path(prepare_log).parent_path());
    std::ofstream(prepare_log, std::ios::app) << "rank " << run()->global_rank() << "\n";
  }
  void setup(volt::Stage) override {
    if (prepare_log.empty()) return;
    std::ifstream in(prepare_log);
    std::string line;
    if (!std::getline(in, line)) throw std::runtime_error("setup ran before prepare_data ended");
  }
  bool checkpoint_activations = false;
  int64_t nan_grad_at = -1;  // this training_step call gives b2's last element a NaN gradient
  int64_t die_rank = -1, die_call = -1;      // --die-rank with --die-call
  int64_t spike_rank = -1, spike_call = -1;  // --spike-rank with --spike-call
  int64_t calls = 0;
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    if (calls == die_call && run()->global_rank() == die_rank) {
      std::printf("rank %lld dies in call %lld\n", static_cast<long long>(die_rank),
                  static_cast<long long>(calls));
      std::fflush(stdout);
      ::raise(SIGKILL);
    }
    torch::Tensor loss;
    if (b.input.defined()) {
      loss = torch::cross_entropy_loss(forward(b.input), b.target);
    } else {  // --combined: each part's loss
      loss = torch::zeros({});
      for (const auto& name : b.part_names()) {
        const volt::Batch part = b.part(name);
        loss = loss + torch::cross_entropy_loss(forward(part.input), part.target);
      }
    }
    if (calls == spike_call && run()->global_rank() == spike_rank) loss = loss * 50.0;
    if (calls++ == nan_grad_at) {
      // sqrt(x - x): 0 forward (the loss stays finite), NaN backward (inf - inf).
      const auto last = b2.narrow(0, b2.size(0) - 1, 1);
      loss = loss + torch::sqrt(last - last).sum();
    }
    log("train_loss", loss, volt::LogOptions().sync_dist(sync_dist_));
    if (epoch_metric) {  // a per-epoch mean over every rank's batches: 100 x rank + batch index
      log("rank_mean", torch::tensor(100.0 * static_cast<double>(run()->global_rank()) + i),
          volt::LogOptions().on_step(false).on_epoch(true).sync_dist(true));
    }
    return loss;
  }
  bool epoch_metric = false;
  // --skip-rank / --skip-batch.
  int64_t skip_rank = -1, skip_batch = -1;
  void on_train_batch_start(const volt::Batch&, int64_t i) override {
    if (skip_batch >= 0 && current_epoch() == 0 && i == skip_batch &&
        (skip_rank == -2 || run()->global_rank() == skip_rank)) {
      skip_rest_of_epoch();
    }
  }
  // --gather-val 1: each validation pass's logits on this rank and as all_gather gives them.
  bool gather_val = false;
  std::vector<torch::Tensor> own_logits, gathered_logits;
  int64_t estimated_steps = -1;  // estimated_stepping_batches() in configure_optimizers
  void on_validation_epoch_start() override {
    own_logits.clear();
    gathered_logits.clear();
  }
  int64_t es_diverge_rank = -1;  // --es-diverge-rank: "es_metric" jumps there from epoch 1
  void validation_step(const volt::Batch& b, int64_t) override {
    if (es_diverge_rank >= 0) {
      log("es_metric", volt::log_rank() == es_diverge_rank && current_epoch() >= 1 ? 100.0 : 1.0);
    }
    auto logits = forward(b.input);
    if (gather_val) {
      own_logits.push_back(logits);
      gathered_logits.push_back(all_gather(logits));  // [world, rows, 2]
    }
    log("val_loss", torch::cross_entropy_loss(logits, b.target),
        volt::LogOptions().sync_dist(sync_dist_));
  }
  torch::Tensor predict_step(const volt::Batch& b, int64_t) override { return forward(b.input); }
  // --own-zero-grad 1: the override a user writes, clearing the optimizer's own tensors.
  bool own_zero_grad = false;
  bool optimize_frozen = false;  // the optimizer gets the frozen parameters too
  void optimizer_zero_grad(int64_t epoch, int64_t batch_idx,
                           torch::optim::Optimizer& optimizer) override {
    if (own_zero_grad) {
      optimizer.zero_grad();
    } else {
      volt::Module::optimizer_zero_grad(epoch, batch_idx, optimizer);
    }
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    // A tied tensor appears under two names: give the optimizer each tensor once; frozen ones
    // (--finetune) are added by the callback when unfrozen.
    std::vector<torch::Tensor> unique;
    for (auto& p : volt::distinct_parameters(*this)) {
      if (p.requires_grad() || optimize_frozen) unique.push_back(p);
    }
    estimated_steps = estimated_stepping_batches();
    if (optimizer_ == "none") return {};  // left to the strategy (a DeepSpeed JSON's optimizer)
    if (optimizer_ == "adam") {
      opt = std::make_shared<torch::optim::Adam>(
          unique, torch::optim::AdamOptions(0.01).weight_decay(0.01));
    } else if (optimizer_ == "adamw") {
      opt = std::make_shared<torch::optim::AdamW>(unique, torch::optim::AdamWOptions(0.01));
    } else if (optimizer_ == "plain_sgd") {  // no momentum: the optimizer keeps no state
      opt = std::make_shared<torch::optim::SGD>(unique, torch::optim::SGDOptions(0.1));
    } else if (optimizer_ == "fused_adamw") {
      opt = std::make_shared<volt::FusedAdamW>(unique, volt::FusedAdamWOptions(0.01));
    } else {
      opt =
          std::make_shared<torch::optim::SGD>(unique, torch::optim::SGDOptions(0.1).momentum(0.9));
    }
    return {volt::OptimizerConfig(opt)};
  }
  torch::Tensor flat() {
    std::vector<torch::Tensor> v;
    for (auto& p : parameters()) v.push_back(p.detach().reshape({-1}));
    // With --batchnorm, its running statistics too (not every buffer: fp8 keeps state in some).
    if (bn) {
      v.push_back(bn->running_mean.detach().reshape({-1}));
      v.push_back(bn->running_var.detach().reshape({-1}));
    }
    return torch::cat(v).clone();
  }
  torch::nn::Linear fc1{nullptr}, head{nullptr}, spare{nullptr};
  int64_t spare_on_rank = -1;
  torch::nn::BatchNorm1d bn{nullptr};  // --batchnorm 1: after fc1
  torch::Tensor w2, b2;
  torch::Tensor scale;  // --deep-scale 1: multiplies each deep layer's output
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList deep{nullptr};           // --depth more Linear(width, width) layers
  std::shared_ptr<torch::optim::Optimizer> opt;  // the last one configure_optimizers built

 private:
  bool sync_dist_;
  std::string optimizer_;
};

/// Raises `signal` (SIGKILL unless told) in global rank `rank` at the end of the first batch
/// after which optimizer step `step` is done (or, with `batch` >= 0, after that many training
/// batches).
class DieAt : public volt::Callback {
 public:
  DieAt(int64_t rank, int64_t step, int64_t batch, int signal)
      : rank_(rank), step_(step), batch_(batch), signal_(signal) {}
  std::string state_key() const override { return "DieAt"; }
  void on_train_batch_end(volt::RunContext& run, volt::Module&, const volt::Batch&,
                          int64_t) override {
    const bool due =
        batch_ >= 0 ? run.state().total_batches_done == batch_ : run.state().global_step == step_;
    // Only in the first attempt: a process relaunched by an elastic restart has
    // VOLT_RESTART_COUNT >= 1 (volt's restarts) or TORCHELASTIC_RESTART_COUNT >= 1 (torchrun's).
    auto first = [](const char* var) {
      const char* v = std::getenv(var);
      return v == nullptr || std::string(v) == "0";
    };
    const bool first_attempt = first("VOLT_RESTART_COUNT") && first("TORCHELASTIC_RESTART_COUNT");
    if (rank_ >= 0 && due && first_attempt && volt::log_rank() == rank_) {
      std::printf("rank %lld %s at step %lld\n", static_cast<long long>(rank_),
                  signal_ == SIGKILL ? "dies" : "raises its signal",
                  static_cast<long long>(run.state().global_step));
      std::fflush(stdout);
      ::raise(signal_);
    }
  }

 private:
  int64_t rank_, step_, batch_;
  int signal_;
};

/// Global rank `rank` alone asks to stop after `batch` training batches (as a Timer on a rank
/// whose clock runs ahead would); every batch may also sleep `sleep_ms`.
class StopAt : public volt::Callback {
 public:
  StopAt(int64_t rank, int64_t batch, int64_t sleep_ms)
      : rank_(rank), batch_(batch), sleep_ms_(sleep_ms) {}
  std::string state_key() const override { return "StopAt"; }
  void on_train_batch_end(volt::RunContext& run, volt::Module&, const volt::Batch&,
                          int64_t) override {
    if (sleep_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_));
    if (rank_ >= 0 && volt::log_rank() == rank_ && run.state().total_batches_done == batch_) {
      run.request_stop();
    }
  }

 private:
  int64_t rank_, batch_, sleep_ms_;
};

/// Records after which of the fit's batches each validation ran; rank 1 sleeps at each end.
class ValidatedAt : public volt::Callback {
 public:
  explicit ValidatedAt(int64_t sleep_ms) : sleep_ms_(sleep_ms) {}
  std::string state_key() const override { return "ValidatedAt"; }
  void on_validation_end(volt::RunContext& run, volt::Module&) override {
    if (run.sanity_checking()) return;
    at += std::to_string(run.state().total_batches_done) + ",";
    if (volt::log_rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_));
  }
  std::string at;

 private:
  int64_t sleep_ms_;
};

/// Writes a full checkpoint after every training batch (mid-accumulation included).
/// per_rank: each rank names its own path (<stem>_rank<R>.ckpt), as ranks naming checkpoints
/// after metrics they did not synchronise do.
class EveryBatch : public volt::Callback {
 public:
  EveryBatch(std::string stem, bool per_rank) : stem_(std::move(stem)), per_rank_(per_rank) {}
  std::string state_key() const override { return "EveryBatch"; }
  void on_train_batch_end(volt::RunContext& run, volt::Module&, const volt::Batch&,
                          int64_t) override {
    run.save_checkpoint(stem_ + (per_rank_ ? "_rank" + std::to_string(run.global_rank()) : "") +
                        ".ckpt");
  }

 private:
  std::string stem_;
  bool per_rank_;
};

/// Freezes fc1 when epoch `epoch` starts (a program's own fine-tuning schedule): from then on
/// the optimizer must leave it as it is, whatever the strategy keeps its gradients in.
class FreezeAt : public volt::Callback {
 public:
  explicit FreezeAt(int64_t epoch) : epoch_(epoch) {}
  std::string state_key() const override { return "FreezeAt"; }
  void on_train_epoch_start(volt::RunContext& run, volt::Module& m) override {
    if (run.state().epoch != epoch_) return;
    for (auto& p : dynamic_cast<Net&>(m).fc1->parameters()) p.set_requires_grad(false);
  }

 private:
  int64_t epoch_;
};

/// Prints, at the first optimizer step, what the strategy's gradient reducer of the module
/// averages: its bucket elements (the rank's shards under model_parallel), or that it has none.
class ReducerProbe : public volt::Callback {
 public:
  explicit ReducerProbe(const volt::DdpStrategy* strategy) : strategy_(strategy) {}
  std::string state_key() const override { return "ReducerProbe"; }
  void on_before_optimizer_step(volt::RunContext&, volt::Module& module,
                                torch::optim::Optimizer&) override {
    if (printed_) return;
    printed_ = true;
    const volt::GradientReducer* r = strategy_->reducer(module);
    int64_t elements = 0;
    if (r != nullptr) {
      for (const auto& b : r->bucket_buffers()) elements += b.numel();
    }
    std::printf("rank %lld gradient reducer: %s %lld elements\n",
                static_cast<long long>(volt::log_rank()), r != nullptr ? "buckets of" : "none,",
                static_cast<long long>(elements));
    std::fflush(stdout);
  }

 private:
  const volt::DdpStrategy* strategy_;
  bool printed_ = false;
};

/// Prints where training starts (after a resume) and the val_loss every rank sees.
class PrintVal : public volt::Callback {
 public:
  std::string state_key() const override { return "PrintVal"; }
  void on_train_start(volt::RunContext& run, volt::Module&) override {
    std::printf("rank %lld starts at step %lld\n", static_cast<long long>(volt::log_rank()),
                static_cast<long long>(run.state().global_step));
    std::fflush(stdout);
  }
  void on_validation_end(volt::RunContext& run, volt::Module&) override {
    // With several validation loaders (--val-loaders 2) each has its own name.
    const auto& m = run.callback_metrics();
    auto it = m.find("val_loss");
    if (it == m.end()) it = m.find("val_loss/dataloader_idx_0");
    if (it != m.end()) last = it->second;
    auto second = m.find("val_loss/dataloader_idx_1");
    if (second != m.end()) last1 = second->second;
  }
  double last = -1, last1 = -1;
};

/// --buffer-probe 1: the largest difference between this rank's floating-point buffers and rank
/// 0's at the end of each validation of fit (a validation runs with rank 0's buffers on every
/// rank, as through a DDP-wrapped module).
class BufferProbe : public volt::Callback {
 public:
  std::string state_key() const override { return "BufferProbe"; }
  explicit BufferProbe(const volt::Strategy* strategy) : strategy_(strategy) {}
  void on_validation_end(volt::RunContext& run, volt::Module& m) override {
    if (run.sanity_checking()) return;
    for (const auto& b : m.buffers()) {
      if (!b.is_floating_point()) continue;
      const at::Tensor mine = b.detach().clone();
      const at::Tensor zeros = strategy_->broadcast(mine, 0);
      diff = std::max(diff, (zeros - mine).abs().max().item<double>());
    }
    std::printf("rank %lld validation buffers differ from rank 0's by %.17g\n",
                static_cast<long long>(volt::log_rank()), diff);
    std::fflush(stdout);
  }
  double diff = 0;

 private:
  const volt::Strategy* strategy_;
};

/// Reads the ZeRO engine's per-rank bytes at the end of training (before stage 3 gathers the
/// parameters back at teardown).
class ZeroMemoryProbe : public volt::Callback {
 public:
  explicit ZeroMemoryProbe(volt::DeepSpeedStrategy* strategy) : strategy_(strategy) {}
  std::string state_key() const override { return "ZeroMemoryProbe"; }
  // Before each step: gradients are complete and (from the second step) the optimizer state
  // exists; stage 3's parameters are released between forward/backward scopes.
  // The optimizer the step runs (configure_optimizers' or one a DeepSpeed JSON built).
  void on_before_optimizer_step(volt::RunContext&, volt::Module&,
                                torch::optim::Optimizer& optimizer) override {
    const volt::ZeroEngine* e = strategy_->engine(optimizer);
    if (e == nullptr) return;
    const volt::ZeroMemory m = strategy_->memory(optimizer);
    int64_t numel = 0, max_chunk = 0;
    for (const auto& c : e->chunks()) {
      numel += c.numel;
      if (c.partitioned) max_chunk = std::max(max_chunk, c.length);
    }
    text = " zero_memory params=" + std::to_string(m.parameters) +
           " grads=" + std::to_string(m.gradients) + " state=" + std::to_string(m.optimizer_state) +
           " master=" + std::to_string(m.master_weights) + " numel=" + std::to_string(numel) +
           " nvme=" + std::to_string(m.optimizer_state_in_files) +
           " params_in_files=" + std::to_string(m.parameters_in_files);
    const volt::ZeroEngine::CommStats& c = e->comm_stats();
    text += " zero_comm reductions=" + std::to_string(c.reductions) +
            " overlapped=" + std::to_string(c.overlapped) +
            " gathers=" + std::to_string(c.gathers) +
            " prefetched=" + std::to_string(c.prefetched) +
            " discarded=" + std::to_string(c.prefetch_discarded) +
            " step_chunk_peak=" + std::to_string(c.step_chunk_peak) +
            " max_chunk=" + std::to_string(max_chunk);
  }
  std::string text;

 private:
  volt::DeepSpeedStrategy* strategy_;
};

/// --evaluate: in validate and predict, the ZeRO-Inference engine's bytes (read at each batch's
/// end, between the steps' scopes, when stage 3 has released the gathered weights), whether
/// fc1's weight was released then, and each predict batch's input and prediction.
class InferenceProbe : public volt::Callback {
 public:
  InferenceProbe(volt::DeepSpeedStrategy* strategy, torch::nn::Linear fc1)
      : strategy_(strategy), fc1_(std::move(fc1)) {}
  std::string state_key() const override { return "InferenceProbe"; }
  // The peak tensor bytes the first entry point adds between the callbacks' setup and its start:
  // the strategy's setup and reading the checkpoint.
  void setup(volt::RunContext&, volt::Module&, volt::Stage) override {
    if (load_peak >= 0) return;
    volt::reset_cpu_memory_peaks();
    base_ = volt::cpu_memory_stats().in_use;
  }
  void on_validation_start(volt::RunContext&, volt::Module&) override {
    if (load_peak < 0) load_peak = volt::cpu_memory_stats().max_in_use - base_;
  }
  void on_validation_batch_end(volt::RunContext&, volt::Module& module, const volt::Batch&,
                               int64_t) override {
    read(module);
  }
  void on_predict_batch_end(volt::RunContext&, volt::Module& module, const at::Tensor& prediction,
                            const volt::Batch& batch, int64_t) override {
    read(module);
    inputs.push_back(batch.input.clone());
    predictions.push_back(prediction.clone());
  }
  int64_t params = -1, params_in_files = -1, full = -1, load_peak = -1;
  bool released = true;
  std::vector<at::Tensor> inputs, predictions;

 private:
  void read(volt::Module& module) {
    const volt::ZeroEngine* e = strategy_ ? strategy_->inference_engine(module) : nullptr;
    if (e == nullptr) {
      released = false;
      return;
    }
    const volt::ZeroMemory m = e->memory();
    params = m.parameters;
    params_in_files = m.parameters_in_files;
    full = 0;
    for (const auto& c : e->chunks()) full += c.numel * c.parameter.element_size();
    released = released && fc1_->weight.storage().nbytes() == 0;
  }
  volt::DeepSpeedStrategy* strategy_;
  torch::nn::Linear fc1_;
  int64_t base_ = 0;
};

/// A /proc/self/status field in KiB (VmRSS, VmHWM), or -1.
long status_kib(const char* field) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long value = -1;
  const size_t n = std::strlen(field);
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, field, n) == 0 && line[n] == ':') value = std::atol(line + n + 1);
  }
  std::fclose(f);
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 1; i + 1 < argc; i += 2) a[argv[i]] = argv[i + 1];
  auto num = [&](const char* k, int64_t def) { return a.count(k) ? std::stoll(a[k]) : def; };
  if (!a.count("--root") || !a.count("--out")) {
    std::fprintf(stderr, "usage: volt_ddp_worker --root DIR --out PREFIX --devices N ...\n");
    return 2;
  }
  // --ignore-sigchld 1: the program ignores SIGCHLD (a daemon's habit), which makes the kernel
  // discard its children's exit statuses.
  if (num("--ignore-sigchld", 0) != 0) ::signal(SIGCHLD, SIG_IGN);
  try {
    if (a.count("--cxx-locale")) {
      const char* local = std::getenv("LOCAL_RANK");
      if ((local != nullptr ? std::atoll(local) : 0) == num("--locale-rank", 1)) {
        std::locale::global(std::locale(a["--cxx-locale"]));
      }
    }
    // Every tensor counted from the start: fit()'s peak tensor bytes are exact (RSS also holds
    // what the C allocator keeps after frees).
    volt::install_counting_cpu_allocator();
    volt::seed_everything(7);
    Net model(num("--dropout", 0) != 0, num("--tied", 0) != 0, num("--sync-dist", 0) != 0,
              num("--unused", 0) != 0, num("--width", 8),
              a.count("--optimizer") ? a["--optimizer"] : "sgd", num("--depth", 0),
              num("--batchnorm", 0) != 0);
    model.checkpoint_activations = num("--checkpoint-activations", 0) != 0;
    if (num("--deep-scale", 0) != 0) {
      model.scale = model.register_parameter("scale", torch::full({}, 1.5));
    }
    model.nan_grad_at = num("--nan-grad-at", -1);
    model.spare_on_rank = num("--spare-on-rank", -1);
    model.own_zero_grad = num("--own-zero-grad", 0) != 0;
    model.epoch_metric = num("--epoch-metric", 0) != 0;
    model.skip_rank = num("--skip-rank", -1);
    model.skip_batch = num("--skip-batch", -1);
    model.set_may_skip_rest_of_epoch(model.skip_batch >= 0 && num("--skip-undeclared", 0) == 0);
    if (num("--frozen-fc1", 0) != 0) {  // fc1 frozen, and in the optimizer all the same
      for (auto& p : model.fc1->parameters()) p.requires_grad_(false);
      model.optimize_frozen = true;
    }
    if (a.count("--die-call")) {  // the step callback (DieAt) does not reach a tuner's trials
      model.die_rank = num("--die-rank", -1);
      model.die_call = num("--die-call", -1);
    }
    model.gather_val = num("--gather-val", 0) != 0;
    model.es_diverge_rank = num("--es-diverge-rank", -1);
    model.spike_rank = num("--spike-rank", -1);
    model.spike_call = num("--spike-call", -1);
    if (a.count("--prepare-ms")) {
      model.prepare_log = a["--root"] + "/prepared";
      model.prepare_ms = num("--prepare-ms", 0);
      model.prepare_fail = num("--prepare-fail", 0) != 0;
      model.prepare_die = num("--prepare-die", -1);
    }
    auto train = volt_test::blobs(num("--samples", 128), 8, 1);
    auto val = volt_test::blobs(64, 8, 2);
    volt::DdpStrategyOptions ddp;
    ddp.gradient_as_bucket_view(num("--bucket-view", 0) != 0)
        .timeout_s(static_cast<double>(num("--timeout", 30)))
        .max_restarts(num("--max-restarts", 0))
        .static_graph(num("--static-graph", 0) != 0)
        .find_unused_parameters(num("--find-unused", 0) != 0);
    std::vector<std::shared_ptr<volt::Callback>> callbacks{
        std::make_shared<DieAt>(num("--die-rank", -1), num("--die-step", -1),
                                num("--die-batch", -1), static_cast<int>(num("--die-signal", 9))),
        std::make_shared<StopAt>(num("--stop-rank", -1), num("--stop-batch", -1),
                                 num("--sleep-ms", 0))};
    std::shared_ptr<volt::EarlyStopping> early_stopping;
    if (model.es_diverge_rank >= 0) {
      early_stopping = std::make_shared<volt::EarlyStopping>(
          volt::EarlyStoppingOptions("es_metric")
              .divergence_threshold(10)
              .verbose(true)
              .log_rank_zero_only(num("--es-rank-zero-only", 0) != 0));
      callbacks.push_back(early_stopping);
    }
    if (num("--on-exception-ckpt", 0) != 0) {
      callbacks.push_back(std::make_shared<volt::OnExceptionCheckpoint>(
          volt::OnExceptionCheckpointOptions().dirpath(a["--root"] + "/oe")));
    }
    if (num("--ckpt-every-batch", 0) != 0) {
      callbacks.push_back(std::make_shared<EveryBatch>(a["--root"] + "/every_batch",
                                                       num("--ckpt-every-batch", 0) == 2));
    }
    if (num("--swa", 0) > 0) {  // StochasticWeightAveraging from this (1-based) epoch
      callbacks.push_back(std::make_shared<volt::StochasticWeightAveraging>(
          volt::StochasticWeightAveragingOptions({0.05})
              .swa_epoch_start(static_cast<int64_t>(num("--swa", 0)))
              .annealing_epochs(1)));
    }
    if (a.count("--ema")) {  // EMAWeightAveraging with this decay, updated every step
      callbacks.push_back(std::make_shared<volt::EMAWeightAveraging>(
          volt::EMAWeightAveragingOptions().decay(std::stod(a["--ema"]))));
    }
    if (a.count("--prune")) {  // ModelPruning's defaults (global L1, lottery ticket) at a fraction
      callbacks.push_back(std::make_shared<volt::ModelPruning>(
          volt::ModelPruningOptions("l1_unstructured")
              .amount(volt::PruningAmount::fraction(std::stod(a["--prune"])))));
    }
    if (a.count("--freeze-at")) {
      callbacks.push_back(std::make_shared<FreezeAt>(num("--freeze-at", 0)));
    }
    if (a.count("--finetune")) {
      callbacks.push_back(std::make_shared<volt::BackboneFinetuning>(
          volt::BackboneFinetuningOptions().backbone("fc1").unfreeze_backbone_at_epoch(
              num("--finetune", 0))));
    }
    std::shared_ptr<volt::LearningRateFinder> lr_finder;
    if (a.count("--lr-find")) {
      lr_finder = std::make_shared<volt::LearningRateFinder>(
          volt::LrFinderOptions().num_training(num("--lr-find", 0)).min_lr(1e-3).max_lr(1.0));
      callbacks.push_back(lr_finder);
    }
    if (a.count("--spike-call")) {
      callbacks.push_back(std::make_shared<volt::SpikeDetection>(
          volt::SpikeDetectionOptions().exclude_batches_path(a["--root"] + "/skip.json")));
    }
    auto val_print = std::make_shared<PrintVal>();
    callbacks.push_back(val_print);
    std::shared_ptr<ZeroMemoryProbe> probe;
    std::shared_ptr<ValidatedAt> validated_at;
    if (a.count("--val-every-s")) {
      validated_at = std::make_shared<ValidatedAt>(num("--val-end-sleep-ms", 0));
      callbacks.push_back(validated_at);
    }
    if (num("--ckpt-every-step", 0) != 0) {
      callbacks.push_back(
          std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                      .dirpath(a["--root"] + "/ckpt")
                                                      .every_n_train_steps(1)
                                                      .save_last(true)));
    }
    auto accelerator = std::make_shared<volt::CpuAccelerator>();
    std::shared_ptr<volt::Precision> precision =
        volt::registry().precisions.create(a.count("--precision") ? a["--precision"] : "32-true");
    if (a.count("--bf16-all")) {  // bf16-mixed without the timing-based CPU policy
      auto mixed = volt::MixedPrecisionOptions().read_env_lists(false).cpu_policy(false);
      if (a.count("--loss-scale")) {  // dynamic loss scaling from this initial scale
        mixed.loss_scaling(true).scaler(
            volt::GradScalerOptions().init_scale(std::stod(a["--loss-scale"])).growth_interval(2));
      }
      precision = std::make_shared<volt::MixedPrecision>(mixed);
    }
    if (a.count("--linear-min-macs")) {  // bf16-mixed with this GEMM size rule (not measured)
      precision = std::make_shared<volt::MixedPrecision>(
          volt::MixedPrecisionOptions().read_env_lists(false).linear_min_macs(
              num("--linear-min-macs", 0)));
    }
    std::shared_ptr<volt::DdpStrategy> strategy;
    std::shared_ptr<volt::DeepSpeedStrategy> zero;
    if (num("--zero", 0) > 0 || a.count("--ds-config")) {
      const int64_t bucket = num("--bucket", 200000000);
      zero = std::make_shared<volt::DeepSpeedStrategy>(
          volt::DeepSpeedStrategyOptions()
              .stage(num("--zero", 0))
              .reduce_bucket_size(bucket)
              .allgather_bucket_size(bucket)
              .param_persistence_threshold(num("--persist", 0))
              .max_live_parameters(num("--max-live", 1000000000))
              .master_weights(num("--master-weights", 1) != 0)
              .overlap_comm(num("--overlap", 1) != 0)
              .prefetch_bucket_size(num("--prefetch", 50000000))
              .config(a.count("--ds-config") ? a["--ds-config"] : "")
              .offload_optimizer(a.count("--nvme") > 0 && num("--nvme-optimizer", 1) != 0)
              .offload_parameters(num("--nvme-params", 0) != 0)
              .offload_parameters_device(num("--nvme-params", 0) != 0 ? "nvme" : "cpu")
              .offload_optimizer_device(a.count("--nvme") ? "nvme" : "cpu")
              .nvme_path(a.count("--nvme") ? a["--nvme"] : "/local_nvme")
              .sub_group_size(num("--sub-group", 1000000000))
              .aio_use_uring(num("--aio-uring", 1) != 0)
              .timeout_s(static_cast<double>(num("--timeout", 30))),
          accelerator, precision, num("--devices", 2), num("--nodes", 1));
      strategy = zero;
      probe = std::make_shared<ZeroMemoryProbe>(zero.get());
      callbacks.push_back(probe);
    } else if (a.count("--tp")) {
      // fc1 row-parallel on the whole input, deep.0 column-parallel, head row-parallel after it
      // (--depth >= 1); w2 and the rest whole.
      std::vector<std::string> plan{"fc1=rowwise", "deep.0=colwise", "head=rowwise"};
      if (a.count("--tp-plan")) {
        plan.clear();
        std::istringstream entries(a["--tp-plan"]);
        for (std::string e; std::getline(entries, e, ',');) plan.push_back(e);
      }
      volt::ModelParallelStrategyOptions mp_options;
      mp_options.tensor_parallel_size(num("--tp", 0))
          .plan(volt::parse_tp_plan(plan))
          .find_unused_parameters(num("--find-unused", 0) != 0)
          .static_graph(num("--static-graph", 0) != 0)
          .timeout_s(static_cast<double>(num("--timeout", 30)));
      if (a.count("--save-distributed")) {
        mp_options.save_distributed_checkpoint(num("--save-distributed", 1) != 0);
      }
      if (a.count("--partial-grads")) {
        std::vector<std::string> names;
        std::istringstream entries(a["--partial-grads"]);
        for (std::string e; std::getline(entries, e, ',');) names.push_back(e);
        mp_options.partial_grads(names);
      }
      auto mp = std::make_shared<volt::ModelParallelStrategy>(
          mp_options, accelerator, precision, num("--devices", 2), num("--nodes", 1));
      callbacks.push_back(std::make_shared<ReducerProbe>(mp.get()));
      strategy = mp;
    } else {
      strategy = std::make_shared<volt::DdpStrategy>(ddp, accelerator, precision,
                                                     num("--devices", 2), num("--nodes", 1));
    }
    if (num("--buffer-probe", 0) != 0)
      callbacks.push_back(std::make_shared<BufferProbe>(strategy.get()));
    std::shared_ptr<InferenceProbe> inference;
    if (a.count("--evaluate")) {
      inference = std::make_shared<InferenceProbe>(zero.get(), model.fc1);
      callbacks.push_back(inference);
    }
    // One process on one node is the reference: plain single-device training (with --zero,
    // ZeRO in a group of one).
    const bool one = num("--devices", 2) == 1 && num("--nodes", 1) == 1 && !zero;
    volt::Spec<volt::Strategy> chosen =
        one ? volt::Spec<volt::Strategy>("single_device") : volt::Spec<volt::Strategy>(strategy);
    std::shared_ptr<volt::Profiler> profiler;
    if (num("--profile", 0) != 0) {
      profiler = std::make_shared<volt::TorchProfiler>(volt::TorchProfilerOptions()
                                                           .dirpath(a["--root"] + "/prof")
                                                           .filename("ddp")
                                                           .wait(0)
                                                           .warmup(1)
                                                           .active(2));
    }
    volt::Trainer trainer(
        volt_test::quiet(a["--root"])
            .accelerator(accelerator)
            .precision(precision)
            .strategy(chosen)
            .devices(num("--devices", 2))
            .num_nodes(num("--nodes", 1))
            .sync_batchnorm(num("--sync-bn", 0) != 0)
            .trace_training_step(num("--trace", 0) != 0)
            .max_epochs(num("--epochs", 2))
            .val_check_interval_s(a.count("--val-every-s")
                                      ? c10::optional<double>(std::stod(a["--val-every-s"]))
                                      : c10::nullopt)
            .accumulate_grad_batches(num("--accum", 1))
            .gradient_clip_val(a.count("--clip") ? c10::optional<double>(std::stod(a["--clip"]))
                                                 : c10::nullopt)
            .callbacks(callbacks)
            .profiler(profiler)
            .checkpoint_io(num("--async-ckpt", 0) != 0 ? std::make_shared<volt::AsyncCheckpointIO>()
                                                       : nullptr));
    const int64_t batch = num("--batch", 8);
    // The peak resident set of fit() alone: reset the high-water mark (Linux: clear_refs 5).
    if (FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
      std::fputs("5", f);
      std::fclose(f);
    }
    const long rss_before = status_kib("VmRSS");
    volt::reset_cpu_memory_peaks();
    const int64_t tensors_before = volt::cpu_memory_stats().in_use;
    std::filesystem::create_directories(std::filesystem::path(a["--out"]).parent_path());
    std::vector<volt::DataLoader> vals{volt::DataLoader(val, volt::DataLoaderOptions(16))};
    if (num("--val-loaders", 1) > 1) {  // a second validation set, of 48 samples
      vals.emplace_back(volt_test::blobs(48, 8, 3), volt::DataLoaderOptions(16));
    }
    volt::DataLoader train_loader(train, volt::DataLoaderOptions(batch).shuffle(true).seed(11));
    if (num("--own-shard", 0) != 0) {  // the program's own unpadded shard: the Trainer keeps it
      const char* local = std::getenv("LOCAL_RANK");
      train_loader = train_loader.sharded(local != nullptr ? std::atoll(local) : 0,
                                          num("--devices", 2), /*even=*/false);
    }
    if (num("--combined", 0) != 0) {
      // --combined 2: the program shards "a" itself (by the rank the launcher gives a child
      // process; nodes of one process each), the Trainer shards "b".
      const char* local = std::getenv("LOCAL_RANK");
      const int64_t rank = local != nullptr ? std::atoll(local) : 0;
      train_loader = volt::combined_loader(
          {{"a", num("--combined", 0) == 2 ? train_loader.sharded(rank, num("--devices", 2))
                                           : train_loader},
           {"b", volt::DataLoader(volt_test::blobs(48, 8, 4),
                                  volt::DataLoaderOptions(batch / 2).shuffle(true).seed(12))}});
    }
    if (a.count("--evaluate")) {
      // validate and predict from the checkpoint (stage 3: ZeRO-Inference), then the module,
      // whole again, recomputes each prediction. --freeze-all 1: with no parameter requiring a
      // gradient (a model loaded for inference).
      if (num("--freeze-all", 0) != 0) {
        for (auto& p : model.parameters()) p.requires_grad_(false);
      }
      const volt::Metrics metrics = trainer.validate(model, vals.front(), a["--evaluate"]);
      // --predict-rows N: predict N other rows instead of the validation set's 64.
      const auto predict_set =
          a.count("--predict-rows") ? volt_test::blobs(num("--predict-rows", 0), 8, 5) : val;
      const auto predictions =
          trainer.predict(model, volt::DataLoader(predict_set, volt::DataLoaderOptions(16)));
      const int64_t rank = trainer.strategy().rank();
      double diff = inference->predictions.empty() ? -1 : 0;
      {
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < inference->inputs.size(); ++i) {
          // bf16-true feeds the module bf16 inputs; so does this recomputation.
          const auto dtype = model.parameters().front().scalar_type();
          const auto again = model.forward(inference->inputs[i].to(dtype));
          diff = std::max(diff, (again - inference->predictions[i]).abs().max().item<double>());
        }
      }
      torch::save(model.flat(), a["--out"] + ".rank" + std::to_string(rank) + ".pt");
      torch::save(torch::cat(predictions),
                  a["--out"] + ".pred.rank" + std::to_string(rank) + ".pt");
      std::printf(
          "rank %lld evaluated val_loss=%.17g batches=%zu infer_params=%lld "
          "infer_in_files=%lld infer_full=%lld released=%d pred_diff=%.17g load_peak=%lld\n",
          static_cast<long long>(rank), metrics.at("val_loss"), predictions.size(),
          static_cast<long long>(inference->params),
          static_cast<long long>(inference->params_in_files),
          static_cast<long long>(inference->full), inference->released ? 1 : 0, diff,
          static_cast<long long>(inference->load_peak));
      std::fflush(stdout);
      return 0;
    }
    trainer.fit(model, train_loader, vals, a.count("--resume") ? a["--resume"] : "");
    // fit()'s own peaks, before the flat copy of the weights below adds its own.
    const long rss_peak = status_kib("VmHWM");
    const int64_t tensors_peak = volt::cpu_memory_stats().max_in_use;
    const int64_t rank = trainer.strategy().rank();
    torch::save(model.flat(), a["--out"] + ".rank" + std::to_string(rank) + ".pt");
    {
      // fp8's amax histories (buffers named *amax*), which the ranks agree on after each backward.
      std::vector<torch::Tensor> amax;
      for (const auto& b : model.named_buffers(true)) {
        if (b.key().find("amax") != std::string::npos) amax.push_back(b.value().reshape({-1}));
      }
      if (!amax.empty()) {
        torch::save(torch::cat(amax), a["--out"] + ".amax.rank" + std::to_string(rank) + ".pt");
      }
    }
    if (lr_finder) {
      std::vector<double> found = lr_finder->result().lrs;
      const auto& losses = lr_finder->result().losses;
      found.insert(found.end(), losses.begin(), losses.end());
      found.push_back(lr_finder->optimal_lr().value_or(-1.0));
      torch::save(torch::tensor(found, torch::kDouble),
                  a["--out"] + ".lrfind.rank" + std::to_string(rank) + ".pt");
    }
    if (model.gather_val) {
      torch::save(torch::cat(model.own_logits),
                  a["--out"] + ".own.rank" + std::to_string(rank) + ".pt");
      torch::save(torch::cat(model.gathered_logits, 1),
                  a["--out"] + ".gathered.rank" + std::to_string(rank) + ".pt");
    }
    bool aliases = true;
    if (auto* reducer = one ? nullptr : strategy->reducer(model);
        reducer != nullptr && ddp.gradient_as_bucket_view()) {
      // Each .grad must live inside one of the reducer's bucket buffers.
      for (auto& p : model.parameters()) {
        if (!p.grad().defined()) continue;
        const char* g = static_cast<const char*>(p.grad().data_ptr());
        bool inside = false;
        for (const auto& b : reducer->bucket_buffers()) {
          const char* lo = static_cast<const char*>(b.data_ptr());
          inside = inside || (g >= lo && g < lo + b.numel() * b.element_size());
        }
        aliases = aliases && inside;
      }
    }
    if (early_stopping) {
      std::printf("rank %lld stopping_reason=%d stopped_epoch=%lld message=%s\n",
                  static_cast<long long>(rank), static_cast<int>(early_stopping->stopping_reason()),
                  static_cast<long long>(early_stopping->stopped_epoch()),
                  early_stopping->stop_reason().c_str());
    }
    if (validated_at) {
      std::printf("rank %lld validated_at=%s\n", static_cast<long long>(rank),
                  validated_at->at.c_str());
    }
    if (model.epoch_metric) {
      std::printf("rank %lld rank_mean=%.17g\n", static_cast<long long>(rank),
                  trainer.callback_metrics().at("rank_mean"));
    }
    const bool tied = model.fc1->weight.data_ptr() == model.w2.data_ptr();
    const std::string zero_memory = probe && !one ? probe->text : "";
    std::printf(
        "rank %lld done step=%lld sum=%.17g val_loss=%.17g val_loss1=%.17g aliases=%d tied=%d%s "
        "rss_before_kib=%ld rss_peak_kib=%ld tensors_before=%lld tensors_peak=%lld "
        "estimated=%lld\n",
        static_cast<long long>(rank), static_cast<long long>(trainer.state().global_step),
        model.flat().abs().sum().item<double>(), val_print->last, val_print->last1, aliases ? 1 : 0,
        tied ? 1 : 0, zero_memory.c_str(), rss_before, rss_peak,
        static_cast<long long>(tensors_before), static_cast<long long>(tensors_peak),
        static_cast<long long>(model.estimated_steps));
    std::fflush(stdout);
    return 0;
  } catch (const volt::Interrupted& e) {
    std::printf("rank %lld interrupted: %s\n", static_cast<long long>(volt::log_rank()), e.what());
    std::fflush(stdout);
    return 128 + e.signal();
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    std::fflush(stdout);
    return 1;
  }
}
