#include "volt/profiler/torch.h"

#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <unordered_map>

#include "core/detail/ascii.h"
#include "core/detail/numbers.h"
#include "core/detail/print.h"
#include "profiler/detail/op_callback.h"
#include "profiler/detail/report_file.h"

#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/io/checkpoint_io.h"

namespace volt {
namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

struct Event {
  std::string name;
  uint64_t tid = 0;
  int64_t start_ns = 0;  // steady clock
  int64_t dur_ns = 0;
  bool is_op = true;
  std::string shapes;  // JSON text of the input shapes, "" when not recorded
};

// One per thread that ran ops while recording: the op callbacks of a thread append here under
// its own (uncontended) mutex, so intra-op and autograd threads never wait on each other.
struct ThreadBuffer {
  std::mutex m;
  std::vector<Event> events;
};

// What the RecordFunction callbacks see. The callbacks are plain function pointers with no user
// data, so the recording profiler is published through one global pointer.
struct Session {
  std::atomic<uint64_t> id{0};
  std::atomic<bool> recording{false};
  bool record_shapes = false;
  std::mutex m;  // guards buffers
  std::vector<std::unique_ptr<ThreadBuffer>> buffers;
};

std::atomic<Session*> g_session{nullptr};
std::atomic<uint64_t> g_next_session_id{1};

struct ThreadSlot {
  uint64_t session_id = 0;
  ThreadBuffer* buffer = nullptr;
};
thread_local ThreadSlot t_slot;

ThreadBuffer* buffer_of(Session* s) {
  const uint64_t id = s->id.load(std::memory_order_acquire);
  if (t_slot.session_id != id || t_slot.buffer == nullptr) {
    std::lock_guard<std::mutex> lock(s->m);
    s->buffers.push_back(std::make_unique<ThreadBuffer>());
    t_slot.buffer = s->buffers.back().get();
    t_slot.session_id = id;
  }
  return t_slot.buffer;
}

struct OpContext : at::ObserverContext {
  int64_t start_ns = 0;
  std::string shapes;
};

void append_shape(std::string& out, c10::IntArrayRef sizes) {
  out += '[';
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(sizes[i]);
  }
  out += ']';
}

std::string input_shapes(const at::RecordFunction& fn) {
  std::string out = "[";
  bool first = true;
  for (const c10::IValue& v : fn.inputs()) {
    if (!first) out += ',';
    first = false;
    if (v.isTensor() && v.toTensor().defined()) {
      append_shape(out, v.toTensor().sizes());
    } else if (v.isTensorList()) {
      out += '[';
      bool f2 = true;
      for (const at::Tensor& t : v.toTensorList().vec()) {
        if (!f2) out += ',';
        f2 = false;
        if (t.defined()) {
          append_shape(out, t.sizes());
        } else {
          out += "[]";
        }
      }
      out += ']';
    } else {
      out += "[]";
    }
  }
  return out + "]";
}

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  Session* s = g_session.load(std::memory_order_acquire);
  if (s == nullptr || !s->recording.load(std::memory_order_relaxed)) return nullptr;
  auto ctx = std::make_unique<OpContext>();
  if (s->record_shapes && fn.needsInputs()) ctx->shapes = input_shapes(fn);
  ctx->start_ns = now_ns();
  return ctx;
}

void on_op_end(const at::RecordFunction& fn, at::ObserverContext* raw) {
  const int64_t end = now_ns();
  if (raw == nullptr) return;
  Session* s = g_session.load(std::memory_order_acquire);
  if (s == nullptr) return;
  auto* ctx = static_cast<OpContext*>(raw);
  ThreadBuffer* b = buffer_of(s);
  Event e;
  e.name = fn.name();
  e.tid = fn.threadId();
  e.start_ns = ctx->start_ns;
  e.dur_ns = end - ctx->start_ns;
  // record_function / RECORD_USER_SCOPE spans are annotations, as in PyTorch's traces.
  e.is_op = fn.scope() != at::RecordScope::USER_SCOPE;
  e.shapes = std::move(ctx->shapes);
  std::lock_guard<std::mutex> lock(b->m);
  b->events.push_back(std::move(e));
}

enum class Action { kNone, kWarmup, kRecord };

const char* step_function_of(const std::string& stage) {
  if (stage == "validate") return "validation_step";
  if (stage == "test") return "test_step";
  if (stage == "predict") return "predict_step";
  return "training_step";
}

struct OpenRegion {
  int64_t start_ns;
  uint64_t tid;
  bool recording;  // started inside a warm-up or recording step
};

struct Window {
  int64_t step;
  int64_t start_ns;
  int64_t end_ns;
};

}  // namespace

std::ostream& operator<<(std::ostream& os, const TorchProfilerOptions& o) {
  return os << "TorchProfilerOptions(dirpath=\"" << o.dirpath() << "\", filename=\"" << o.filename()
            << "\", record_ops=" << o.record_ops() << ", record_shapes=" << o.record_shapes()
            << ", wait=" << o.wait() << ", warmup=" << o.warmup() << ", active=" << o.active()
            << ", repeat=" << o.repeat() << ", row_limit=" << o.row_limit()
            << ", tensorboard=" << o.tensorboard() << ")";
}

struct TorchProfiler::Impl {
  TorchProfilerOptions opts;
  Session session;
  std::mutex m;  // guards everything below (start/stop may come from user threads)
  bool running = false;
  std::string stage;
  int64_t rank = 0;
  std::string step_fn = "training_step";
  uint64_t main_tid = 0;
  int64_t origin_ns = 0;        // steady clock at session start
  int64_t origin_epoch_ns = 0;  // system clock at session start (baseTimeNanoseconds)
  std::optional<detail::GlobalOpCallback> ops;  // while recording ops
  int64_t step = -1;
  Action action = Action::kNone;
  int64_t window_start_ns = 0;
  std::vector<Window> windows;  // closed kRecord windows
  std::map<std::string, std::vector<OpenRegion>> open;
  std::vector<Event> regions;  // finished regions that started while recording
  // Results of the last describe().
  std::vector<Row> rows;
  std::string summary, trace_path, summary_path;
  int64_t recorded_steps = 0;

  bool scheduled() const { return opts.active() > 0; }

  Action action_for(int64_t s) const {
    if (!scheduled()) return Action::kRecord;
    if (s < 0) return Action::kNone;
    const int64_t cycle = opts.wait() + opts.warmup() + opts.active();
    if (opts.repeat() > 0 && s / cycle >= opts.repeat()) return Action::kNone;
    const int64_t m = s % cycle;
    if (m < opts.wait()) return Action::kNone;
    if (m < opts.wait() + opts.warmup()) return Action::kWarmup;
    return Action::kRecord;
  }

  void set_recording(bool on) {
    session.recording.store(on, std::memory_order_relaxed);
    if (ops) ops->enable(on);
  }

  void begin(const std::string& st, int64_t r) {
    Session* expected = nullptr;
    VOLT_CHECK(g_session.compare_exchange_strong(expected, &session) || expected == &session,
               ConfigError,
               "[TorchProfiler] another TorchProfiler is recording in this process (libtorch's "
               "op callbacks are global); use one TorchProfiler at a time.");
    running = true;
    stage = st;
    rank = r;
    step_fn = step_function_of(st);
    main_tid = at::RecordFunction::currentThreadId();
    origin_ns = now_ns();
    origin_epoch_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
    session.record_shapes = opts.record_shapes();
    session.id.store(g_next_session_id.fetch_add(1), std::memory_order_release);
    step = -1;
    windows.clear();
    regions.clear();
    open.clear();
    action = action_for(step);
    window_start_ns = origin_ns;
    if (opts.record_ops()) ops.emplace(&on_op_start, &on_op_end, opts.record_shapes());
    set_recording(action != Action::kNone);
  }

  void close_window(int64_t now) {
    // Without a schedule the whole run records and every event is kept: no window per step (a
    // long run grew a list that kept() scanned for every event).
    if (action == Action::kRecord && scheduled()) windows.push_back({step, window_start_ns, now});
  }

  void advance(int64_t now) {
    close_window(now);
    ++step;
    const Action next = action_for(step);
    window_start_ns = now;
    if ((next != Action::kNone) != (action != Action::kNone)) set_recording(next != Action::kNone);
    action = next;
  }

  void end_session() {
    set_recording(false);
    ops.reset();
    Session* mine = &session;
    g_session.compare_exchange_strong(mine, nullptr);
    running = false;
  }

  std::vector<Event> drain_ops() {
    std::vector<Event> out;
    std::lock_guard<std::mutex> lock(session.m);
    for (auto& b : session.buffers) {
      std::lock_guard<std::mutex> bl(b->m);
      for (auto& e : b->events) out.push_back(std::move(e));
      b->events.clear();
    }
    // Threads re-register under the next session id; the old buffers are empty now.
    session.buffers.clear();
    session.id.store(0, std::memory_order_release);
    return out;
  }

  bool kept(const Event& e) const {
    if (!scheduled()) return true;
    // Events of warm-up steps were recorded only to warm up; keep those of recording windows
    // (in time order: the last one starting at or before the event).
    auto it = std::upper_bound(windows.begin(), windows.end(), e.start_ns,
                               [](int64_t t, const Window& w) { return t < w.start_ns; });
    if (it == windows.begin()) return false;
    --it;
    return e.start_ns >= it->start_ns && e.start_ns < it->end_ns;
  }
};

TorchProfiler::TorchProfiler(TorchProfilerOptions options) : impl_(std::make_unique<Impl>()) {
  const auto& o = options;
  VOLT_CHECK(o.filename().find('/') == std::string::npos, ConfigError,
             "[TorchProfiler] filename \"", o.filename(),
             "\" contains a '/'; put folders in dirpath.");
  VOLT_CHECK(o.wait() >= 0 && o.warmup() >= 0 && o.active() >= 0 && o.repeat() >= 0, ConfigError,
             "[TorchProfiler] schedule wait=", o.wait(), " warmup=", o.warmup(),
             " active=", o.active(), " repeat=", o.repeat(),
             " has a negative value; use counts >= 0.");
  VOLT_CHECK(o.active() > 0 || (o.wait() == 0 && o.warmup() == 0), ConfigError,
             "[TorchProfiler] active=0 records the whole run, so wait=", o.wait(),
             " and warmup=", o.warmup(), " would do nothing; set active > 0 or wait=0 warmup=0.");
  VOLT_CHECK(o.row_limit() > 0, ConfigError, "[TorchProfiler] row_limit=", o.row_limit(),
             " shows no rows; use 1 or more.");
  impl_->opts = std::move(options);
}

TorchProfiler::~TorchProfiler() {
  if (impl_->running) impl_->end_session();
}

void TorchProfiler::setup(const std::string& stage, int64_t rank, const std::string&) {
  std::lock_guard<std::mutex> lock(impl_->m);
  if (impl_->running) impl_->end_session();  // a run that never reached describe()
  impl_->begin(stage, rank);
}

void TorchProfiler::step() {
  std::lock_guard<std::mutex> lock(impl_->m);
  if (!impl_->running) impl_->begin("fit", 0);
  impl_->advance(now_ns());
}

void TorchProfiler::start(const std::string& action) {
  const int64_t now = now_ns();
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.m);
  if (!s.running) s.begin("fit", 0);  // used outside a Trainer: starts at the first region
  // A CUDA graph replay stands for a whole training step (graph_training_step runs
  // training_step only to capture it): each is a step of the schedule too.
  if (action == s.step_fn || (action == "graph_replay" && s.step_fn == "training_step")) {
    s.advance(now);
  }
  s.open[action].push_back({now, at::RecordFunction::currentThreadId(),
                            s.session.recording.load(std::memory_order_relaxed)});
}

void TorchProfiler::stop(const std::string& action) {
  const int64_t now = now_ns();
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.m);
  auto it = s.open.find(action);
  VOLT_CHECK(it != s.open.end() && !it->second.empty(), ProfilerError, "[TorchProfiler] stop(\"",
             action, "\") without a matching start(\"", action,
             "\"); call start before stop (once per start), or use the scoped profile(\"", action,
             "\").");
  const OpenRegion r = it->second.back();
  it->second.pop_back();
  if (it->second.empty()) s.open.erase(it);
  if (r.recording) {
    Event e;
    e.name = action;
    e.tid = r.tid;
    e.start_ns = r.start_ns;
    e.dur_ns = now - r.start_ns;
    e.is_op = false;
    s.regions.push_back(std::move(e));
  }
}

namespace {

// Self time = own time minus the time of directly nested events on the same thread.
void self_times(std::vector<Event>& events, std::vector<double>& self_us) {
  std::vector<size_t> order(events.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Event& x = events[a];
    const Event& y = events[b];
    if (x.tid != y.tid) return x.tid < y.tid;
    if (x.start_ns != y.start_ns) return x.start_ns < y.start_ns;
    return x.dur_ns > y.dur_ns;  // the enclosing event first
  });
  self_us.assign(events.size(), 0.0);
  for (size_t i = 0; i < events.size(); ++i) self_us[i] = events[i].dur_ns / 1000.0;
  std::vector<size_t> stack;
  uint64_t tid = 0;
  for (size_t idx : order) {
    const Event& e = events[idx];
    if (stack.empty() || e.tid != tid) {
      stack.clear();
      tid = e.tid;
    }
    while (!stack.empty()) {
      const Event& top = events[stack.back()];
      if (e.start_ns < top.start_ns + top.dur_ns) break;
      stack.pop_back();
    }
    if (!stack.empty()) self_us[stack.back()] -= e.dur_ns / 1000.0;
    stack.push_back(idx);
  }
  for (double& v : self_us) v = std::max(v, 0.0);
}

}  // namespace

void TorchProfiler::describe(const std::string& stage, const std::string& log_dir) {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.m);
  s.rows.clear();
  s.summary.clear();
  s.trace_path.clear();
  s.summary_path.clear();
  s.recorded_steps = 0;
  if (!s.running) return;
  try {
    const int64_t end = now_ns();
    s.close_window(end);
    s.end_session();
    if (!s.open.empty()) {
      const std::string names =
          detail::joined(s.open, [](const auto& kv) { return detail::quoted(kv.first); });
      log_warning("TorchProfiler", "regions started but never stopped: " + names +
                                       "; call stop() for each start(), or use profile(\"name\")");
      s.open.clear();
    }
    std::vector<Event> events = s.drain_ops();
    for (auto& e : s.regions) events.push_back(std::move(e));
    s.regions.clear();
    events.erase(
        std::remove_if(events.begin(), events.end(), [&](const Event& e) { return !s.kept(e); }),
        events.end());
    if (s.scheduled()) s.recorded_steps = static_cast<int64_t>(s.windows.size());

    // ---------------------------------------------------------------- Chrome trace
    using nlohmann::json;
    json trace_events = json::array();
    const int64_t pid = s.rank;
    trace_events.push_back({{"ph", "M"},
                            {"name", "process_name"},
                            {"pid", pid},
                            {"tid", 0},
                            {"args", {{"name", "rank " + std::to_string(s.rank)}}}});
    trace_events.push_back({{"ph", "M"},
                            {"name", "process_labels"},
                            {"pid", pid},
                            {"tid", 0},
                            {"args", {{"labels", "volt " + stage}}}});
    trace_events.push_back({{"ph", "M"},
                            {"name", "process_sort_index"},
                            {"pid", pid},
                            {"tid", 0},
                            {"args", {{"sort_index", s.rank}}}});
    std::map<uint64_t, bool> tids;
    tids[s.main_tid] = true;
    for (const Event& e : events) tids[e.tid] = true;
    for (const auto& kv : tids) {
      const std::string name =
          kv.first == s.main_tid ? "main thread" : "thread " + std::to_string(kv.first);
      trace_events.push_back({{"ph", "M"},
                              {"name", "thread_name"},
                              {"pid", pid},
                              {"tid", kv.first},
                              {"args", {{"name", name}}}});
    }
    auto us = [&](int64_t ns) { return static_cast<double>(ns - s.origin_ns) / 1000.0; };
    for (const Window& w : s.windows) {
      if (!s.scheduled()) break;
      trace_events.push_back({{"ph", "X"},
                              {"cat", "user_annotation"},
                              {"name", "ProfilerStep#" + std::to_string(w.step)},
                              {"pid", pid},
                              {"tid", s.main_tid},
                              {"ts", us(w.start_ns)},
                              {"dur", (w.end_ns - w.start_ns) / 1000.0}});
    }
    for (const Event& e : events) {
      json ev = {{"ph", "X"},
                 {"cat", e.is_op ? "cpu_op" : "user_annotation"},
                 {"name", e.name},
                 {"pid", pid},
                 {"tid", e.tid},
                 {"ts", us(e.start_ns)},
                 {"dur", e.dur_ns / 1000.0}};
      if (!e.shapes.empty()) ev["args"] = {{"Input Dims", json::parse(e.shapes)}};
      trace_events.push_back(std::move(ev));
    }
    json trace = {{"schemaVersion", 1},
                  {"displayTimeUnit", "ms"},
                  {"baseTimeNanoseconds", s.origin_epoch_ns},
                  {"distributedInfo", {{"rank", s.rank}}},
                  {"traceName", stage},
                  {"traceEvents", std::move(trace_events)}};
    const std::string dir = s.opts.dirpath().empty() ? log_dir : s.opts.dirpath();
    const std::string stem = dir + "/" + stage +
                             (s.opts.filename().empty() ? "" : "-" + s.opts.filename()) + "-rank" +
                             std::to_string(s.rank);
    // torch-tb-profiler takes <worker>[.<digits>].pt.trace.json in any folder under its logdir;
    // the digits (tensorboard_trace_handler writes milliseconds since the epoch) name a span.
    s.trace_path = stem +
                   (s.opts.tensorboard() ? "." + std::to_string(s.origin_epoch_ns / 1000000) : "") +
                   ".pt.trace.json";
    std::filesystem::create_directories(dir);
    atomic_write_file(s.trace_path, trace.dump());

    // ---------------------------------------------------------------- summary
    std::vector<double> self;
    self_times(events, self);
    std::map<std::pair<bool, std::string>, Row> by_name;
    double all_self = 0;
    for (size_t i = 0; i < events.size(); ++i) {
      Row& r = by_name[{events[i].is_op, events[i].name}];
      r.name = events[i].name;
      r.is_op = events[i].is_op;
      ++r.calls;
      r.self_us += self[i];
      r.total_us += events[i].dur_ns / 1000.0;
      all_self += self[i];
    }
    for (auto& kv : by_name) s.rows.push_back(std::move(kv.second));
    std::sort(s.rows.begin(), s.rows.end(),
              [](const Row& a, const Row& b) { return a.self_us > b.self_us; });
    auto os = detail::c_stream<std::ostringstream>();
    os << detail::ascii_upper(stage) << " TorchProfiler summary (rank " << s.rank << ", "
       << (s.scheduled() ? std::to_string(s.recorded_steps) + " recorded steps"
                         : std::string("whole run"))
       << ", host time; top " << s.opts.row_limit() << " of " << s.rows.size()
       << " by self time)\n";
    size_t w = 4;
    const size_t shown = std::min<size_t>(s.rows.size(), static_cast<size_t>(s.opts.row_limit()));
    for (size_t i = 0; i < shown; ++i) w = std::max(w, s.rows[i].name.size());
    w = std::min<size_t>(w, 60);
    const detail::CNumbers c_numbers;  // the table's numbers
    char buf[512];
    std::snprintf(buf, sizeof buf, "%-*s | %-6s | %8s | %12s | %7s | %12s | %10s\n",
                  static_cast<int>(w), "Name", "Kind", "Calls", "Self (ms)", "Self %", "Total (ms)",
                  "Avg (us)");
    os << buf << std::string(w + 75, '-') << "\n";
    for (size_t i = 0; i < shown; ++i) {
      const Row& r = s.rows[i];
      std::snprintf(buf, sizeof buf, "%-*.*s | %-6s | %8lld | %12.3f | %6.1f%% | %12.3f | %10.2f\n",
                    static_cast<int>(w), static_cast<int>(w), r.name.c_str(),
                    r.is_op ? "op" : "region", static_cast<long long>(r.calls), r.self_us / 1000.0,
                    all_self > 0 ? 100.0 * r.self_us / all_self : 0.0, r.total_us / 1000.0,
                    r.total_us / static_cast<double>(r.calls));
      os << buf;
    }
    os << "trace: " << s.trace_path << "\n";
    s.summary = os.str();
    if (s.opts.filename().empty()) {
      // One table on the job's terminal, rank 0's, as SimpleProfiler and Lightning print.
      if (s.rank == 0) std::fprintf(stderr, "%s", s.summary.c_str());
    } else {
      s.summary_path = stem + ".txt";
      detail::append_report(s.summary_path, s.summary, "[TorchProfiler]");
    }
  } catch (const std::exception& e) {
    // A report that cannot be written must not fail the run it describes.
    warn_once("TorchProfiler.describe", "TorchProfiler",
              std::string("could not write the trace or summary: ") + e.what());
  }
  if (s.running) s.end_session();
  s.windows.clear();
  s.regions.clear();
  s.open.clear();
}

const std::vector<TorchProfiler::Row>& TorchProfiler::last_rows() const {
  return impl_->rows;
}
const std::string& TorchProfiler::last_summary() const {
  return impl_->summary;
}
const std::string& TorchProfiler::last_trace_path() const {
  return impl_->trace_path;
}
const std::string& TorchProfiler::last_summary_path() const {
  return impl_->summary_path;
}
int64_t TorchProfiler::last_recorded_steps() const {
  return impl_->recorded_steps;
}

}  // namespace volt
