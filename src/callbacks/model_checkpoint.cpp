#include "volt/callbacks/model_checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <regex>

#include "volt/core/check.h"

namespace volt {

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions options) : options_(std::move(options)) {
  VOLT_CHECK(options_.save_top_k() >= -1, ConfigError, "[ModelCheckpoint] save_top_k=",
             options_.save_top_k(), " is invalid; pass -1 (all), 0 (none) or a count.");
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
  if (!options_.every_n_epochs()) {
    options_.every_n_epochs(options_.every_n_train_steps() > 0 ? 0 : 1);
  }
}

std::string ModelCheckpoint::state_key() const {
  return "ModelCheckpoint{monitor=" + options_.monitor() + ",mode=" +
         (options_.mode() == Mode::kMin ? "min" : "max") +
         ",every_n_train_steps=" + std::to_string(options_.every_n_train_steps()) +
         ",every_n_epochs=" + std::to_string(*options_.every_n_epochs()) + "}";
}

c10::optional<double> ModelCheckpoint::best_model_score() const {
  auto it = best_k_models_.find(best_model_path_);
  if (it == best_k_models_.end()) return c10::nullopt;
  return it->second;
}

void ModelCheckpoint::on_fit_start(RunContext& run, Module& module) {
  if (dirpath_.empty()) {
    dirpath_ = options_.dirpath().empty() ? run.log_dir() + "/checkpoints" : options_.dirpath();
  }
}

std::string ModelCheckpoint::find_last_checkpoint(const std::string& log_dir) const {
  struct stat st;
  if (!last_model_path_.empty() && ::stat(last_model_path_.c_str(), &st) == 0) {
    return last_model_path_;
  }
  const std::string dir = !dirpath_.empty()             ? dirpath_
                          : !options_.dirpath().empty() ? options_.dirpath()
                                                        : log_dir + "/checkpoints";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return "";
  std::string newest;
  struct timespec newest_time {};
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    // last.ckpt, last-v1.ckpt, ...: never temp files (they end in .tmp.<pid>).
    if (name.rfind("last", 0) != 0 || name.size() < 9 ||
        name.compare(name.size() - 5, 5, ".ckpt") != 0) {
      continue;
    }
    const std::string path = dir + "/" + name;
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (newest.empty() || st.st_mtim.tv_sec > newest_time.tv_sec ||
        (st.st_mtim.tv_sec == newest_time.tv_sec && st.st_mtim.tv_nsec > newest_time.tv_nsec)) {
      newest = path;
      newest_time = st.st_mtim;
    }
  }
  ::closedir(d);
  return newest;
}

std::string ModelCheckpoint::format_filename(const Metrics& metrics, int64_t epoch,
                                             int64_t step) const {
  // "{name}" or "{name:fmt}" -> "name=<value>", with fmt a printf conversion ("02d", ".3f").
  static const std::regex field(R"(\{([A-Za-z0-9_/.\-]+)(?::([^}]*))?\})");
  std::string out;
  std::string rest = options_.filename();
  std::smatch m;
  while (std::regex_search(rest, m, field)) {
    out += m.prefix().str();
    const std::string name = m[1].str();
    const std::string fmt = m[2].matched ? m[2].str() : "";
    char buf[128];
    double value;
    bool is_int = false;
    if (name == "epoch") {
      value = static_cast<double>(epoch);
      is_int = true;
    } else if (name == "step") {
      value = static_cast<double>(step);
      is_int = true;
    } else {
      auto it = metrics.find(name);
      VOLT_CHECK(it != metrics.end(), ConfigError, "[ModelCheckpoint] filename field {", name,
                 "} is not a logged metric (logged: ", metrics.size(),
                 " keys); log it or remove it from the filename template.");
      value = it->second;
    }
    if (!fmt.empty() && (fmt.back() == 'd' || fmt.back() == 'i')) {
      std::snprintf(buf, sizeof buf, ("%" + fmt.substr(0, fmt.size() - 1) + "lld").c_str(),
                    static_cast<long long>(value));
    } else if (!fmt.empty()) {
      std::snprintf(buf, sizeof buf, ("%" + fmt).c_str(), value);
    } else if (is_int) {
      std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(value));
    } else {
      std::snprintf(buf, sizeof buf, "%.4f", value);
    }
    out += name + "=" + buf;
    rest = m.suffix().str();
  }
  out += rest;
  for (char& c : out) {
    if (c == '/') c = '_';  // metric names like "val/loss" must not create folders
  }
  return out;
}

bool ModelCheckpoint::better(double a, double b) const {
  return options_.mode() == Mode::kMin ? a < b : a > b;
}

void ModelCheckpoint::save(RunContext& run) {
  const auto& st = run.state();
  if (st.global_step == last_saved_step_ && st.epoch == last_saved_epoch_) return;
  const Metrics& metrics = run.callback_metrics();
  c10::optional<double> score;
  if (!options_.monitor().empty()) {
    auto it = metrics.find(options_.monitor());
    if (it == metrics.end()) return;  // not logged yet (e.g. before the first validation)
    score = it->second;
  }
  last_saved_step_ = st.global_step;
  last_saved_epoch_ = st.epoch;
  const std::string stem = format_filename(metrics, st.epoch, st.global_step);
  std::string path = dirpath_ + "/" + stem + ".ckpt";
  const int64_t k = options_.save_top_k();

  if (k != 0) {
    if (!score) {
      // No monitor: keep the latest checkpoint (k == 1) or all of them (k == -1).
      run.save_checkpoint(path);
      if (k == 1 && !latest_path_.empty() && latest_path_ != path) {
        std::remove(latest_path_.c_str());
        best_k_models_.erase(latest_path_);
      }
      latest_path_ = path;
      best_k_models_[path] = 0.0;
      best_model_path_ = path;
    } else {
      double s = *score;
      if (std::isnan(s)) {
        s = options_.mode() == Mode::kMin ? std::numeric_limits<double>::infinity()
                                          : -std::numeric_limits<double>::infinity();
      }
      std::string worst;
      for (const auto& kv : best_k_models_) {
        if (worst.empty() || better(best_k_models_[worst], kv.second)) worst = kv.first;
      }
      const bool room = k < 0 || static_cast<int64_t>(best_k_models_.size()) < k;
      if (room || better(s, best_k_models_[worst])) {
        run.save_checkpoint(path);
        // Delete the evicted file only after its replacement is safely on disk.
        if (!room && worst != path) {
          std::remove(worst.c_str());
          best_k_models_.erase(worst);
        }
        best_k_models_[path] = s;
        best_model_path_.clear();
        for (const auto& kv : best_k_models_) {
          if (best_model_path_.empty() || better(kv.second, best_k_models_[best_model_path_])) {
            best_model_path_ = kv.first;
          }
        }
      }
    }
  }
  if (options_.save_last()) {
    last_model_path_ = dirpath_ + "/last.ckpt";
    run.save_checkpoint(last_model_path_);
  }
}

void ModelCheckpoint::on_train_batch_end(RunContext& run, Module& module, const Batch& batch,
                                         int64_t batch_idx) {
  const int64_t n = options_.every_n_train_steps();
  const auto& st = run.state();
  if (n > 0 && st.global_step > 0 && st.global_step % n == 0 && st.accumulated == 0) save(run);
}

void ModelCheckpoint::on_train_epoch_end(RunContext& run, Module& module) {
  // With validation, epoch checkpoints are written after it (on_validation_end) instead.
  const int64_t n = *options_.every_n_epochs();
  if (n > 0 && (run.state().epoch + 1) % n == 0) save(run);
}

void ModelCheckpoint::on_validation_end(RunContext& run, Module& module) {
  const int64_t n = *options_.every_n_epochs();
  if (n > 0 && !options_.monitor().empty() && (run.state().epoch + 1) % n == 0) save(run);
}

void ModelCheckpoint::save_state(torch::serialize::OutputArchive& ar) const {
  c10::List<std::string> paths;
  c10::List<double> scores;
  for (const auto& kv : best_k_models_) {
    paths.push_back(kv.first);
    scores.push_back(kv.second);
  }
  ar.write("paths", c10::IValue(paths));
  ar.write("scores", c10::IValue(scores));
  ar.write("best_model_path", c10::IValue(best_model_path_));
  ar.write("last_model_path", c10::IValue(last_model_path_));
  ar.write("latest_path", c10::IValue(latest_path_));
  ar.write("dirpath", c10::IValue(dirpath_));
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
  auto p = paths.toList();
  auto s = scores.toDoubleList();
  for (size_t i = 0; i < p.size(); ++i) best_k_models_[p.get(i).toStringRef()] = s.get(i);
  best_model_path_ = best.toStringRef();
  last_model_path_ = last.toStringRef();
  latest_path_ = latest.toStringRef();
  if (options_.dirpath().empty()) dirpath_ = dir.toStringRef();
}

}  // namespace volt
