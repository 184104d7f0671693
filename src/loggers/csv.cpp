#include "volt/loggers/csv.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/detail/atomic_file_writer.h"
#include "core/detail/numbers.h"
#include "core/detail/print.h"
#include "detail/csv_format.h"
#include "detail/log_dir.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
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

std::string CSVLogger::version_name() {
  return std::to_string(version());
}

std::string CSVLogger::root_dir() {
  return options_.save_dir() + "/" + options_.name();
}

std::string CSVLogger::metrics_path() {
  return log_dir() + "/metrics.csv";
}

void CSVLogger::log_hyperparams(const std::map<std::string, std::string>& params) {
  for (const auto& kv : params) hparams_[kv.first] = kv.second;
  detail::write_hparams_yaml(log_dir(), hparams_);
}

void CSVLogger::log_metrics(const Metrics& given, int64_t step) {
  const Metrics metrics = detail::with_prefix(given, options_.prefix());
  // An empty name would write a header that no reader (a resume, volt report) takes back.
  VOLT_CHECK(metrics.count("") == 0, ValueError,
             "[CSVLogger] a metric has an empty name; give every logged value a name.");
  for (const auto& kv : metrics) {
    if (kv.first != "step" && known_.insert(kv.first).second) columns_.push_back(kv.first);
  }
  // Flushed when the step passes a multiple of flush_logs_every_n_steps since the last flush:
  // Lightning's (step + 1) % n == 0, also for logging intervals that do not divide n. Rows
  // logged at one step for long (a Fabric loop logging without stepping) are flushed every n
  // rows, as Lightning counts rows when no step is given: the buffer stays bounded.
  const int64_t n = options_.flush_logs_every_n_steps();
  pending_.push_back({step, metrics});
  if ((step + 1) / n > (last_written_step_ + 1) / n || static_cast<int64_t>(pending_.size()) >= n) {
    save();
  }
}

namespace {

// The line of a row: its step, then a cell per column (empty where it logged no value).
void append_row(std::string& out, int64_t step, const std::vector<std::string>& columns,
                const Metrics& values) {
  out += std::to_string(step);
  for (const auto& c : columns) {
    out += ',';
    auto it = values.find(c);
    if (it != values.end()) out += fmt_value(it->second);
  }
  out += '\n';
}

bool is_blank(const detail::CsvRecord& r) {
  return r.cells.size() == 1 && r.cells[0].empty();
}

// A data row of metrics.csv as the logger reads it back: its step, then (read_values) the values
// of the header's other columns, cells past the header ignored. DataError naming the line
// otherwise. A row shorter than the header has nothing in the columns it lacks.
int64_t read_step(const detail::CsvRecord& rec, const detail::MetricsHeader& header,
                  const std::string& path) {
  static const std::string kNone;
  const std::string& cell = header.step < rec.cells.size() ? rec.cells[header.step] : kNone;
  int64_t step = 0;
  const auto parsed = std::from_chars(cell.data(), cell.data() + cell.size(), step);
  VOLT_CHECK(parsed.ec == std::errc() && parsed.ptr == cell.data() + cell.size(), DataError,
             "[CSVLogger] ", path, ":", rec.line, ": step '", cell,
             "' is not an integer; repair or delete that line to resume.");
  return step;
}

void read_values(const detail::CsvRecord& rec, const detail::MetricsHeader& header,
                 const std::string& path, Metrics* values) {
  const auto& cells = rec.cells;
  for (size_t c = 0; c < cells.size() && c < header.names.size(); ++c) {
    if (c == header.step || cells[c].empty()) continue;
    char* stop = nullptr;
    const double v = detail::c_strtod(cells[c].c_str(), &stop);
    VOLT_CHECK(stop == cells[c].c_str() + cells[c].size(), DataError, "[CSVLogger] ", path, ":",
               rec.line, ": '", cells[c], "' in column '", header.names[c],
               "' is not a number; repair or delete that line to resume.");
    if (values != nullptr) (*values)[header.names[c]] = v;
  }
}

}  // namespace

void CSVLogger::rewrite() {
  const std::string path = metrics_path();
  if (written_bytes_ == 0) {
    // This run's first write (a resume knows the rows before it). Lightning's "exists and is
    // not empty" warning: a version given explicitly whose folder holds another run's rows,
    // which this run's file replaces.
    std::error_code ec;
    if (std::filesystem::file_size(path, ec) > 0 && !ec) {
      log_warning("CSVLogger", "'" + path +
                                   "' holds rows of an earlier run, which this run's rows "
                                   "replace; pick another version (or -1) to keep them.");
    }
  }
  detail::AtomicFileWriter out(path);
  std::string text = "step";
  for (const auto& c : columns_) text += "," + detail::csv_escape(c);
  text += "\n";
  // The rows already written, read back from the file (bounded by what this run knows is whole)
  // and widened to the new header, each value moved to its name's column. Every name in the
  // file's header is in columns_: names are only ever added.
  int64_t last_step = last_written_step_;
  auto in = detail::c_stream<std::ifstream>();
  if (written_bytes_ > 0) in.open(path, std::ios::binary);
  if (in.is_open()) {
    detail::CsvReader reader(in, "[CSVLogger] " + path, written_bytes_);
    detail::CsvRecord rec;
    if (reader.next(rec) && rec.complete) {
      const detail::MetricsHeader header = detail::metrics_header(rec, "[CSVLogger] " + path);
      Metrics values;
      while (reader.next(rec) && rec.complete) {
        if (is_blank(rec)) continue;
        const int64_t step = read_step(rec, header, path);
        if (drop_from_step_ >= 0 && step >= drop_from_step_) continue;
        values.clear();
        read_values(rec, header, path, &values);
        append_row(text, step, columns_, values);
        last_step = step;
        if (text.size() >= (1 << 20)) {
          out.write(text.data(), text.size());
          text.clear();
        }
      }
    }
  }
  for (const auto& r : pending_) append_row(text, r.step, columns_, r.values);
  out.write(text.data(), text.size());
  out.commit();
  written_bytes_ = out.size();
  written_columns_ = columns_.size();
  last_written_step_ = pending_.empty() ? last_step : pending_.back().step;
  pending_.clear();
  drop_from_step_ = -1;
  must_rewrite_ = false;
}

void CSVLogger::save() {
  if (pending_.empty() && !must_rewrite_) return;
  if (must_rewrite_ || written_bytes_ == 0 || written_columns_ != columns_.size()) {
    rewrite();
    return;
  }
  // Same columns: append only the new rows.
  std::string lines;
  for (const auto& r : pending_) append_row(lines, r.step, columns_, r.values);
  std::FILE* f = std::fopen(metrics_path().c_str(), "a");
  VOLT_CHECK(f != nullptr, ConfigError, "[CSVLogger] cannot append to '", metrics_path(), "' (",
             std::strerror(errno), ").");
  // A short write (disk full) is an error, not rows silently lost; the rows stay buffered and
  // the next save rewrites the file from the rows before them (written_bytes_), so a partly
  // written row is not kept twice.
  const bool written = std::fwrite(lines.data(), 1, lines.size(), f) == lines.size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) {
    const int err = errno;
    must_rewrite_ = true;
    VOLT_CHECK(false, ConfigError, "[CSVLogger] appending to '", metrics_path(), "' failed (",
               std::strerror(err), "); free disk space or choose another save_dir.");
  }
  written_bytes_ += lines.size();
  last_written_step_ = pending_.back().step;
  pending_.clear();
}

void CSVLogger::save_state(torch::serialize::OutputArchive& ar) const {
  detail::save_version_state(ar, version_, options_.save_dir(), options_.name());
}

void CSVLogger::load_state(torch::serialize::InputArchive& ar, int64_t step) {
  const int64_t v = detail::resumed_version(ar, options_.save_dir(), options_.name(),
                                            options_.version(), version_, "CSVLogger");
  if (v < 0) return;
  version_ = v;
  // Keep writing into the same version folder; rows logged after the checkpoint (by the run
  // that died) are dropped, at the next save, so the file reads as one uninterrupted run.
  columns_.clear();
  known_.clear();
  pending_.clear();
  last_written_step_ = -1;
  written_bytes_ = 0;
  written_columns_ = 0;
  drop_from_step_ = -1;
  must_rewrite_ = false;
  const std::string path = metrics_path();
  auto in = detail::c_stream<std::ifstream>(path, std::ios::binary);
  if (!in.is_open()) return;
  // Read one record at a time (the file can be as long as the run), checking every row now so
  // a bad file stops the resume, not a later save. The header quotes names holding commas or
  // quotes: parsed as CSV, not split at commas. A run killed while appending can leave a last
  // line without its newline: it is not counted as written, so the rewrite drops it.
  detail::CsvReader reader(in, "[CSVLogger] " + path);
  detail::CsvRecord rec;
  if (!reader.next(rec) || !rec.complete) return;
  // The file's columns in its order, "step" aside (a file Lightning wrote has it among them;
  // the rewrite puts it first).
  const detail::MetricsHeader header = detail::metrics_header(rec, "[CSVLogger] " + path);
  for (size_t c = 0; c < header.names.size(); ++c) {
    if (c != header.step) columns_.push_back(header.names[c]);
  }
  known_.insert(columns_.begin(), columns_.end());
  uint64_t whole = reader.offset();
  while (reader.next(rec) && rec.complete) {
    whole = reader.offset();
    // Rows from the checkpoint's step on are the dead run's: dropped unread, as before.
    if (!is_blank(rec) && read_step(rec, header, path) < step) {
      read_values(rec, header, path, nullptr);
    }
  }
  written_bytes_ = whole;
  written_columns_ = columns_.size();
  drop_from_step_ = step;
  must_rewrite_ = true;
}

std::ostream& operator<<(std::ostream& os, const CSVLoggerOptions& o) {
  return os << "CSVLoggerOptions(save_dir=" << detail::quoted(o.save_dir())
            << ", name=" << detail::quoted(o.name()) << ", version=" << o.version()
            << ", prefix=" << detail::quoted(o.prefix())
            << ", flush_logs_every_n_steps=" << o.flush_logs_every_n_steps() << ")";
}

}  // namespace volt
