#include "volt/loggers/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/detail/numbers.h"
#include "core/detail/print.h"
#include "detail/log_dir.h"
#include "volt/core/check.h"

namespace volt {
namespace {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord framing requires.
const std::array<uint32_t, 256>& crc32c_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

uint32_t crc32c(const void* data, size_t size) {
  const auto& t = crc32c_table();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) c = t[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

// Minimal protobuf writer: just the wire types the Event protos use.
class Proto {
 public:
  Proto& varint_field(int field, uint64_t v) {
    key(field, 0);
    varint(v);
    return *this;
  }
  Proto& double_field(int field, double v) {
    key(field, 1);
    append_le(&v, 8);
    return *this;
  }
  Proto& float_field(int field, float v) {
    key(field, 5);
    append_le(&v, 4);
    return *this;
  }
  Proto& bytes_field(int field, const std::string& s) {
    key(field, 2);
    varint(s.size());
    buf_ += s;
    return *this;
  }
  Proto& message_field(int field, const Proto& m) { return bytes_field(field, m.buf_); }
  const std::string& bytes() const { return buf_; }

 private:
  void key(int field, int wire) { varint((static_cast<uint64_t>(field) << 3) | wire); }
  void varint(uint64_t v) {
    while (v >= 0x80) {
      buf_ += static_cast<char>((v & 0x7F) | 0x80);
      v >>= 7;
    }
    buf_ += static_cast<char>(v);
  }
  void append_le(const void* p, size_t n) { buf_.append(static_cast<const char*>(p), n); }
  std::string buf_;
};

// The steady clock in nanoseconds, for the time since the last write.
int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double now_secs() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event fields: wall_time=1, step=2, file_version=3, summary=5, session_log=6.
Proto event(int64_t step) {
  Proto e;
  e.double_field(1, now_secs());
  e.varint_field(2, static_cast<uint64_t>(step));
  return e;
}

// google.protobuf.Value: number_value=2, string_value=3. A number is text as C++ and Python
// print numbers ("12", "-0.5", "1e-05"); other text strtod would take ("0x1F", "010", " 12")
// stays a string, as Lightning sends a str hyper-parameter.
Proto proto_value(const std::string& s) {
  Proto v;
  char* end = nullptr;
  const double d = detail::c_strtod(s.c_str(), &end);
  if (detail::is_printed_number(s) && end == s.c_str() + s.size() && std::isfinite(d)) {
    v.double_field(2, d);
  } else {
    v.bytes_field(3, s);
  }
  return v;
}

// A Summary holding one hparams-plugin value: Summary.Value{tag=1, metadata=9}, with
// SummaryMetadata{plugin_data=1: PluginData{plugin_name=1, content=2}}.
Proto hparams_summary(const std::string& tag, const Proto& plugin_content) {
  Proto plugin;
  plugin.bytes_field(1, "hparams").bytes_field(2, plugin_content.bytes());
  Proto meta;
  meta.message_field(1, plugin);
  Proto value;
  value.bytes_field(1, tag).message_field(9, meta);
  Proto summary;
  summary.message_field(1, value);
  return summary;
}

}  // namespace

uint32_t tfrecord_masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardLogger::TensorBoardLogger(TensorBoardLoggerOptions options)
    : options_(std::move(options)) {
  VOLT_CHECK(!options_.save_dir().empty(), ConfigError,
             "[TensorBoardLogger] save_dir is empty; pass a folder.");
  VOLT_CHECK(options_.version() >= -1, ConfigError,
             "[TensorBoardLogger] version=", options_.version(),
             " is invalid; pass -1 (auto) or a version number.");
  VOLT_CHECK(options_.flush_logs_every_n_steps() >= 1, ConfigError,
             "[TensorBoardLogger] flush_logs_every_n_steps=", options_.flush_logs_every_n_steps(),
             " must be >= 1.");
  VOLT_CHECK(options_.flush_secs() >= 0, ConfigError,
             "[TensorBoardLogger] flush_secs=", options_.flush_secs(),
             " must be >= 0 (0 writes at every log call).");
}

TensorBoardLogger::~TensorBoardLogger() {
  try {
    save();
  } catch (...) {  // destructors never throw; finalize() reports write errors
  }
}

int64_t TensorBoardLogger::version() {
  if (version_ >= 0) return version_;
  const std::string root = options_.save_dir() + "/" + options_.name();
  if (options_.version() >= 0) {
    version_ = options_.version();
    detail::make_dirs(root + "/version_" + std::to_string(version_), "TensorBoardLogger");
    return version_;
  }
  return version_ = detail::claim_next_version(root, "TensorBoardLogger");
}

std::string TensorBoardLogger::log_dir() {
  const std::string dir =
      options_.save_dir() + "/" + options_.name() + "/version_" + std::to_string(version());
  detail::make_dirs(dir, "TensorBoardLogger");
  return dir;
}

std::string TensorBoardLogger::version_name() {
  return std::to_string(version());
}

std::string TensorBoardLogger::root_dir() {
  return options_.save_dir() + "/" + options_.name();
}

std::string TensorBoardLogger::events_path() {
  if (path_.empty()) {
    char host[256] = "localhost";
    ::gethostname(host, sizeof(host) - 1);
    // TensorBoard reads every file whose name contains "tfevents"; the pid and a counter keep
    // names unique when a resumed run writes into the same folder within one second.
    static int counter = 0;
    path_ = log_dir() + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now_secs())) +
            "." + host + "." + std::to_string(::getpid()) + "." + std::to_string(counter++) + ".v2";
  }
  return path_;
}

void TensorBoardLogger::open_file() {
  if (file_.is_open()) return;
  file_.open(events_path(), std::ios::binary | std::ios::app);
  VOLT_CHECK(file_.good(), ConfigError, "[TensorBoardLogger] cannot open '", events_path(),
             "' for writing; choose a writable save_dir.");
  Proto first;
  first.double_field(1, now_secs()).bytes_field(3, "brain.Event:2");
  std::string queued;
  queued.swap(pending_);
  write_event(first.bytes());
  if (resume_step_ >= 0) {
    Proto session_log;
    session_log.varint_field(1, 1);  // SessionLog.status = START
    // Event.session_log is field 7 (6 is the deprecated log_message, which TensorBoard shows
    // as a log line and never purges by; before session 81 the marker went there).
    write_event(event(resume_step_).message_field(7, session_log).bytes());
    resume_step_ = -1;
  }
  pending_ += queued;
}

void TensorBoardLogger::write_event(const std::string& data) {
  // TFRecord: u64 length, masked crc32c(length), data, masked crc32c(data); little-endian.
  const uint64_t len = data.size();
  const uint32_t len_crc = tfrecord_masked_crc32c(&len, sizeof(len));
  const uint32_t data_crc = tfrecord_masked_crc32c(data.data(), data.size());
  pending_.append(reinterpret_cast<const char*>(&len), 8);
  pending_.append(reinterpret_cast<const char*>(&len_crc), 4);
  pending_ += data;
  pending_.append(reinterpret_cast<const char*>(&data_crc), 4);
}

void TensorBoardLogger::log_hyperparams(const std::map<std::string, std::string>& params) {
  open_file();
  // HParamsPluginData{version=1, experiment=2 | session_start_info=3}. No experiment: with one,
  // TensorBoard shows exactly what it lists, and a list of the hparams alone has no metrics
  // (Lightning's carries its hp_metric); without, it builds one from the runs' session starts
  // and scalar tags.
  // Lightning's default_hp_metric: hp_metric = -1 at step 0 first, so that the HParams tab has a
  // metric column until the run logs its own hp_metric (a module that saved no hyper-parameter
  // gets none, as Lightning's Trainer does not call log_hyperparams for it).
  if (options_.default_hp_metric() && !params.empty()) log_metrics({{"hp_metric", -1.0}}, 0);
  Proto start;
  for (const auto& kv : params) {
    Proto entry;  // map<string, google.protobuf.Value> entry: key=1, value=2
    entry.bytes_field(1, kv.first).message_field(2, proto_value(kv.second));
    start.message_field(1, entry);
  }
  start.double_field(5, now_secs());
  Proto start_data;
  start_data.varint_field(1, 0).message_field(3, start);
  write_event(event(0)
                  .message_field(5, hparams_summary("_hparams_/session_start_info", start_data))
                  .bytes());
  hparams_logged_ = true;
  save();
  // hparams.yaml as CSVLogger's (Lightning's TensorBoardLogger writes one too): volt report and
  // the tools reading a run folder find the hparams without parsing events.
  for (const auto& kv : params) hparams_[kv.first] = kv.second;
  detail::write_hparams_yaml(log_dir(), hparams_);
}

void TensorBoardLogger::log_metrics(const Metrics& given, int64_t step) {
  const Metrics metrics = detail::with_prefix(given, options_.prefix());
  open_file();
  Proto summary;
  for (const auto& kv : metrics) {
    Proto value;  // Summary.Value{tag=1, simple_value=2}
    value.bytes_field(1, kv.first).float_field(2, static_cast<float>(kv.second));
    summary.message_field(1, value);
  }
  write_event(event(step).message_field(5, summary).bytes());
  const int64_t now = steady_ns();
  if (last_save_ns_ == 0) last_save_ns_ = now;
  if (++unflushed_ >= options_.flush_logs_every_n_steps() ||
      static_cast<double>(now - last_save_ns_) >= options_.flush_secs() * 1e9) {
    save();
  }
}

void TensorBoardLogger::save() {
  if (!file_.is_open() || pending_.empty()) return;
  file_.write(pending_.data(), static_cast<std::streamsize>(pending_.size()));
  file_.flush();
  VOLT_CHECK(file_.good(), ConfigError, "[TensorBoardLogger] writing '", path_,
             "' failed (disk full or folder removed?).");
  pending_.clear();
  unflushed_ = 0;
  last_save_ns_ = steady_ns();
}

void TensorBoardLogger::finalize(RunStatus status) {
  // SessionEndInfo{status=1, end_time_secs=2}; tensorboard/plugins/hparams/api.proto's Status:
  // UNKNOWN=0, SUCCESS=1, FAILURE=2, RUNNING=3 (no "aborted"). TensorBoard keeps the first end
  // status a session records: an interrupted run, which may be resumed, records none (it shows
  // as unknown until the resumed run ends).
  if (hparams_logged_ && status != RunStatus::kInterrupted) {
    Proto end;
    end.varint_field(1, status == RunStatus::kFinished ? 1 : 2);
    end.double_field(2, now_secs());
    Proto end_data;
    end_data.varint_field(1, 0).message_field(4, end);
    write_event(
        event(0).message_field(5, hparams_summary("_hparams_/session_end_info", end_data)).bytes());
  }
  save();
  if (file_.is_open()) file_.close();
}

void TensorBoardLogger::save_state(torch::serialize::OutputArchive& ar) const {
  detail::save_version_state(ar, version_, options_.save_dir(), options_.name());
}

void TensorBoardLogger::load_state(torch::serialize::InputArchive& ar, int64_t step) {
  const int64_t v = detail::resumed_version(ar, options_.save_dir(), options_.name(),
                                            options_.version(), version_, "TensorBoardLogger");
  if (v < 0) return;
  version_ = v;
  // A new file in the same folder; its SessionLog START makes TensorBoard drop the killed
  // run's records logged after `step`.
  if (file_.is_open()) file_.close();
  path_.clear();
  resume_step_ = step;
}

std::ostream& operator<<(std::ostream& os, const TensorBoardLoggerOptions& o) {
  return os << "TensorBoardLoggerOptions(save_dir=" << detail::quoted(o.save_dir())
            << ", name=" << detail::quoted(o.name()) << ", version=" << o.version()
            << ", prefix=" << detail::quoted(o.prefix())
            << ", default_hp_metric=" << o.default_hp_metric()
            << ", flush_logs_every_n_steps=" << o.flush_logs_every_n_steps()
            << ", flush_secs=" << o.flush_secs() << ")";
}

}  // namespace volt
