#include "volt/loggers/csv.h"

#include <dirent.h>
#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/detail/ascii.h"
#include "core/detail/numbers.h"
#include "core/detail/print.h"
#include "detail/csv_format.h"
#include "detail/log_dir.h"
#include "volt/core/check.h"
#include "volt/io/checkpoint_io.h"

namespace volt {
namespace {

// The shortest text that reads back as the same double (Python's repr, which Lightning's
// CSVLogger writes); "%.10g" cut 12345678901.0 to 1.23456789e+10 before session 81.
std::string fmt_value(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// YAML 1.1 readers (PyYAML, hence Lightning and TensorBoard tooling) resolve these plain words
// to booleans or null; yaml-cpp's emitter quotes only some of them. Values are strings here.
bool yaml_reads_as_non_string(const std::string& s) {
  static const char* kWords[] = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"};
  const std::string lower = detail::ascii_lower(s);
  for (const char* w : kWords) {
    if (lower == w) return true;
  }
  return false;
}

void emit_string(YAML::Emitter& out, const std::string& s) {
  if (yaml_reads_as_non_string(s)) out << YAML::DoubleQuoted;
  out << s;
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
  return version_ = detail::claim_next_version(root, "CSVLogger");
}

std::string CSVLogger::log_dir() {
  const std::string dir =
      options_.save_dir() + "/" + options_.name() + "/version_" + std::to_string(version());
  detail::make_dirs(dir, "CSVLogger");
  return dir;
}

std::string CSVLogger::metrics_path() {
  return log_dir() + "/metrics.csv";
}

void CSVLogger::log_hyperparams(const std::map<std::string, std::string>& params) {
  // yaml-cpp quotes whatever YAML would misread (": ", "#", "- x", "null", newlines ...); numbers
  // stay plain.
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const auto& kv : params) {
    out << YAML::Key;
    emit_string(out, kv.first);
    out << YAML::Value;
    emit_string(out, kv.second);
  }
  out << YAML::EndMap;
  VOLT_ASSERT(out.good(), "hparams.yaml emitter: ", out.GetLastError());
  atomic_write_file(log_dir() + "/hparams.yaml", std::string(out.c_str()) + "\n");
}

void CSVLogger::log_metrics(const Metrics& metrics, int64_t step) {
  for (const auto& kv : metrics) {
    if (std::find(columns_.begin(), columns_.end(), kv.first) == columns_.end()) {
      columns_.push_back(kv.first);
      header_dirty_ = true;
    }
  }
  // Flushed when the step passes a multiple of flush_logs_every_n_steps since the last flush:
  // Lightning's (step + 1) % n == 0, also for logging intervals that do not divide n.
  const int64_t n = options_.flush_logs_every_n_steps();
  const int64_t flushed_step = flushed_ > 0 ? rows_[flushed_ - 1].step : -1;
  rows_.push_back({step, metrics});
  if ((step + 1) / n > (flushed_step + 1) / n) save();
}

void CSVLogger::rewrite_all() {
  auto os = detail::c_stream<std::ostringstream>();
  os << "step";
  for (const auto& c : columns_) os << "," << detail::csv_escape(c);
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
  std::string lines;
  for (size_t i = flushed_; i < rows_.size(); ++i) {
    lines += std::to_string(rows_[i].step);
    for (const auto& c : columns_) {
      auto it = rows_[i].values.find(c);
      lines += "," + (it == rows_[i].values.end() ? std::string() : fmt_value(it->second));
    }
    lines += "\n";
  }
  std::FILE* f = std::fopen(metrics_path().c_str(), "a");
  VOLT_CHECK(f != nullptr, ConfigError, "[CSVLogger] cannot append to '", metrics_path(), "' (",
             std::strerror(errno), ").");
  // A short write (disk full) is an error, not rows silently lost; the rows stay buffered and
  // the next save rewrites the whole file.
  const bool written = std::fwrite(lines.data(), 1, lines.size(), f) == lines.size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) {
    const int err = errno;
    header_dirty_ = true;
    VOLT_CHECK(false, ConfigError, "[CSVLogger] appending to '", metrics_path(), "' failed (",
               std::strerror(err), "); free disk space or choose another save_dir.");
  }
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
  flushed_ = 0;
  std::FILE* f = std::fopen(metrics_path().c_str(), "r");
  if (f == nullptr) return;
  std::string content;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) content.append(buf, n);
  std::fclose(f);
  // A run killed while appending can leave a last line without its newline: drop it.
  content.erase(content.find_last_of('\n') == std::string::npos ? 0
                                                                : content.find_last_of('\n') + 1);
  // The header quotes names holding commas or quotes: parse the file as CSV, not split at commas.
  const auto records = detail::parse_csv(content, "[CSVLogger] " + metrics_path());
  if (records.empty()) return;
  const std::vector<std::string>& header = records.front().cells;
  columns_ = detail::metrics_header(records.front(), "[CSVLogger] " + metrics_path());
  for (size_t r = 1; r < records.size(); ++r) {
    const auto& cells = records[r].cells;
    if (cells.size() == 1 && cells[0].empty()) continue;  // a blank line
    Row row{0, {}};
    const char* begin = cells[0].data();
    const char* end = begin + cells[0].size();
    const auto parsed = std::from_chars(begin, end, row.step);
    VOLT_CHECK(parsed.ec == std::errc() && parsed.ptr == end, DataError, "[CSVLogger] ",
               metrics_path(), ":", records[r].line, ": step '", cells[0],
               "' is not an integer; repair or delete that line to resume.");
    if (row.step >= step) continue;
    for (size_t c = 1; c < cells.size() && c < header.size(); ++c) {
      if (cells[c].empty()) continue;
      char* stop = nullptr;
      const double v = detail::c_strtod(cells[c].c_str(), &stop);
      VOLT_CHECK(stop == cells[c].c_str() + cells[c].size(), DataError, "[CSVLogger] ",
                 metrics_path(), ":", records[r].line, ": '", cells[c], "' in column '", header[c],
                 "' is not a number; repair or delete that line to resume.");
      row.values[header[c]] = v;
    }
    rows_.push_back(row);
  }
  header_dirty_ = true;  // rewrite without the dropped rows on the next save
  flushed_ = 0;
}

std::ostream& operator<<(std::ostream& os, const CSVLoggerOptions& o) {
  return os << "CSVLoggerOptions(save_dir=" << detail::quoted(o.save_dir())
            << ", name=" << detail::quoted(o.name()) << ", version=" << o.version()
            << ", flush_logs_every_n_steps=" << o.flush_logs_every_n_steps() << ")";
}

}  // namespace volt
