#include "volt/callbacks/model_checkpoint.h"

#include <dirent.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <regex>
#include <sstream>
#include <tuple>
#include <vector>

#include "callbacks/detail/exception_checkpoint.h"
#include "core/detail/ascii.h"
#include "core/detail/newest_path.h"
#include "core/detail/numbers.h"
#include "core/detail/print.h"
#include "core/detail/python_repr.h"
#include "volt/core/atomic_file.h"
#include "volt/core/check.h"
#include "volt/core/log.h"

namespace volt {
namespace {

/// One "{name}" or "{name:spec}" field of a filename template and the literal text before it.
struct Field {
  std::string prefix, name, spec;
};

/// Splits a template into fields; `tail` receives the text after the last one.
std::vector<Field> parse_template(const std::string& tmpl, std::string* tail) {
  // Any name up to ":" or "}" (Lightning's `(\{.*?)[:\}]`): "{acc@1}" names the metric "acc@1".
  static const std::regex field(R"(\{([^{}:]+)(?::([^}]*))?\})");
  std::vector<Field> out;
  std::string rest = tmpl;
  std::smatch m;
  while (std::regex_search(rest, m, field)) {
    out.push_back({m.prefix().str(), m[1].str(), m[2].matched ? m[2].str() : ""});
    rest = m.suffix().str();
  }
  *tail = rest;
  return out;
}

bool is_int_field(const std::string& name) {
  return name == "epoch" || name == "step";
}

// Lightning's _monitor_candidates: the logged metrics with "epoch" and "step" (a logged value of
// either, truncated to an integer, else the loop's counter), so monitor="step" keeps the newest
// checkpoints and the filename's {epoch} / {step} take a logged value.
Metrics monitor_candidates(const RunContext& run) {
  Metrics m = run.callback_metrics();
  const auto counter = [&](const char* name, int64_t loop) {
    const auto it = m.find(name);
    m[name] = it != m.end() && std::isfinite(it->second) ? std::trunc(it->second)
                                                         : static_cast<double>(loop);
  };
  counter("epoch", run.state().epoch);
  counter("step", run.state().global_step);
  return m;
}

// Python semantics, which Lightning's templates follow: an integer with a float presentation
// type ("{epoch:.1f}") is formatted as a float. fmt would reject the precision.
bool float_presentation(const std::string& spec) {
  return !spec.empty() && std::strchr("eEfFgG", spec.back()) != nullptr;
}

/// Formats with fmt, which checks the spec against the value's type and throws
/// fmt::format_error for a bad one (printf with a user's spec was undefined behaviour).
std::string render(const std::string& name, const std::string& spec, double value) {
  if (is_int_field(name) && !float_presentation(spec)) {
    return fmt::format(fmt::runtime("{:" + spec + "}"), static_cast<long long>(value));
  }
  if (spec.empty()) return detail::python_repr(value);  // Lightning's "{val_loss}"
  return fmt::format(fmt::runtime("{:" + spec + "}"), value);
}

/// `path` with a leading "~" as the home folder, absolute and without "." or ".." parts (a
/// relative folder is the current directory's when the fit starts, as Lightning's realpath).
std::string absolute_folder(std::string path) {
  if (!path.empty() && path[0] == '~' && (path.size() == 1 || path[1] == '/')) {
    if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
      path = home + path.substr(1);
    }
  }
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(path, ec);
  if (ec) return path;
  std::string out = p.lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

/// ConfigError unless every field's spec formats a value of its type and stays a file name.
void check_template(const std::string& tmpl) {
  std::string tail;
  for (const Field& f : parse_template(tmpl, &tail)) {
    const bool is_int = is_int_field(f.name);
    const std::string fix = std::string("; use a Python-style spec such as ") +
                            (is_int ? "{" + f.name + ":02d}" : "{" + f.name + ":.3f}") + " (" +
                            (is_int ? "epoch and step are integers" : "metrics are floats") +
                            ") or no spec.";
    // A file name holds at most 255 bytes: a larger width or precision is a mistake, and
    // {val_loss:999999999} would build a 1 GB string.
    for (size_t i = 0; i < f.spec.size();) {
      if (!detail::ascii_digit(f.spec[i])) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < f.spec.size() && detail::ascii_digit(f.spec[j])) ++j;
      VOLT_CHECK(j - i <= 3 && std::stoi(f.spec.substr(i, j - i)) <= 255, ConfigError,
                 "[ModelCheckpoint] filename \"", tmpl, "\": {", f.name, ":", f.spec,
                 "} asks for width or precision ", f.spec.substr(i, j - i),
                 ", over a file name's 255 bytes", fix);
      i = j;
    }
    try {
      render(f.name, f.spec, is_int ? 1.0 : 0.5);
    } catch (const fmt::format_error& e) {
      VOLT_CHECK(false, ConfigError, "[ModelCheckpoint] filename \"", tmpl, "\": {", f.name, ":",
                 f.spec, "} has an invalid format spec for ",
                 is_int ? "an integer" : "a float metric", " (", e.what(), ")", fix);
    }
  }
}

}  // namespace

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions options) : options_(std::move(options)) {
  VOLT_CHECK(options_.save_top_k() >= -1, ConfigError,
             "[ModelCheckpoint] save_top_k=", options_.save_top_k(),
             " is invalid; pass -1 (all), 0 (none) or a count.");
  VOLT_CHECK(options_.every_n_train_steps() >= 0, ConfigError,
             "[ModelCheckpoint] every_n_train_steps=", options_.every_n_train_steps(),
             " is negative.");
  VOLT_CHECK(!options_.every_n_epochs() || *options_.every_n_epochs() >= 0, ConfigError,
             "[ModelCheckpoint] every_n_epochs=", *options_.every_n_epochs(), " is negative.");
  VOLT_CHECK(!(options_.monitor().empty() && options_.save_top_k() > 1), ConfigError,
             "[ModelCheckpoint] save_top_k=", options_.save_top_k(),
             " needs a monitor to rank checkpoints; set monitor or use save_top_k 1 / -1.");
  VOLT_CHECK(!options_.filename().empty(), ConfigError,
             "[ModelCheckpoint] filename is empty; pass a template such as \"{epoch}-{step}\".");
  // Checked now, not at the first save hours into the run.
  check_template(options_.filename());
  VOLT_CHECK(std::isfinite(options_.train_time_interval()) && options_.train_time_interval() >= 0,
             ConfigError, "[ModelCheckpoint] train_time_interval=", options_.train_time_interval(),
             " is not a number of seconds >= 0 (0 = off).");
  VOLT_CHECK(options_.every_n_train_steps() == 0 || options_.every_n_epochs().value_or(0) == 0,
             ConfigError, "[ModelCheckpoint] every_n_train_steps=", options_.every_n_train_steps(),
             " and every_n_epochs=", *options_.every_n_epochs(),
             " are mutually exclusive (as Lightning); keep one.");
  VOLT_CHECK(options_.train_time_interval() == 0 || (options_.every_n_train_steps() == 0 &&
                                                     options_.every_n_epochs().value_or(0) == 0),
             ConfigError, "[ModelCheckpoint] train_time_interval=", options_.train_time_interval(),
             " with every_n_train_steps=", options_.every_n_train_steps(),
             " and every_n_epochs=", detail::optional_text(options_.every_n_epochs()),
             ": the three triggers are mutually exclusive (as Lightning); keep one.");
  if (!options_.every_n_epochs()) {
    options_.every_n_epochs(
        options_.every_n_train_steps() > 0 || options_.train_time_interval() > 0 ? 0 : 1);
  }
}

std::string ModelCheckpoint::state_key() const {
  return "ModelCheckpoint{monitor=" + options_.monitor() +
         ",mode=" + (options_.mode() == Mode::kMin ? "min" : "max") +
         ",every_n_train_steps=" + std::to_string(options_.every_n_train_steps()) +
         ",every_n_epochs=" + std::to_string(*options_.every_n_epochs()) +
         // Lightning's key has it too; absent when off, so older checkpoints' keys still match.
         (options_.train_time_interval() > 0
              ? ",train_time_interval=" + detail::c_format("%f", options_.train_time_interval())
              : std::string()) +
         "}";
}

c10::optional<double> ModelCheckpoint::best_model_score() const {
  auto it = best_k_models_.find(best_model_path_);
  if (it == best_k_models_.end()) return c10::nullopt;
  return it->second;
}

namespace {
// The callback's folder: the one already resolved, else the dirpath option, else the run's
// <log_dir>/checkpoints.
std::string resolve_folder(const std::string& resolved, const std::string& option,
                           const std::string& log_dir) {
  if (!resolved.empty()) return resolved;
  return absolute_folder(option.empty() ? log_dir + "/checkpoints" : option);
}

// Whether two folder names mean the same folder (relative ones from the current directory).
bool same_folder(const std::string& a, const std::string& b) {
  std::error_code ec1, ec2;
  const auto ca = std::filesystem::weakly_canonical(a, ec1);
  const auto cb = std::filesystem::weakly_canonical(b, ec2);
  return ec1 || ec2 ? a == b : ca == cb;
}
}  // namespace

void ModelCheckpoint::on_train_start(RunContext& run, Module& module) {
  last_time_check_ = std::chrono::steady_clock::now();
}

void ModelCheckpoint::on_fit_start(RunContext& run, Module& module) {
  // Before training, not at the first save (Run::save_checkpoint refuses it there too).
  VOLT_CHECK(!options_.save_weights_only() || run.strategy_name() != "deepspeed", ConfigError,
             "[ModelCheckpoint] save_weights_only with DeepSpeedStrategy: its checkpoints are "
             "folders of every rank's shards, consolidated with their optimizer state; save full "
             "checkpoints and take the weights with volt::load_weights or `volt zero-to-fp32`.");
  dirpath_ = resolve_folder(dirpath_, options_.dirpath(), run.log_dir());
  // Lightning's __warn_if_dir_not_empty (a fresh fit may version or rank against files of
  // another run there), except for a resumed fit, whose files those usually are.
  if (run.is_global_zero() && options_.save_top_k() != 0 && run.ckpt_path().empty()) {
    std::error_code ec;
    if (std::filesystem::is_directory(dirpath_, ec) && !std::filesystem::is_empty(dirpath_, ec) &&
        !ec) {
      log_warning("ModelCheckpoint",
                  "checkpoint directory " + dirpath_ +
                      " exists and is not empty (as Lightning warns): its files may be another "
                      "run's; give each run its own dirpath, or resume with ckpt_path.");
    }
  }
  // Resumed from a run that saved elsewhere (another default_root_dir or dirpath): as Lightning,
  // its top-k files and last checkpoint stay its own (this run neither evicts nor replaces
  // them) and only best_model_path carries over.
  if (!restored_dirpath_.empty() && !same_folder(restored_dirpath_, dirpath_)) {
    log_warning("ModelCheckpoint", "the checkpoint folder changed from '" + restored_dirpath_ +
                                       "' (the resumed run's) to '" + dirpath_ +
                                       "': its top-k list, scores and last checkpoint are not "
                                       "carried over (best_model_path is), and nothing in '" +
                                       restored_dirpath_ + "' is replaced or deleted.");
    best_k_models_.clear();
    saved_order_.clear();
    last_model_path_.clear();
    latest_path_.clear();
    current_score_.reset();
    last_saved_step_ = -1;  // nothing of this step is in the new folder
    last_saved_epoch_ = -1;
  }
  // A deferral is the resumed run's (restored with the state) or nothing: not a previous fit's.
  if (restored_dirpath_.empty()) deferred_ = false;
  // The restored paths as this run names its own (absolute: a checkpoint written before
  // session 102 under the default root "." holds relative ones, which would not match this
  // run's names of the same files).
  if (!restored_dirpath_.empty()) {
    const auto kept = saved_order_;
    const auto scores = best_k_models_;
    best_k_models_.clear();
    saved_order_.clear();
    for (const auto& p : kept) keep(absolute_folder(p), scores.at(p));
    for (std::string* p : {&best_model_path_, &last_model_path_, &latest_path_}) {
      if (!p->empty()) *p = absolute_folder(*p);
    }
    // Before session 107 an unmonitored callback kept its files at score 0: none now.
    if (options_.monitor().empty()) {
      best_k_models_.clear();
      saved_order_.clear();
    }
  }
  restored_dirpath_.clear();
  validated_ = false;
  saved_in_fit_ = false;
  last_written_.clear();
}

std::string ModelCheckpoint::find_last_checkpoint(const std::string& log_dir) const {
  struct stat st;
  if (!last_model_path_.empty() && ::stat(last_model_path_.c_str(), &st) == 0) {
    return last_model_path_;
  }
  const std::string dir = resolve_folder(dirpath_, options_.dirpath(), log_dir);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return "";
  detail::NewestPath newest;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    // last.ckpt, last-v1.ckpt, ...: never temp files (they end in .volt-tmp.<pid>).
    if (name.rfind("last", 0) != 0 || name.size() < 9 ||
        name.compare(name.size() - 5, 5, ".ckpt") != 0) {
      continue;
    }
    const std::string path = dir + "/" + name;
    // A file, or a folder of shards (ZeRO, model_parallel's save_distributed_checkpoint).
    if (::stat(path.c_str(), &st) != 0 || !(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) continue;
    newest.consider(path, st);
  }
  ::closedir(d);
  return newest.path();
}

std::string ModelCheckpoint::format_filename(const Metrics& metrics, int64_t epoch,
                                             int64_t step) const {
  // "{name}" or "{name:spec}" -> "name=<value>"; specs were checked in the constructor.
  std::string out, tail;
  for (const Field& f : parse_template(options_.filename(), &tail)) {
    double value;
    bool missing = false;  // Lightning's missing field is torch.tensor(0): "0" without a spec
    if (f.name == "epoch" && metrics.count("epoch") == 0) {
      value = static_cast<double>(epoch);
    } else if (f.name == "step" && metrics.count("step") == 0) {
      value = static_cast<double>(step);
    } else {
      auto it = metrics.find(f.name);
      if (it == metrics.end()) {
        // As Lightning, which renders a missing field as 0; a typo would else stay unnoticed.
        warn_once("ModelCheckpoint.filename." + f.name, "ModelCheckpoint",
                  "filename field {" + f.name + "} is not a logged metric (logged: [" +
                      detail::joined_keys(metrics) +
                      "]); it renders as 0 (as Lightning). Log it or remove it from the "
                      "filename template.");
        value = 0.0;
        missing = true;
      } else {
        value = it->second;
      }
    }
    out += f.prefix + (options_.auto_insert_metric_name() ? f.name + "=" : std::string()) +
           (missing && f.spec.empty() ? std::string("0") : render(f.name, f.spec, value));
  }
  out += tail;
  for (char& c : out) {
    if (c == '/') c = '_';  // metric names like "val/loss" must not create folders
  }
  return out;
}

bool ModelCheckpoint::better(double a, double b) const {
  return options_.mode() == Mode::kMin ? a < b : a > b;
}

void ModelCheckpoint::save(RunContext& run, bool last_only) {
  const auto& st = run.state();
  if (st.global_step == last_saved_step_ && st.epoch == last_saved_epoch_) return;
  // As Lightning (its last saved step starts at 0): no steps taken, nothing to save.
  if (st.global_step == 0 && !last_only) return;
  const Metrics metrics = monitor_candidates(run);
  c10::optional<double> score;
  bool ranked = !last_only;  // false: only last.ckpt is written (the monitor may be missing)
  // With save_top_k 0 nothing is ranked: a missing monitor is no error (Lightning returns before
  // looking it up), last.ckpt is written.
  if (ranked && !options_.monitor().empty() && options_.save_top_k() != 0) {
    auto it = metrics.find(options_.monitor());
    if (it == metrics.end()) {
      // As Lightning: an error once a validation has run (the metric will never come), a
      // warning before (an epoch save in a fit without validation batches; a step save waits
      // for the validation instead, save_or_defer); last.ckpt is still written.
      const std::string what = "[ModelCheckpoint] monitor \"" + options_.monitor() +
                               "\" is not among the logged metrics [" +
                               detail::joined_keys(metrics) + "]";
      VOLT_CHECK(!validated_, ConfigError, what, "; log it (log(\"", options_.monitor(),
                 "\", value) in validation_step or training_step) or set monitor to one of them.");
      warn_once("ModelCheckpoint.monitor." + options_.monitor(), "ModelCheckpoint",
                what.substr(std::string("[ModelCheckpoint] ").size()) +
                    " yet (no validation has run): no top-k checkpoint is saved until it is" +
                    (options_.save_last() != SaveLast::kNo ? "; last.ckpt is." : "."));
      ranked = false;
    } else {
      score = it->second;
    }
  }
  last_saved_step_ = st.global_step;
  last_saved_epoch_ = st.epoch;
  // last.ckpt's name first: the top-k file's state names it, so a fit resumed from that file (or
  // through a link to it) knows last.ckpt as its own and does not version it.
  const std::string last_path = options_.save_last() != SaveLast::kNo ? last_file(run) : "";
  const std::string previous_last = last_model_path_;
  const auto name_last = [&] {
    if (!last_path.empty()) last_model_path_ = last_path;
  };
  const int64_t k = ranked ? options_.save_top_k() : 0;
  const std::string stem = k != 0 ? format_filename(metrics, st.epoch, st.global_step) : "";

  // Each file holds this callback's state as it is after its save (Lightning sets the paths
  // "before saving because it will be part of the state"): a fit resumed from a top-k file
  // knows that file and forgets the one it replaced. A failed write puts back the state from
  // before that write's changes.
  const auto state = [&] {
    return std::make_tuple(best_k_models_, saved_order_, best_model_path_, latest_path_,
                           last_model_path_, current_score_);
  };
  const auto write = [&](const std::string& path, const auto& before) {
    try {
      run.save_checkpoint(path, options_.save_weights_only());
    } catch (...) {
      std::tie(best_k_models_, saved_order_, best_model_path_, latest_path_, last_model_path_,
               current_score_) = before;
      throw;
    }
    saved_in_fit_ = true;
    last_written_ = path;
  };
  // A file this save no longer keeps is deleted once the file replacing it is on disk; under
  // kLink at the save's end, once last.ckpt (which may have named it) has moved on.
  std::vector<std::string> evicted;
  const auto evict = [&](const std::string& path) {
    if (options_.save_last() == SaveLast::kLink) {
      evicted.push_back(path);
    } else {
      remove_kept(run, path);
    }
  };
  const auto say = [&](const std::string& what) {
    if (options_.verbose() && run.is_global_zero()) {
      log_info("ModelCheckpoint", "Epoch " + std::to_string(st.epoch) + ", global step " +
                                      std::to_string(st.global_step) + ": " + what);
    }
  };
  if (k != 0) {
    if (!score) {
      // No monitor (Lightning's _save_none_monitor_checkpoint): best_model_path names the newest
      // file and no score is kept (best_model_score() is none, best_k_models() empty); a name
      // the template repeats takes the newest file's place; k == 1 deletes the previous file.
      const std::string previous = latest_path_;
      const std::string path = free_path(run, stem, previous);
      const auto before = state();
      latest_path_ = path;
      best_model_path_ = path;
      name_last();
      write(path, before);
      if (k == 1 && !previous.empty() && previous != path) evict(previous);
    } else {
      double s = *score;
      if (std::isnan(s)) {
        s = options_.mode() == Mode::kMin ? std::numeric_limits<double>::infinity()
                                          : -std::numeric_limits<double>::infinity();
      }
      const std::string worst = worst_kept();
      const bool room = k < 0 || static_cast<int64_t>(best_k_models_.size()) < k;
      const std::string path = free_path(run, stem, room ? "" : worst);
      // Saving is collective: every rank takes the same decision (Lightning's all=True; log the
      // monitored metric with sync_dist so that the ranks agree on its value).
      const std::string monitor = "'" + options_.monitor() + "'";
      if (run.reduce_boolean_decision(room || better(s, best_k_models_[worst]), /*all=*/true)) {
        const auto before = state();
        if (!room) forget(worst);
        keep(path, s);
        best_model_path_ = best_kept();
        current_score_ = s;
        name_last();
        say(monitor + " reached " + fmt::format("{:.5f}", s) + " (best " +
            fmt::format("{:.5f}", best_k_models_.at(best_model_path_)) + "), saving model to '" +
            path + "' as top " + std::to_string(k < 0 ? best_k_models_.size() : k));
        write(path, before);
        // Delete the evicted file only after its replacement is safely on disk: the strategy's
        // CheckpointIO orders the removal after the save (rank 0 owns the files).
        if (!room && worst != path) evict(worst);
      } else {
        say(monitor + " was not in top " + std::to_string(k));
      }
    }
  }
  if (!last_path.empty()) {
    auto before = state();
    std::get<4>(before) = previous_last;  // a failed write leaves the name it had before
    last_model_path_ = last_path;
    // kLink (Lightning's _save_last_checkpoint): a link to the newest file this fit wrote; a
    // file of its own until it wrote another, and always without top-k files. When the newest
    // file is last.ckpt itself it is written again (Lightning's link to itself does nothing,
    // leaving an older state there). A file or a folder of shards written at a link's name
    // replaces the link (renamed over it), never what it names.
    if (options_.save_last() == SaveLast::kLink && options_.save_top_k() != 0 &&
        !last_written_.empty() && last_written_ != last_path) {
      run.link_checkpoint(last_written_, last_path);
    } else {
      write(last_path, before);
    }
    if (!previous_last.empty() && previous_last != last_path &&
        best_k_models_.count(previous_last) == 0) {
      evict(previous_last);
    }
  }
  for (const auto& path : evicted) remove_kept(run, path);
}

void ModelCheckpoint::keep(const std::string& path, double score) {
  if (best_k_models_.count(path) != 0) forget(path);
  best_k_models_[path] = score;
  saved_order_.push_back(path);
}

void ModelCheckpoint::forget(const std::string& path) {
  best_k_models_.erase(path);
  saved_order_.erase(std::remove(saved_order_.begin(), saved_order_.end(), path),
                     saved_order_.end());
}

// The kept file to replace next: the worst score, the oldest among equal ones (Lightning's max /
// min over its insertion-ordered dict).
std::string ModelCheckpoint::worst_kept() const {
  std::string worst;
  for (const auto& p : saved_order_) {
    if (worst.empty() || better(best_k_models_.at(worst), best_k_models_.at(p))) worst = p;
  }
  return worst;
}

std::string ModelCheckpoint::best_kept() const {
  std::string best;
  for (const auto& p : saved_order_) {
    if (best.empty() || better(best_k_models_.at(p), best_k_models_.at(best))) best = p;
  }
  return best;
}

void ModelCheckpoint::remove_kept(RunContext& run, const std::string& path) const {
  // Lightning's _should_remove_checkpoint: never the file the run started from, nor one outside
  // this callback's folder (a path a resumed state holds may name another run's file).
  std::error_code ec;
  const auto a = std::filesystem::absolute(path, ec).lexically_normal();
  const std::string started = run.ckpt_path();
  if (!started.empty() && a == std::filesystem::absolute(started, ec).lexically_normal()) return;
  const auto inside =
      a.lexically_relative(std::filesystem::absolute(dirpath_, ec).lexically_normal());
  if (inside.empty() || *inside.begin() == "..") return;
  run.remove_checkpoint(path);
}

void ModelCheckpoint::on_train_batch_end(RunContext& run, Module& module, const Batch& batch,
                                         int64_t batch_idx) {
  const int64_t n = options_.every_n_train_steps();
  const auto& st = run.state();
  if (st.accumulated != 0) return;  // not at an optimizer step
  if (options_.train_time_interval() > 0) {
    const auto now = std::chrono::steady_clock::now();
    const bool due = std::chrono::duration<double>(now - last_time_check_).count() >=
                     options_.train_time_interval();
    // Each rank reads its own clock: every rank saves when one is due (saving is collective).
    if (run.reduce_boolean_decision(due, /*all=*/false)) {
      last_time_check_ = now;
      save_or_defer(run);
    }
    return;
  }
  if (n > 0 && st.global_step > 0 && st.global_step % n == 0) save_or_defer(run);
}

// Lightning 2.6's deferral: a monitored metric not logged yet (a validation metric before the
// first validation), or about to be replaced by the validation that runs right after this batch,
// would rank the save by no score or a stale one; the save waits for where this callback writes
// its epoch checkpoints (that validation's end, or the train epoch's end), training's end at the
// latest. Before a validation that is not the epoch's last while the epoch checkpoints are
// written at the epoch's end, it does not wait (as Lightning): saves every few steps would
// gather into one at the epoch's end.
void ModelCheckpoint::save_or_defer(RunContext& run) {
  if (!options_.monitor().empty()) {
    const LoopState& st = run.state();
    const bool missing = monitor_candidates(run).count(options_.monitor()) == 0;
    const bool fresh_next = st.val_pending && (!saves_on_train_epoch_end(run) ||
                                               st.batches_done >= st.num_training_batches);
    if (missing || fresh_next) {
      deferred_ = true;
      return;
    }
  }
  save(run);
}

std::string ModelCheckpoint::free_path(RunContext& run, const std::string& stem,
                                       const std::string& evicted) {
  std::string path = dirpath_ + "/" + stem + ".ckpt";
  if (!options_.enable_version_counter()) return path;
  // Rank 0 holds the files; any rank that sees one counts (every rank takes the same name).
  auto taken = [&](const std::string& p) {
    if (p == evicted) return false;
    std::error_code ec;
    const bool here = best_k_models_.count(p) != 0 || std::filesystem::exists(p, ec);
    return run.reduce_boolean_decision(here, /*all=*/false);
  };
  for (int64_t v = 1; taken(path); ++v) {
    path = dirpath_ + "/" + stem + "-v" + std::to_string(v) + ".ckpt";
  }
  return path;
}

// A last.ckpt of another run in the folder is not overwritten: last-v1.ckpt, ... (this run's own
// last file, or the resumed run's, is).
std::string ModelCheckpoint::last_file(RunContext& run) {
  std::string path = dirpath_ + "/last.ckpt";
  if (!options_.enable_version_counter()) return path;
  const auto taken = [&](const std::string& p) {
    std::error_code ec;
    return run.reduce_boolean_decision(p != last_model_path_ && std::filesystem::exists(p, ec),
                                       /*all=*/false);
  };
  for (int64_t v = 1; taken(path); ++v) path = dirpath_ + "/last-v" + std::to_string(v) + ".ckpt";
  return path;
}

// Lightning's ModelCheckpoint._should_save_on_train_epoch_end, except that a fit without
// validation saves at each epoch's end whatever check_val_every_n_epoch says (Lightning asks that
// first and then saves no epoch checkpoint at all).
bool ModelCheckpoint::saves_on_train_epoch_end(const RunContext& run) const {
  if (options_.save_on_train_epoch_end()) return *options_.save_on_train_epoch_end();
  const LoopState& st = run.state();
  if (st.num_val_batches == 0) return true;
  if (!st.val_every_epoch) return false;  // when a validation comes is not known
  return st.val_check_at_epoch_end;       // else after each of the epoch's validations
}

void ModelCheckpoint::on_train_epoch_end(RunContext& run, Module& module) {
  // Here the epoch's validation has run and its training metrics are reduced: a monitor on
  // either is current.
  if (!saves_on_train_epoch_end(run)) return;
  if (deferred_) {
    deferred_ = false;
    save(run);
  }
  const int64_t n = *options_.every_n_epochs();
  if (n > 0 && (run.state().epoch + 1) % n == 0) save(run);
}

void ModelCheckpoint::on_validation_end(RunContext& run, Module& module) {
  if (run.state().stage != Stage::kFit) return;  // Trainer::validate() saves nothing
  validated_ = true;
  if (saves_on_train_epoch_end(run)) return;
  if (deferred_) {
    deferred_ = false;
    save(run);
  }
  const int64_t n = *options_.every_n_epochs();
  if (n > 0 && (run.state().epoch + 1) % n == 0) save(run);
}

// A save still deferred when training ends (max_steps or a stop came before the validation it
// waited for) is written now, with the scores there are (Lightning drops it). Then, as Lightning
// 2.6, save_last gives a last checkpoint even when no trigger fired in the fit (every_n_epochs
// past max_epochs, every_n_train_steps past the steps taken).
void ModelCheckpoint::on_train_end(RunContext& run, Module&) {
  if (deferred_) {
    deferred_ = false;
    save(run);
  }
  if (options_.save_last() != SaveLast::kNo && !saved_in_fit_) save(run, /*last_only=*/true);
}

// Lightning's save_on_exception: the template's file (not ranked; versioned where the name is
// taken, which Lightning overwrites), then last.ckpt.
void ModelCheckpoint::on_exception(RunContext& run, Module&, const std::exception& error) {
  if (!options_.save_on_exception()) return;
  if (!detail::may_checkpoint_after(run, error, "ModelCheckpoint")) return;
  const LoopState& st = run.state();
  // As Lightning (its last saved step starts at 0): nothing trained, nothing to save.
  if (st.global_step == 0) return;
  if (st.global_step == last_saved_step_ && st.epoch == last_saved_epoch_) return;
  if (dirpath_.empty()) return;  // failed before on_fit_start (a restore): no folder yet
  const std::string path =
      free_path(run, format_filename(monitor_candidates(run), st.epoch, st.global_step), "");
  // The file names last.ckpt in its state, as a top-k file does (see save()).
  const std::string previous_last = last_model_path_;
  const std::string last_path = options_.save_last() != SaveLast::kNo ? last_file(run) : "";
  if (!last_path.empty()) last_model_path_ = last_path;
  try {
    run.save_checkpoint(path, options_.save_weights_only());
  } catch (...) {
    last_model_path_ = previous_last;
    throw;
  }
  saved_in_fit_ = true;
  last_written_ = path;
  if (!last_path.empty()) {
    last_model_path_ = previous_last;  // save() compares against the name before this save
    save(run, /*last_only=*/true);
  } else {
    last_saved_step_ = st.global_step;
    last_saved_epoch_ = st.epoch;
  }
  detail::report_exception_checkpoint(run, error, path, last_path, "ModelCheckpoint");
}

std::string ModelCheckpoint::kth_best_model_path() const {
  // Lightning sets it once the list holds k files, k being one more than it held before each
  // save under save_top_k -1: from the first file on.
  const int64_t k = options_.save_top_k();
  const auto kept = static_cast<int64_t>(best_k_models_.size());
  if (options_.monitor().empty() || k == 0 || kept == 0 || (k > 0 && kept < k)) return "";
  return worst_kept();
}

double ModelCheckpoint::kth_value() const {
  const std::string kth = kth_best_model_path();
  if (!kth.empty()) return best_k_models_.at(kth);
  return options_.mode() == Mode::kMin ? std::numeric_limits<double>::infinity()
                                       : -std::numeric_limits<double>::infinity();
}

namespace {
// A float as PyYAML writes it (Lightning's to_yaml): repr with a ".0" before an exponent that
// has no dot (YAML 1.1 reads "1e-05" as a string), .inf / -.inf / .nan.
std::string yaml_float(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  std::string s = detail::python_repr(v);
  const size_t e = s.find('e');
  if (e != std::string::npos && s.find('.') == std::string::npos) s.insert(e, ".0");
  return s;
}
}  // namespace

void ModelCheckpoint::to_yaml(const std::string& path) const {
  VOLT_CHECK(!path.empty() || !dirpath_.empty(), ConfigError,
             "[ModelCheckpoint] to_yaml() has no folder to write best_k_models.yaml into before "
             "a fit starts (dirpath is unset); pass a path, or call it after fit.");
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const auto& [file, score] : best_k_models_) {  // sorted, as yaml.dump sorts its keys
    out << YAML::Key << YAML::DoubleQuoted << file << YAML::Value << yaml_float(score);
  }
  out << YAML::EndMap;
  VOLT_ASSERT(out.good(), "best_k_models.yaml emitter: ", out.GetLastError());
  atomic_write_file(path.empty() ? dirpath_ + "/best_k_models.yaml" : path,
                    std::string(out.c_str()) + "\n");
}

void ModelCheckpoint::save_state(torch::serialize::OutputArchive& ar) const {
  c10::List<std::string> paths;
  c10::List<double> scores;
  for (const auto& p : saved_order_) {  // in save order: ties go to the older after a resume
    paths.push_back(p);
    scores.push_back(best_k_models_.at(p));
  }
  ar.write("paths", c10::IValue(paths));
  ar.write("scores", c10::IValue(scores));
  ar.write("best_model_path", c10::IValue(best_model_path_));
  ar.write("last_model_path", c10::IValue(last_model_path_));
  ar.write("latest_path", c10::IValue(latest_path_));
  ar.write("dirpath", c10::IValue(dirpath_));
  // Written by save() itself, so a checkpoint this callback writes says it saved its step: a fit
  // resumed from it does not save that step again (at on_train_epoch_end after a checkpoint
  // written at on_validation_end, whose validation it does not run again).
  ar.write("last_saved_step", c10::IValue(last_saved_step_));
  ar.write("last_saved_epoch", c10::IValue(last_saved_epoch_));
  ar.write("deferred", c10::IValue(deferred_));
  if (current_score_) ar.write("current_score", c10::IValue(*current_score_));
}

void ModelCheckpoint::load_state(torch::serialize::InputArchive& ar) {
  c10::IValue paths, scores, best, last, latest, dir;
  ar.read("paths", paths);
  ar.read("scores", scores);
  ar.read("best_model_path", best);
  ar.read("last_model_path", last);
  ar.read("latest_path", latest);
  ar.read("dirpath", dir);
  best_k_models_.clear();
  saved_order_.clear();
  auto p = paths.toList();
  auto s = scores.toDoubleList();
  for (size_t i = 0; i < p.size(); ++i) keep(p.get(i).toStringRef(), s.get(i));
  best_model_path_ = best.toStringRef();
  last_model_path_ = last.toStringRef();
  latest_path_ = latest.toStringRef();
  // Compared with this run's folder at fit start (on_fit_start), which is resolved from this
  // run's options and log_dir, not taken from the checkpoint.
  restored_dirpath_ = dir.toStringRef();
  // What the checkpoint says was saved (every rank reads the same file), never what this process
  // remembers: a process that lives through an elastic restart (the launching rank) must not
  // keep the failed attempt's "already saved at this step", since saving is collective and the
  // relaunched ranks would save where this one skips. Older checkpoints: nothing saved.
  c10::IValue step, epoch;
  last_saved_step_ = ar.try_read("last_saved_step", step) ? step.toInt() : -1;
  last_saved_epoch_ = ar.try_read("last_saved_epoch", epoch) ? epoch.toInt() : -1;
  // A step save waiting for the validation after it (absent before session 102: none).
  c10::IValue deferred;
  deferred_ = ar.try_read("deferred", deferred) && deferred.isBool() && deferred.toBool();
  c10::IValue current;
  current_score_ = ar.try_read("current_score", current) && current.isDouble()
                       ? c10::optional<double>(current.toDouble())
                       : c10::nullopt;
}

std::ostream& operator<<(std::ostream& os, const ModelCheckpointOptions& o) {
  return os << "ModelCheckpointOptions(dirpath=" << detail::quoted(o.dirpath())
            << ", filename=" << detail::quoted(o.filename())
            << ", monitor=" << detail::quoted(o.monitor())
            << ", mode=" << (o.mode() == Mode::kMin ? "min" : "max")
            << ", save_top_k=" << o.save_top_k() << ", save_last="
            << (o.save_last() == SaveLast::kLink   ? "link"
                : o.save_last() == SaveLast::kCopy ? "1"
                                                   : "0")
            << ", every_n_train_steps=" << o.every_n_train_steps()
            << ", every_n_epochs=" << detail::optional_text(o.every_n_epochs())
            << ", train_time_interval=" << o.train_time_interval()
            << ", save_weights_only=" << o.save_weights_only() << ", save_on_train_epoch_end="
            << (o.save_on_train_epoch_end() ? (*o.save_on_train_epoch_end() ? "1" : "0") : "none")
            << ", enable_version_counter=" << o.enable_version_counter()
            << ", auto_insert_metric_name=" << o.auto_insert_metric_name()
            << ", verbose=" << o.verbose() << ", save_on_exception=" << o.save_on_exception()
            << ")";
}

}  // namespace volt
