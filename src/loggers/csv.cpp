#include "volt/loggers/csv.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "volt/core/check.h"
#include "detail/log_dir.h"
#include "volt/io/checkpoint_io.h"

namespace volt {
namespace {

std::string fmt_value(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

std::string csv_escape(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace

CSVLogger::CSVLogger(CSVLoggerOptions options) : options_(std::move(options)) {
  VOLT_CHECK(!options_.save_dir().empty(), ConfigError,
             "[CSVLogger] save_dir is empty; pass a folder.");
  VOLT_CHECK(options_.version() >= -1, ConfigError, "[CSVLogger] version=", options_.version(),
             " is invalid; pass -1 (auto) or a version number.");
  VOLT_CHECK(options_.flush_logs_every_n_steps() >= 1, ConfigError,
             "[CSVLogger] flush_logs_every_n_steps must be >= 1.");
}

int64_t CSVLogger::version() {
  if (version_ >= 0) return version_;
  if (options_.version() >= 0) return version_ = options_.version();
  // Next free version_N under save_dir/name.
  const std::string root = options_.save_dir() + "/" + options_.name();
  version_ = detail::next_version(root);
  detail::make_dirs(root + "/version_" + std::to_string(version_), "CSVLogger");  // claim it at once
  return version_;
}

std::string CSVLogger::log_dir() {
  const std::string dir =
      options_.save_dir() + "/" + options_.name() + "/version_" + std::to_string(version());
  detail::make_dirs(dir, "CSVLogger");
  return dir;
}

std::string CSVLogger::metrics_path() { return log_dir() + "/metrics.csv"; }

void CSVLogger::log_hyperparams(const std::map<std::string, std::string>& params) {
  std::string yaml;
  for (const auto& kv : params) yaml += kv.first + ": " + kv.second + "\n";
  if (yaml.empty()) yaml = "{}\n";
  atomic_write_file(log_dir() + "/hparams.yaml", yaml);
}

void CSVLogger::log_metrics(const Metrics& metrics, int64_t step) {
  for (const auto& kv : metrics) {
    if (std::find(columns_.begin(), columns_.end(), kv.first) == columns_.end()) {
      columns_.push_back(kv.first);
      header_dirty_ = true;
    }
  }
  rows_.push_back({step, metrics});
  if (static_cast<int64_t>(rows_.size() - flushed_) >= options_.flush_logs_every_n_steps()) {
    save();
  }
}

void CSVLogger::rewrite_all() {
  std::ostringstream os;
  os << "step";
  for (const auto& c : columns_) os << "," << csv_escape(c);
  os << "\n";
  for (const auto& r : rows_) {
    os << r.step;
    for (const auto& c : columns_) {
      auto it = r.values.find(c);
      os << "," << (it == r.values.end() ? "" : fmt_value(it->second));
    }
    os << "\n";
  }
  atomic_write_file(metrics_path(), os.str());
  flushed_ = rows_.size();
  header_dirty_ = false;
}

void CSVLogger::save() {
  if (flushed_ == rows_.size() && !header_dirty_) return;
  if (header_dirty_ || flushed_ == 0) {
    rewrite_all();
    return;
  }
  // Same columns: append only the new rows.
  std::FILE* f = std::fopen(metrics_path().c_str(), "a");
  VOLT_CHECK(f != nullptr, ConfigError, "[CSVLogger] cannot append to '", metrics_path(), "' (",
             std::strerror(errno), ").");
  for (size_t i = flushed_; i < rows_.size(); ++i) {
    std::string line = std::to_string(rows_[i].step);
    for (const auto& c : columns_) {
      auto it = rows_[i].values.find(c);
      line += "," + (it == rows_[i].values.end() ? std::string() : fmt_value(it->second));
    }
    line += "\n";
    std::fputs(line.c_str(), f);
  }
  std::fclose(f);
  flushed_ = rows_.size();
}

void CSVLogger::save_state(torch::serialize::OutputArchive& ar) const {
  ar.write("version", c10::IValue(version_));
}

void CSVLogger::load_state(torch::serialize::InputArchive& ar, int64_t step) {
  c10::IValue v;
  ar.read("version", v);
  if (v.toInt() < 0) return;
  version_ = v.toInt();
  // Keep writing into the same version folder; rows logged after the checkpoint (by the run
  // that died) are dropped so the file reads as one uninterrupted run.
  rows_.clear();
  columns_.clear();
  std::FILE* f = std::fopen(metrics_path().c_str(), "r");
  if (f == nullptr) return;
  std::string content;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) content.append(buf, n);
  std::fclose(f);
  std::istringstream in(content);
  std::string line;
  if (!std::getline(in, line)) return;
  std::vector<std::string> header;
  {
    std::stringstream hs(line);
    std::string cell;
    while (std::getline(hs, cell, ',')) header.push_back(cell);
  }
  for (size_t i = 1; i < header.size(); ++i) columns_.push_back(header[i]);
  while (std::getline(in, line)) {
    std::stringstream ls(line);
    std::string cell;
    Row row{0, {}};
    size_t col = 0;
    while (std::getline(ls, cell, ',')) {
      if (col == 0) {
        row.step = std::stoll(cell);
      } else if (!cell.empty() && col < header.size()) {
        row.values[header[col]] = std::stod(cell);
      }
      ++col;
    }
    if (row.step < step) rows_.push_back(row);
  }
  header_dirty_ = true;  // rewrite without the dropped rows on the next save
  flushed_ = 0;
}

}  // namespace volt
