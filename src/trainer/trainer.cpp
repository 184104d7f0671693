// The Trainer's public face: option checks and component wiring at construction, and the entry
// points. The loops are in loops/, the checkpoint contents in checkpoint_state.cpp.
#include "volt/trainer/trainer.h"

#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <string>

#include "core/detail/numbers.h"
#include "data/detail/module_data.h"
#include "data/detail/stage_loaders.h"
#include "nn/detail/empty_init.h"
#include "strategies/detail/agree.h"
#include "trainer/detail/run.h"
#include "volt/callbacks/host_sync_monitor.h"
#include "volt/callbacks/model_checkpoint.h"
#include "volt/callbacks/model_summary.h"
#include "volt/callbacks/progress_bar.h"
#include "volt/callbacks/timer.h"
#include "volt/core/check.h"
#include "volt/core/env.h"
#include "volt/core/log.h"
#include "volt/core/seed.h"
#include "volt/loggers/csv.h"
#include "volt/precision/precision.h"
#include "volt/strategies/ddp.h"
#include "volt/trainer/threads.h"

namespace volt {

struct Trainer::Impl : detail::Run {};

namespace detail {
namespace {

// As Lightning's Strategy.teardown: once a run ends a model trained on a GPU goes back to the
// CPU, so the program can use it with CPU tensors and the GPU's memory is free. CPU runs (and
// strategies' placeholder tensors): nothing.
void release_device(Module& m) {
  bool on_gpu = false;
  for (const auto& p : m.parameters()) on_gpu = on_gpu || p.is_cuda();
  for (const auto& b : m.buffers()) on_gpu = on_gpu || b.is_cuda();
  if (on_gpu) m.to(c10::Device(c10::kCPU));
}

// The intra-op thread count for a run. volt's default (one thread on 2 CPUs with OpenBLAS) was
// measured where OpenBLAS runs the GEMMs: fp32. Under bf16/fp16 the GEMMs go to oneDNN and the
// rest to libtorch's own pool, which that default would leave one core: on the 2-CPU machine
// bf16-mixed steps ran 1.2-1.8x faster at 2 threads (docs/PERFORMANCE.md) and a GPT-2 fit at
// half the hand loop's speed. So a precision computing below fp32 (Precision::compute_dtype) keeps
// libtorch's count; float64 (64-true) runs its GEMMs in OpenBLAS as fp32 does and takes volt's.
int64_t thread_request(const TrainerOptions& o, const Precision& precision) {
  if (o.num_threads() != 0) return o.num_threads();
  const c10::ScalarType dtype = precision.compute_dtype();
  return dtype == c10::kFloat || dtype == c10::kDouble ? 0 : at::get_num_threads();
}

}  // namespace

template <typename F>
void Run::guarded(Module& m, Stage stage, F&& body) {
  IntraOpThreads threads(thread_request(opts, strategy().precision()));
  // Lightning's detect_anomaly: the whole entry point, as its set_detect_anomaly context.
  c10::optional<torch::autograd::DetectAnomalyGuard> anomaly;
  if (opts.detect_anomaly()) anomaly.emplace();
  SignalWatch watch(opts.handle_signals());
  struct Unwatch {
    Run& r;
    ~Unwatch() { r.signals = nullptr; }
  } unwatch{*this};
  signals = &watch;
  reset_failure_context();
  try {
    setup_run(m, stage);
    where = "the Trainer's loop";  // between the steps and hooks that mark themselves
    watch.announce(is_global_zero());
    body();
    // Checkpoints written in the background (AsyncCheckpointIO) are on disk before the run
    // counts as finished; a failed write fails the run.
    strategy().flush_checkpoints();
    teardown_hooks(m, stage, /*failed=*/false);
    st.status = RunStatus::kFinished;
  } catch (const std::exception& e) {
    // Interrupted: every rank stopped at the same batch boundary (a consistent state);
    // anything else failed wherever it was.
    const bool interrupted = dynamic_cast<const Interrupted*>(&e) != nullptr;
    st.status = interrupted ? RunStatus::kInterrupted : RunStatus::kFailed;
    // An error from user code or libtorch says what went wrong but not where (C++ has no
    // traceback to show): name the step or hook and the batch. volt's own errors name both.
    if (!interrupted && dynamic_cast<const Error*>(&e) == nullptr) {
      log_error("Trainer", failure_context(stage, e));
    }
    // The run ends cleanly: callbacks and loggers are told, files are flushed, then the error
    // propagates. The checkpoints on disk stay as they are; a callback may add one
    // (OnExceptionCheckpoint, written atomically under its own name).
    for (auto& c : callbacks) {
      try {
        c->on_exception(*this, m, e);
      } catch (const std::exception& failed) {
        log_warning("Trainer", c->state_key() + ".on_exception failed: " + failed.what());
      } catch (...) {
      }
    }
    // Then the DataModule's, as Lightning's _interrupt.
    if (data != nullptr) {
      try {
        data->on_exception(e);
      } catch (const std::exception& failed) {
        log_warning("Trainer",
                    std::string("the DataModule's on_exception failed: ") + failed.what());
      } catch (...) {
      }
    }
    teardown_hooks(m, stage, /*failed=*/true);
    try {
      // Pending checkpoint writes (a restart resumes from them) and what on_exception saved are
      // on disk before the error propagates. After an interrupt every rank is here, so they
      // also wait for rank 0's writes; after a failure they may not be, so each process only
      // finishes its own. Failures of earlier writes were logged when they happened.
      if (interrupted) {
        strategy().flush_checkpoints();
      } else {
        strategy().checkpoint_io().flush();
      }
    } catch (const std::exception& failed) {
      log_warning("Trainer", std::string("a checkpoint write failed: ") + failed.what());
    }
    for (auto& l : loggers()) {
      try {
        l->finalize(st.status);
      } catch (const std::exception& failed) {
        log_warning("Trainer", l->name() + ".finalize failed: " + failed.what());
      } catch (...) {
      }
    }
    scope = LogScope::kNone;
    m.attach(nullptr);
    try {
      strategy().set_run_failed(true);
      strategy().teardown();
      release_device(m);
    } catch (...) {
    }
    if (prof != nullptr) prof->describe(to_string(stage), log_dir());
    throw;
  }
  if (prof != nullptr) prof->describe(to_string(stage), log_dir());
  // A logger that cannot write its last rows (a full disk) fails the run on rank 0 (the only
  // rank with loggers), but only after every logger closed and the strategy tore down as on the
  // other ranks (its teardown may be collective: the tensor-parallel ranks gather the whole
  // model).
  std::exception_ptr logger_failed;
  for (auto& l : loggers()) {
    try {
      l->finalize(RunStatus::kFinished);
    } catch (const std::exception& failed) {
      if (!logger_failed) {
        logger_failed = std::current_exception();
      } else {
        log_warning("Trainer", l->name() + ".finalize failed too: " + failed.what());
      }
    } catch (...) {
      if (!logger_failed) logger_failed = std::current_exception();
    }
  }
  scope = LogScope::kNone;
  m.attach(nullptr);
  strategy().set_run_failed(false);
  strategy().teardown();
  release_device(m);
  if (logger_failed) std::rethrow_exception(logger_failed);
}

}  // namespace detail

Trainer::Trainer(TrainerOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  options.validate();
  s.opts = std::move(options);
  s.fast_dev = s.opts.fast_dev_run() > 0;
  if (s.opts.seed()) seed_everything(*s.opts.seed());
  if (s.opts.deterministic()) {
    at::globalContext().setDeterministicAlgorithms(true, false);
    // cuBLAS is deterministic only with a fixed workspace (read when its first handle is made);
    // set it as Lightning does, unless the user chose one.
    ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    // cuDNN: deterministic kernels, and no autotuning (which may pick others run to run).
    at::globalContext().setDeterministicCuDNN(true);
    at::globalContext().setBenchmarkCuDNN(false);
  }
  if (s.opts.benchmark()) {
    if (*s.opts.benchmark() && s.opts.deterministic()) {
      warn_once("benchmark-deterministic", "Trainer",
                "benchmark=true with deterministic=true: cuDNN autotuning may pick different "
                "convolution algorithms run to run, so convolutions are not deterministic; drop "
                "benchmark for repeatable runs.");
    }
    at::globalContext().setBenchmarkCuDNN(*s.opts.benchmark());
  }
  if (reference_blas_active()) {
    warn_once("reference-blas", "Trainer",
              "libtorch is using the reference BLAS (about 20x slower); install "
              "libopenblas0-pthread (scripts/setup.sh does).");
  }
  s.plan = resolve_plan(s.opts.accelerator(), s.opts.devices(), s.opts.strategy(),
                        s.opts.precision(), s.opts.num_nodes());
  if (s.opts.checkpoint_io()) s.plan.strategy->set_checkpoint_io(s.opts.checkpoint_io());
  s.plan.strategy->set_sync_batchnorm(s.opts.sync_batchnorm());
  s.callbacks = s.opts.callbacks();
  s.prof = s.opts.profiler().get();
  s.loggers_ = s.opts.loggers();
  // fast_dev_run is a smoke test: no files are written.
  s.loggers_muted_ = s.fast_dev && (!s.loggers_.empty() || s.opts.logger());
  if (s.fast_dev) {
    s.loggers_.clear();
  } else if (s.loggers_.empty() && s.opts.logger()) {
    s.loggers_.push_back(std::make_shared<CSVLogger>(CSVLoggerOptions(s.opts.default_root_dir())));
  }
  if (auto monitor = HostSyncMonitor::from_environment()) {
    // First in the list, so it stops counting before the other callbacks' batch-end hooks.
    const bool has = std::any_of(s.callbacks.begin(), s.callbacks.end(), [](const auto& c) {
      return dynamic_cast<HostSyncMonitor*>(c.get()) != nullptr;
    });
    if (!has) s.callbacks.insert(s.callbacks.begin(), monitor);
  }
  bool has_ckpt = false, has_summary = false;
  int bars = 0;
  for (auto& c : s.callbacks) {
    has_ckpt = has_ckpt || dynamic_cast<ModelCheckpoint*>(c.get()) != nullptr;
    bars += dynamic_cast<ProgressBar*>(c.get()) != nullptr ? 1 : 0;
    has_summary = has_summary || dynamic_cast<ModelSummary*>(c.get()) != nullptr;
  }
  const bool has_bar = bars > 0;
  VOLT_CHECK(!s.opts.barebones() || !has_ckpt, ConfigError,
             "[Trainer] barebones=true with a ModelCheckpoint in callbacks: checkpointing can "
             "impact raw speed, so barebones mode turns it off; drop one of the two.");
  VOLT_CHECK(!s.opts.barebones() || !has_bar, ConfigError,
             "[Trainer] barebones=true with a ProgressBar in callbacks: the progress bar can "
             "impact raw speed, so barebones mode turns it off; drop one of the two.");
  // Lightning's callback connector: a Timer among the callbacks is the fit's time limit.
  if (s.opts.max_time() && std::any_of(s.callbacks.begin(), s.callbacks.end(), [](const auto& c) {
        return dynamic_cast<Timer*>(c.get()) != nullptr;
      })) {
    log_info("Trainer", "ignoring max_time=" + detail::c_format("%g", *s.opts.max_time()) +
                            " s: the callbacks already contain a Timer, whose duration limits "
                            "the fit.");
    s.opts.max_time(c10::nullopt);
  }
  // Lightning's callback connector refuses both.
  VOLT_CHECK(bars <= 1, ConfigError, "[Trainer] ", bars,
             " ProgressBar callbacks were given; only one progress bar is supported: keep one.");
  VOLT_CHECK(!has_bar || s.opts.enable_progress_bar(), ConfigError,
             "[Trainer] enable_progress_bar=false with a ProgressBar in callbacks; drop the "
             "ProgressBar from callbacks, or set enable_progress_bar=true to show it.");
  if (!s.fast_dev && !has_ckpt && s.opts.enable_checkpointing()) {
    s.callbacks.push_back(std::make_shared<ModelCheckpoint>());
  }
  if (!has_summary && s.opts.enable_model_summary()) {
    s.callbacks.push_back(std::make_shared<ModelSummary>());
  }
  if (!has_bar && s.opts.enable_progress_bar()) {
    s.callbacks.push_back(
        std::make_shared<ProgressBar>(ProgressBarOptions().refresh_s(s.opts.progress_refresh_s())));
  }
  s.arrange_callbacks();
}

Trainer::~Trainer() = default;

namespace {

// The DataModule of the entry point running (RunContext::data_module()), for its duration:
// the user's, or the module's own loaders (detail::ModuleData).
class UsingData {
 public:
  UsingData(detail::Run& run, DataModule* data) : run_(run) {
    if (dynamic_cast<const detail::ModuleData*>(data) != nullptr) {
      run_.module_data = data;
    } else {
      run_.data = data;
    }
  }
  ~UsingData() {
    run_.data = nullptr;
    run_.module_data = nullptr;
    run_.data_set_up = false;
  }
  UsingData(const UsingData&) = delete;
  UsingData& operator=(const UsingData&) = delete;

 private:
  detail::Run& run_;
};

// validate/test/predict given loaders need one at least.
void check_some(const std::vector<DataLoader>& loaders, Stage stage) {
  VOLT_CHECK(!loaders.empty(), ConfigError, "[Trainer] ", to_string(stage),
             "() was given an empty list of loaders; pass at least one DataLoader.");
}

// What validate/test/predict start with inside the run: the weights of `ckpt_path` when it names
// a checkpoint, then the loaders sharded over the ranks (predict's without repeated samples),
// each with the batches it runs
// (limit_*_batches and fast_dev_run; validation also overfit_batches, as in fit). The loaders are
// made after the restore, as Lightning's _run restores the DataModule before the loop builds
// them: a DataModule's saved state (a vocabulary, a curriculum level) decides its loaders.
struct EvalData {
  std::vector<DataLoader> loaders;
  std::vector<int64_t> limits;
};
EvalData start_eval(detail::Run& s, Stage stage, const std::string& ckpt_path,
                    const std::function<std::vector<DataLoader>()>& make_loaders) {
  s.reset_metrics();
  const std::string ckpt = detail::resolve_ckpt_path(s, ckpt_path, stage);
  if (!ckpt.empty()) detail::restore_checkpoint(s, ckpt, /*full=*/false);
  s.started_from = ckpt;
  s.log_hparams();
  EvalData d;
  for (const DataLoader& loader : make_loaders()) {
    d.loaders.push_back(s.shard(loader, /*predict=*/stage == Stage::kPredict));
    const DataLoader& l = d.loaders.back();
    if (stage == Stage::kValidate) {
      d.limits.push_back(s.val_limit(l));
      continue;
    }
    // fast_dev_run replaces the limit (Lightning's _init_debugging_flags).
    const bool test = stage == Stage::kTest;
    d.limits.push_back(
        s.fast_dev ? std::min(s.opts.fast_dev_run(), l.num_batches())
                   : detail::Run::limit_batches(
                         test ? s.opts.limit_test_batches() : s.opts.limit_predict_batches(),
                         l.num_batches(), test ? "limit_test_batches" : "limit_predict_batches"));
  }
  return d;
}

// Lightning's evaluation and prediction loops' skip: a pass with no batch in any loader (empty
// loaders, a limit of 0) runs no hook; its results are empty (a prediction writer writes nothing).
// Agreed over the ranks: predict's shards may leave one rank without a batch, and a rank that
// skipped would leave the others waiting in the pass's collectives.
bool no_batches(detail::Run& s, const EvalData& d) {
  int64_t most = 0;
  for (const int64_t n : d.limits) most = std::max(most, n);
  return detail::min_max_over_ranks(s.strategy(), most).second == 0;
}

// A DataModule's loaders, asked for inside the run (after the setup hooks, where a
// BatchSizeFinder sets the size); none is a ConfigError.
std::function<std::vector<DataLoader>()> stage_loaders(DataModule& data, Stage stage) {
  return [&data, stage] { return detail::stage_loaders(data, stage, /*required=*/true); };
}

}  // namespace

void Trainer::fit(Module& module, DataModule& data, const std::string& ckpt_path) {
  UsingData using_data(*impl_, &data);
  fit_with_restarts(module, ckpt_path, [&](const std::string& ckpt) {
    detail::LoaderReload load;
    load.train = [&](int64_t epoch) {
      data.current_epoch_ = epoch;
      return data.train_dataloader();
    };
    load.val = [&](int64_t epoch) {
      data.current_epoch_ = epoch;
      return data.val_dataloaders();
    };
    DataLoader train = load.train(0);
    // None asked for under a validation limit of 0 (Lightning's evaluation loop asks none).
    std::vector<DataLoader> val = impl_->validation_off() ? std::vector<DataLoader>{} : load.val(0);
    detail::fit_loop(*impl_, train, val, ckpt, load);
  });
}

void Trainer::fit(Module& module, DataLoader train, c10::optional<DataLoader> val,
                  const std::string& ckpt_path) {
  if (val) {
    fit(module, std::move(train), std::vector<DataLoader>{std::move(*val)}, ckpt_path);
    return;
  }
  // No validation loader: the module's, as Lightning's (asked for inside the run, after the
  // setup hooks, and rebuilt under reload_dataloaders_every_n_epochs; the training loader given
  // serves every epoch).
  fit_with_restarts(module, ckpt_path, [&](const std::string& ckpt) {
    std::vector<DataLoader> vals;
    if (!impl_->validation_off()) vals = module.val_dataloaders();
    // A module whose answer is none as fit starts is not asked again.
    detail::LoaderReload load;
    if (!vals.empty()) load.val = [&](int64_t) { return module.val_dataloaders(); };
    detail::fit_loop(*impl_, train, vals, ckpt, load);
  });
}

void Trainer::fit(Module& module, const std::string& ckpt_path) {
  detail::ModuleData data(module);
  fit(module, static_cast<DataModule&>(data), ckpt_path);
}

void Trainer::fit(Module& module, DataLoader train, std::vector<DataLoader> val,
                  const std::string& ckpt_path) {
  fit_with_restarts(module, ckpt_path,
                    [&](const std::string& ckpt) { detail::fit_loop(*impl_, train, val, ckpt); });
}

void Trainer::fit_with_restarts(Module& module, const std::string& ckpt_path,
                                const std::function<void(const std::string&)>& body) {
  // The weights and buffers fit() was given, when the strategy may restart the job: an attempt
  // restarted before any last checkpoint exists starts from them, as torchrun's new processes
  // would. This process keeps its module across attempts, and the failed attempt had trained
  // it: the restart went on from those weights with its counters at step 0.
  // Kept in host memory (an accelerator's memory is the model's), put back where they were,
  // and only by a process that may restart: not by the workers a launching process started
  // (each attempt launches new ones).
  std::vector<std::pair<at::Tensor, c10::Device>> given;
  const auto* ddp = dynamic_cast<const DdpStrategy*>(&impl_->strategy());
  if (ddp != nullptr && ddp->options().max_restarts() > 0 &&
      env_value(kLaunchedChildVar).value_or("") != "1") {
    torch::NoGradGuard no_grad;
    const auto keep = [&](const at::Tensor& t) {
      given.emplace_back(t.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true),
                         t.device());
    };
    for (const auto& p : module.parameters()) keep(p);
    for (const auto& b : module.buffers()) keep(b);
  }
  for (;;) {
    try {
      impl_->guarded(module, Stage::kFit, [&] { body(ckpt_path); });
      return;
    } catch (const DistributedError& e) {
      // A lost or hung rank: the strategy may relaunch its processes (elastic restart); the
      // run then resumes from the newest last checkpoint (the strategy's restart_checkpoint()),
      // or, when none was written yet, from where this fit() started.
      const std::string last = detail::newest_last_checkpoint(*impl_);
      if (!impl_->strategy().restart_after_failure(e, last)) throw;
      if (last.empty() && !given.empty()) {
        torch::NoGradGuard no_grad;
        size_t i = 0;
        auto put_back = [&](at::Tensor t) {
          if (i < given.size() && t.sizes() == given[i].first.sizes()) {
            t.set_data(given[i].first.to(given[i].second, /*non_blocking=*/false, /*copy=*/true));
          }
          ++i;
        };
        for (auto p : module.parameters()) put_back(p);
        for (auto b : module.buffers()) put_back(b);
      }
    }
  }
}

std::vector<Metrics> Trainer::run_eval(Module& module, Stage stage,
                                       const std::function<std::vector<DataLoader>()>& make_loaders,
                                       const std::string& ckpt_path, Metrics* merged) {
  Impl& s = *impl_;
  std::vector<Metrics> out;
  s.guarded(module, stage, [&] {
    EvalData d = start_eval(s, stage, ckpt_path, make_loaders);
    if (no_batches(s, d)) {
      out.resize(d.loaders.size());
      return;
    }
    out = detail::evaluation_loop(s, stage, d.loaders, d.limits, merged);
  });
  return out;
}

Metrics Trainer::validate(Module& module, DataLoader val, const std::string& ckpt_path) {
  return run_eval(
             module, Stage::kValidate, [&] { return std::vector<DataLoader>{val}; }, ckpt_path)
      .front();
}

std::vector<Metrics> Trainer::validate(Module& module, std::vector<DataLoader> val,
                                       const std::string& ckpt_path) {
  check_some(val, Stage::kValidate);
  return run_eval(
      module, Stage::kValidate, [&] { return val; }, ckpt_path);
}

Metrics Trainer::validate(Module& module, DataModule& data, const std::string& ckpt_path) {
  UsingData using_data(*impl_, &data);
  Metrics all;
  run_eval(module, Stage::kValidate, stage_loaders(data, Stage::kValidate), ckpt_path, &all);
  return all;
}

Metrics Trainer::test(Module& module, DataLoader test, const std::string& ckpt_path) {
  return run_eval(
             module, Stage::kTest, [&] { return std::vector<DataLoader>{test}; }, ckpt_path)
      .front();
}

std::vector<Metrics> Trainer::test(Module& module, std::vector<DataLoader> test,
                                   const std::string& ckpt_path) {
  check_some(test, Stage::kTest);
  return run_eval(
      module, Stage::kTest, [&] { return test; }, ckpt_path);
}

Metrics Trainer::validate(Module& module, const std::string& ckpt_path) {
  detail::ModuleData data(module);
  return validate(module, static_cast<DataModule&>(data), ckpt_path);
}

Metrics Trainer::test(Module& module, DataModule& data, const std::string& ckpt_path) {
  UsingData using_data(*impl_, &data);
  Metrics all;
  run_eval(module, Stage::kTest, stage_loaders(data, Stage::kTest), ckpt_path, &all);
  return all;
}

std::vector<std::vector<at::Tensor>> Trainer::run_predict(
    Module& module, const std::function<std::vector<DataLoader>()>& make_loaders,
    const std::string& ckpt_path) {
  Impl& s = *impl_;
  std::vector<std::vector<at::Tensor>> out;
  s.guarded(module, Stage::kPredict, [&] {
    EvalData d = start_eval(s, Stage::kPredict, ckpt_path, make_loaders);
    if (no_batches(s, d)) {
      out.resize(d.loaders.size());
      return;
    }
    out = detail::prediction_loop(s, d.loaders, d.limits);
  });
  return out;
}

std::vector<at::Tensor> Trainer::predict(Module& module, DataLoader data,
                                         const std::string& ckpt_path) {
  return std::move(run_predict(
                       module, [&] { return std::vector<DataLoader>{data}; }, ckpt_path)
                       .front());
}

std::vector<std::vector<at::Tensor>> Trainer::predict(Module& module, std::vector<DataLoader> data,
                                                      const std::string& ckpt_path) {
  check_some(data, Stage::kPredict);
  return run_predict(
      module, [&] { return data; }, ckpt_path);
}

Metrics Trainer::test(Module& module, const std::string& ckpt_path) {
  detail::ModuleData data(module);
  return test(module, static_cast<DataModule&>(data), ckpt_path);
}

std::vector<at::Tensor> Trainer::predict(Module& module, const std::string& ckpt_path) {
  detail::ModuleData data(module);
  return predict(module, static_cast<DataModule&>(data), ckpt_path);
}

std::vector<at::Tensor> Trainer::predict(Module& module, DataModule& data,
                                         const std::string& ckpt_path) {
  UsingData using_data(*impl_, &data);
  std::vector<at::Tensor> all;
  for (auto& outputs : run_predict(module, stage_loaders(data, Stage::kPredict), ckpt_path)) {
    for (auto& t : outputs) all.push_back(std::move(t));
  }
  return all;
}

void Trainer::save_checkpoint(const std::string& path, bool weights_only) {
  impl_->save_checkpoint(path, weights_only);
  impl_->strategy().checkpoint_io().flush();  // on disk when it returns, even when asynchronous
}
const LoopState& Trainer::state() const {
  return impl_->st;
}
const Metrics& Trainer::callback_metrics() const {
  return impl_->callback_metrics();
}
const Metrics& Trainer::logged_metrics() const {
  return impl_->logged;
}
const TrainerOptions& Trainer::options() const {
  return impl_->opts;
}
Strategy& Trainer::strategy() const {
  return *impl_->plan.strategy;
}
std::shared_ptr<void> Trainer::init_module(bool empty_init) const {
  return detail::init_module_context(impl_->plan.strategy->precision().tensor_init_context(),
                                     empty_init);
}
const std::vector<std::shared_ptr<Callback>>& Trainer::callbacks() const {
  return impl_->callbacks;
}
const std::vector<std::shared_ptr<Logger>>& Trainer::loggers() const {
  return impl_->loggers_;
}
std::string Trainer::log_dir() const {
  return impl_->log_dir();
}

}  // namespace volt
