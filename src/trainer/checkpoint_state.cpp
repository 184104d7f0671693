// The Trainer's checkpoint: what a full checkpoint holds and how a run is restored from one.
// Everything that depends on how state is placed or partitioned goes through the Strategy.
#include <torch/torch.h>

#include <c10/util/Type.h>

#include <sys/stat.h>

#include "core/detail/archive_values.h"
#include "core/detail/newest_path.h"
#include "io/detail/nested_archive.h"
#include "strategies/detail/checkpoint_folder.h"
#include "strategies/detail/read_checkpoint.h"
#include "trainer/detail/run.h"
#include "volt/callbacks/model_checkpoint.h"
#include "volt/callbacks/on_exception_checkpoint.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/data/data_module.h"
#include "volt/io/checkpoint_io.h"
#include "volt/io/safetensors.h"
#include "volt/io/state.h"
#include "volt/optim/lr_scheduler.h"
#include "volt/trainer/checkpoint.h"

namespace volt {
namespace detail {
namespace {

// The DataModule's dynamic type, as checkpoints name whose state they hold.
std::string data_module_type(const DataModule& data) {
  return c10::demangle(typeid(data).name());
}

constexpr int64_t kCheckpointFormat = 1;

}  // namespace

void check_format(torch::serialize::InputArchive& root, const std::string& path) {
  c10::IValue fmt;
  VOLT_CHECK(root.try_read("volt_format", fmt) && fmt.isInt(), CheckpointError, "[Checkpoint] '",
             path, "' has no volt_format entry; it was not written by volt's Trainer.");
  VOLT_CHECK(fmt.toInt() == kCheckpointFormat, CheckpointError, "[Checkpoint] '", path,
             "' has trainer format ", fmt.toInt(), "; this volt reads format ", kCheckpointFormat,
             ".");
}

namespace {

// What a fit resumes from beside the weights and counters: optimizers and schedulers, the
// random state, a part-accumulated gradient, the epoch's metrics, the callbacks', loggers' and
// precision's state.
void write_training_state(Run& run, torch::serialize::OutputArchive& root) {
  Strategy& strategy = run.strategy();
  Module& module = *run.module;
  const LoopState& st = run.st;
  write_nested(root, "optimizers", [&](auto& ar) {
    ar.write("count", c10::IValue(static_cast<int64_t>(run.optimizers.size())));
    for (size_t i = 0; i < run.optimizers.size(); ++i) {
      const auto& config = run.optimizers[i];
      write_nested(ar, "optimizer_" + std::to_string(i), [&](auto& one) {
        strategy.save_optimizer_state(*config.optimizer(), module, one);
      });
      if (config.scheduler()) {
        write_nested(ar, "scheduler_" + std::to_string(i),
                     [&](auto& sched) { config.scheduler()->save(sched); });
      }
    }
  });

  write_nested(root, "rng", [&](auto& rng) {
    for (const auto& kv : strategy.rng_states()) rng.write(kv.first, kv.second);
  });
  // Mid-accumulation: the partial gradient sum is part of the exact state.
  write_nested(root, "grads", [&](auto& grads) {
    if (st.accumulated > 0) strategy.save_accumulated_gradients(module, grads);
  });
  write_nested(root, "train_epoch_metrics", [&](auto& ar) {
    if (strategy.world_size() == 1) {
      run.train_metrics.save(ar);
    } else {
      run.train_metrics.save(
          ar, [&](const at::Tensor& t, Reduce op) { return strategy.reduce(t, op); });
    }
  });
  // The reduced values callbacks and plateau schedulers read (callback_metrics): a fit resumed
  // from a checkpoint written after a validation reaches the epoch's end without running it
  // again, where a ReduceLROnPlateau monitoring its metric failed ("was not logged"; Lightning
  // skips that step on a restart, so its schedule differs from the uninterrupted fit's).
  write_nested(root, "callback_metrics", [&](auto& ar) {
    c10::List<std::string> names;  // as lists: a metric's name may hold any character
    std::vector<double> values;
    for (const auto& kv : run.epoch_metrics) {
      names.push_back(kv.first);
      values.push_back(kv.second);
    }
    ar.write("names", c10::IValue(names));
    ar.write("values", detail::double_list(values));
  });
  write_nested(root, "callbacks", [&](auto& cbs) {
    for (auto& c : run.callbacks) {
      write_nested(cbs, c->state_key(), [&](auto& one) { c->save_state(one); });
    }
  });
  write_nested(root, "loggers", [&](auto& lgs) {
    for (size_t i = 0; i < run.loggers().size(); ++i) {
      write_nested(lgs, std::to_string(i) + "_" + run.loggers()[i]->name(),
                   [&](auto& one) { run.loggers()[i]->save_state(one); });
    }
  });
  write_nested(root, "precision", [&](auto& ar) { strategy.precision().save_state(ar); });
}

}  // namespace

void write_checkpoint(Run& run, torch::serialize::OutputArchive& root, bool weights_only) {
  VOLT_CHECK(run.module != nullptr && run.optimizers_ready, ConfigError,
             "[Trainer] save_checkpoint() needs a module set up by fit(); call it during or "
             "after fit().");
  Strategy& strategy = run.strategy();
  Module& module = *run.module;
  const LoopState& st = run.st;
  root.write("volt_format", c10::IValue(kCheckpointFormat));
  write_nested(root, "state_dict", [&](auto& ar) { strategy.save_model_state(module, ar); });
  // A weights-only checkpoint keeps what validate/test/predict and load_weights read, and the
  // counters for a reader's information: no optimizer, RNG, callback or logger state to resume
  // from.
  if (weights_only) root.write("weights_only", c10::IValue(true));
  write_nested(root, "loop", [&](auto& loop) {
    loop.write("epoch", c10::IValue(st.epoch));
    loop.write("global_step", c10::IValue(st.global_step));
    if (weights_only) return;
    loop.write("batches_done", c10::IValue(st.batches_done));
    loop.write("total_batches_done", c10::IValue(st.total_batches_done));
    loop.write("accumulated", c10::IValue(st.accumulated));
    loop.write("epoch_finished", c10::IValue(st.epoch_finished));
    loop.write("val_pending", c10::IValue(st.val_pending));
    // A checkpoint written before that validation (its batch-end hooks) carries what it owes
    // the monitored schedulers, so a resume steps them as the uninterrupted fit does.
    // Per optimizer (a list since session 93; older checkpoints hold the global step).
    loop.write("monitored_steps_since", c10::IValue(c10::List<int64_t>(run.monitored_steps_since)));
    loop.write("manual_steps", c10::IValue(c10::List<int64_t>(run.manual_steps)));
    loop.write("fit_elapsed_s", c10::IValue(run.fit_elapsed()));
    loop.write("val_loaded_epoch", c10::IValue(run.val_loaded_epoch));
  });
  if (!weights_only) write_training_state(run, root);
  if (run.data != nullptr) {
    write_nested(root, "datamodule", [&](auto& ar) {
      Run::Part part(run, "DataModule.save_state");
      run.data->save_state(ar);
    });
    // Whose state it is: only that DataModule type reads it back (Lightning keys it by the
    // class's __qualname__).
    root.write("datamodule_type", c10::IValue(data_module_type(*run.data)));
  }
  write_nested(root, "module", [&](auto& user) {
    run.module_hook("on_save_checkpoint", [&](Module& m) { m.on_save_checkpoint(user); });
  });
  // The module's hyper-parameters (Lightning's `hyper_parameters`), in every checkpoint: the
  // CLI records the model's config there and reads it back for a command given this
  // checkpoint (src/cli/cli.cpp).
  if (!module.hparams().empty()) {
    write_nested(root, "hyper_parameters", [&](auto& ar) {
      c10::List<std::string> names, values;
      for (const auto& [name, value] : module.hparams()) {
        names.push_back(name);
        values.push_back(value);
      }
      ar.write("names", c10::IValue(names));
      ar.write("values", c10::IValue(values));
    });
  }
}

bool restore_checkpoint(Run& run, const std::string& path, bool full) {
  Strategy& strategy = run.strategy();
  Module& module = *run.module;
  LoopState& st = run.st;
  torch::serialize::InputArchive root = strategy.load_checkpoint(path);
  check_format(root, path);
  if (full) {
    c10::IValue weights_only;
    VOLT_CHECK(!root.try_read("weights_only", weights_only), CheckpointError, "[Checkpoint] '",
               path,
               "' holds the weights only (ModelCheckpoint's save_weights_only): a fit cannot "
               "resume from it (no optimizer, loop or random state); resume from a full "
               "checkpoint, or start a new fit from these weights with volt::load_weights.");
  }
  // Every entry point, as Lightning's restore_model: the module's own state goes with its
  // weights (a vocabulary that predict needs as much as fit), read before them, so that the hook
  // can shape layers to the checkpoint (an embedding sized by its saved vocabulary); it ran
  // after, where such a module met a shape mismatch first.
  torch::serialize::InputArchive user;
  root.read("module", user);
  run.module_hook("on_load_checkpoint", [&](Module& m) { m.on_load_checkpoint(user); });
  torch::serialize::InputArchive model_ar;
  root.read("state_dict", model_ar);
  try {
    strategy.load_model_state(module, model_ar, module.strict_loading());
  } catch (const CheckpointError& e) {
    throw CheckpointError(std::string(e.what()) + " (checkpoint: '" + path + "')");
  }
  bool data_restored = false;
  torch::serialize::InputArchive data_ar;
  if (run.data != nullptr && root.try_read("datamodule", data_ar)) {
    // Another DataModule type's state (fit with one, test with another) is not this one's to
    // read, as Lightning restores a DataModule only from its own class's entry. Checkpoints
    // before session 108 name no type: read as before.
    c10::IValue saved_type;
    const std::string type = data_module_type(*run.data);
    if (root.try_read("datamodule_type", saved_type) && saved_type.isString() &&
        saved_type.toStringRef() != type) {
      log_info("Trainer", "the checkpoint's DataModule state is " + saved_type.toStringRef() +
                              "'s, not " + type + "'s: its load_state is not called.");
    } else {
      Run::Part part(run, "DataModule.load_state");
      run.data->load_state(data_ar);
      data_restored = true;
    }
  }
  if (!full) return data_restored;

  torch::serialize::InputArchive loop;
  root.read("loop", loop);
  auto read = [&](const char* k) {
    c10::IValue v;
    loop.read(k, v);
    return v;
  };
  st.epoch = read("epoch").toInt();
  st.global_step = read("global_step").toInt();
  st.batches_done = read("batches_done").toInt();
  st.total_batches_done = read("total_batches_done").toInt();
  st.accumulated = read("accumulated").toInt();
  st.epoch_finished = read("epoch_finished").toBool();
  st.val_pending = read("val_pending").toBool();
  c10::IValue val_loaded;
  run.val_loaded_epoch =
      loop.try_read("val_loaded_epoch", val_loaded) ? val_loaded.toInt() : Run::kValLoadedUnknown;
  // Absent from older checkpoints, and a number (the global step) before session 93, when
  // every optimizer's scheduler counted the global step.
  c10::IValue since, manual;
  run.monitored_steps_since.clear();
  if (st.val_pending && loop.try_read("monitored_steps_since", since)) {
    if (since.isInt()) {
      if (since.toInt() >= 0)
        run.monitored_steps_since.assign(run.optimizers.size(), since.toInt());
    } else {
      run.monitored_steps_since = since.toIntVector();
    }
  }
  run.manual_steps = loop.try_read("manual_steps", manual)
                         ? manual.toIntVector()
                         : std::vector<int64_t>(run.optimizers.size(), st.global_step);
  c10::IValue elapsed;  // absent from older checkpoints
  run.fit_elapsed_before = loop.try_read("fit_elapsed_s", elapsed) ? elapsed.toDouble() : 0.0;

  torch::serialize::InputArchive cbs;
  root.read("callbacks", cbs);
  for (auto& c : run.callbacks) {
    torch::serialize::InputArchive one;
    if (cbs.try_read(c->state_key(), one)) c->load_state(one);
  }
  // Before the optimizers' states: a callback that added param groups during the run being
  // resumed (BaseFinetuning) adds them again, so the saved states fit.
  run.callback_hook("on_load_optimizer_states",
                    [&](Callback& c) { c.on_load_optimizer_states(run, module); });

  torch::serialize::InputArchive opts_ar;
  root.read("optimizers", opts_ar);
  c10::IValue count;
  opts_ar.read("count", count);
  VOLT_CHECK(count.toInt() == static_cast<int64_t>(run.optimizers.size()), CheckpointError,
             "[Checkpoint] '", path, "' holds ", count.toInt(),
             " optimizers but configure_optimizers returned ", run.optimizers.size(),
             "; resume with the same module setup.");
  for (size_t i = 0; i < run.optimizers.size(); ++i) {
    auto& config = run.optimizers[i];
    torch::serialize::InputArchive one;
    opts_ar.read("optimizer_" + std::to_string(i), one);
    strategy.load_optimizer_state(*config.optimizer(), module, one);
    torch::serialize::InputArchive sched;
    const bool has = opts_ar.try_read("scheduler_" + std::to_string(i), sched);
    VOLT_CHECK(has == static_cast<bool>(config.scheduler()), CheckpointError, "[Checkpoint] '",
               path, "': optimizer ", i, (has ? " had" : " had no"),
               " LR scheduler when saved but now ", (has ? "has none" : "has one"),
               "; resume with the same configure_optimizers.");
    if (has) config.scheduler()->load(sched);
  }

  torch::serialize::InputArchive rng;
  root.read("rng", rng);
  std::map<std::string, at::Tensor> states;
  for (const auto& key : rng.keys()) {
    at::Tensor t;
    rng.read(key, t);
    states[key] = t;
  }
  strategy.set_rng_states(states);

  torch::serialize::InputArchive grads;
  root.read("grads", grads);
  if (st.accumulated > 0) strategy.load_accumulated_gradients(module, grads);

  torch::serialize::InputArchive metrics;
  root.read("train_epoch_metrics", metrics);
  run.train_metrics.load(metrics, /*sync_dist_entries=*/strategy.rank() == 0);
  torch::serialize::InputArchive reduced;  // absent before session 98
  if (root.try_read("callback_metrics", reduced)) {
    c10::IValue names;
    reduced.read("names", names);
    const auto values = detail::read_double_list(reduced, "values");
    const auto list = c10::impl::toTypedList<std::string>(names.toList());
    VOLT_CHECK(list.size() == values.size(), CheckpointError, "[Checkpoint] '", path, "' holds ",
               list.size(), " callback metric names but ", values.size(),
               " values; the checkpoint is corrupted.");
    for (size_t i = 0; i < values.size(); ++i) run.epoch_metrics[list.get(i)] = values[i];
    run.cache_dirty = true;
  }

  torch::serialize::InputArchive lgs;
  root.read("loggers", lgs);
  for (size_t i = 0; i < run.loggers().size(); ++i) {
    torch::serialize::InputArchive one;
    if (lgs.try_read(std::to_string(i) + "_" + run.loggers()[i]->name(), one)) {
      run.loggers()[i]->load_state(one, st.global_step);
    }
  }
  run.share_log_dir();  // the restored loggers' folder, which ModelCheckpoint and others use
  torch::serialize::InputArchive prec;
  root.read("precision", prec);
  strategy.precision().load_state(prec);
  return data_restored;
}

std::string newest_last_checkpoint(Run& run) {
  // Lightning's _parse_ckpt_path("last"): ModelCheckpoint's last checkpoints and
  // OnExceptionCheckpoint's file, the newest of those that exist. A preempted run's
  // on_exception.ckpt resumes where it stopped; the last.ckpt of the epoch before lost up to an
  // epoch (it was the only candidate).
  NewestPath newest;
  const auto consider = [&](const std::string& path) {
    struct stat st;
    if (!path.empty() && ::stat(path.c_str(), &st) == 0) newest.consider(path, st);
  };
  for (auto& c : run.callbacks) {
    if (auto* mc = dynamic_cast<ModelCheckpoint*>(c.get())) {
      consider(mc->find_last_checkpoint(run.log_dir()));
    } else if (auto* oe = dynamic_cast<OnExceptionCheckpoint*>(c.get())) {
      consider(oe->path_for(run.log_dir()));
    }
  }
  return newest.path();
}

std::string resolve_ckpt_path(Run& run, const std::string& ckpt_path, Stage stage) {
  if (ckpt_path != "last" && ckpt_path != "best") return ckpt_path;
  std::vector<ModelCheckpoint*> checkpoints;
  bool on_exception = false;
  for (auto& c : run.callbacks) {
    if (auto* mc = dynamic_cast<ModelCheckpoint*>(c.get())) checkpoints.push_back(mc);
    on_exception = on_exception || dynamic_cast<OnExceptionCheckpoint*>(c.get()) != nullptr;
  }
  VOLT_CHECK(!checkpoints.empty() || (ckpt_path == "last" && on_exception), ConfigError,
             "[Trainer] ckpt_path=\"", ckpt_path,
             "\" needs a ModelCheckpoint callback to find the checkpoint; add one (or keep "
             "enable_checkpointing=true), or pass the checkpoint's path.");
  if (ckpt_path == "best") {
    for (auto* mc : checkpoints) {
      if (!mc->best_model_path().empty()) return mc->best_model_path();
    }
    VOLT_CHECK(false, ConfigError,
               "[Trainer] ckpt_path=\"best\" but no best checkpoint exists "
               "yet; run fit() with a ModelCheckpoint first, or pass the checkpoint's path.");
  }
  const std::string newest = newest_last_checkpoint(run);
  if (newest.empty()) {
    log_warning("Trainer", std::string("ckpt_path=\"last\" but no last checkpoint exists; ") +
                               (stage == Stage::kFit ? "training starts from scratch."
                                                     : "using the current weights."));
  }
  return newest;
}

}  // namespace detail

void load_weights(torch::nn::Module& module, const std::string& path, bool strict,
                  std::shared_ptr<CheckpointIO> io) {
  struct stat st;
  VOLT_CHECK(!path.empty() && ::stat(path.c_str(), &st) == 0, CheckpointError, "[load_weights] '",
             path,
             "' does not exist; pass a checkpoint the Trainer wrote (e.g. "
             "ModelCheckpoint's best_model_path()), a ZeRO checkpoint folder or a .safetensors "
             "file.");
  const std::string ext = ".safetensors";
  if (S_ISREG(st.st_mode) && path.size() > ext.size() &&
      path.compare(path.size() - ext.size(), ext.size(), ext) == 0) {
    load_safetensors(module, path, strict);
    return;
  }
  VOLT_CHECK(S_ISREG(st.st_mode) || detail::is_checkpoint_folder(path), CheckpointError,
             "[load_weights] '", path,
             "' is a folder but not a complete ZeRO or model_parallel checkpoint (no meta file: "
             "a save was interrupted); pass a checkpoint file or a complete folder.");
  TorchCheckpointIO volt_format;
  torch::serialize::InputArchive root =
      detail::read_checkpoint(path, io ? *io : volt_format, /*weights_only=*/true);
  detail::check_format(root, path);
  // The module's own state first, as in restore_checkpoint (Lightning's restore_model).
  if (auto* m = dynamic_cast<Module*>(&module)) {
    torch::serialize::InputArchive user;
    if (root.try_read("module", user)) m->on_load_checkpoint(user);
  }
  torch::serialize::InputArchive weights;
  root.read("state_dict", weights);
  try {
    load_module_state(module, weights, strict);
  } catch (const CheckpointError& e) {
    throw CheckpointError(std::string(e.what()) + " (checkpoint: '" + path + "')");
  }
}

}  // namespace volt
