#include "cli/detail/perf_scan.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>

#include "core/detail/ascii.h"
#include "core/detail/host_syncs.h"
#include "core/detail/input_limits.h"
#include "core/detail/numbers.h"
#include "volt/core/check.h"

namespace volt {
namespace detail {
namespace {

// What an event is, from its category: volt's and kineto's traces name it ("cat"); the
// autograd profiler's legacy trace (PyTorch without kineto, e.g. Debian's 1.13) has none.
enum class Kind {
  kOp,       // a libtorch op (cpu_op)
  kRegion,   // a user or framework annotation (user_annotation, record_function)
  kRuntime,  // host-side device runtime calls (cudaLaunchKernel, cudaStreamSynchronize, ...)
  kDevice,   // device-side time (kernels, memcpy, memset)
  kSkip,     // Python stacks, device-side annotations, kineto's whole-trace span, unknown
};

Kind kind_of(const std::string& cat, const std::string& name) {
  // PyTorch's own record_function names carry a '#' (enumerate(DataLoader)#..., Optimizer.step#
  // SGD.step); everything else in a legacy trace is an op.
  if (cat.empty()) return name.find('#') != std::string::npos ? Kind::kRegion : Kind::kOp;
  const std::string c = detail::ascii_lower(cat);
  if (c == "cpu_op" || c == "operator") return Kind::kOp;
  if (c == "user_annotation") return Kind::kRegion;
  if (c == "cuda_runtime" || c == "runtime" || c == "cuda_driver") return Kind::kRuntime;
  if (c == "kernel" || c == "gpu_memcpy" || c == "gpu_memset" || c == "memcpy" || c == "memset") {
    return Kind::kDevice;
  }
  return Kind::kSkip;
}

struct Ev {
  std::string name;
  Kind kind = Kind::kOp;
  std::string thread;  // "pid/tid": kineto writes some ids as strings ("stream 7")
  double ts = 0, dur = 0;
};

// A string field of a trace event, "" when absent or of another type (nlohmann's value(key, "")
// throws type_error for a present non-string: {"ph": 1} is a malformed event, skipped, not an
// escaping exception).
std::string string_field(const nlohmann::json& e, const char* key) {
  const auto it = e.find(key);
  return it != e.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool starts_with(const std::string& s, const char* p) {
  return s.rfind(p, 0) == 0;
}
bool contains(const std::string& s, const char* p) {
  return s.find(p) != std::string::npos;
}

bool is_fetch(const std::string& n) {
  return (starts_with(n, "get_") && contains(n, "_batch")) || contains(n, "DataLoader");
}
bool is_optimizer(const std::string& n) {
  return n == "optimizer_step" || starts_with(n, "Optimizer.step");
}
bool is_collective(const std::string& n) {
  return starts_with(n, "gloo:") || starts_with(n, "nccl:") || starts_with(n, "c10d::") ||
         starts_with(n, "record_param_comms");
}

using Intervals = std::vector<std::pair<double, double>>;

// The union of [a, b) intervals as sorted, disjoint ones (touching ones joined, empty dropped).
Intervals merged(Intervals iv) {
  std::sort(iv.begin(), iv.end());
  Intervals out;
  for (const auto& p : iv) {
    if (p.second <= p.first) continue;
    if (!out.empty() && p.first <= out.back().second) {
      out.back().second = std::max(out.back().second, p.second);
    } else {
      out.push_back(p);
    }
  }
  return out;
}

// Total length of the union of [a, b) intervals.
double union_length(Intervals iv) {
  double total = 0;
  for (const auto& p : merged(std::move(iv))) total += p.second - p.first;
  return total;
}

// Length of the intersection of two merged() sets, in one pass over both.
double overlap_length(const Intervals& a, const Intervals& b) {
  double total = 0;
  for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    const double lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) total += hi - lo;
    (a[i].second < b[j].second ? i : j)++;
  }
  return total;
}

// Whether `t` lies in one of the merged() intervals (binary search).
bool inside(const Intervals& iv, double t) {
  auto it =
      std::upper_bound(iv.begin(), iv.end(), t,
                       [](double x, const std::pair<double, double>& p) { return x < p.first; });
  return it != iv.begin() && t < std::prev(it)->second;
}

std::string pct(double share) {
  return c_format("%.1f%%", 100.0 * share);
}

}  // namespace

PerfScan scan_trace(const std::string& text, const std::string& source) {
  const CNumbers c_numbers;  // the advice's numbers
  InputLimits limits;
  limits.max_bytes = kTraceMaxBytes;
  limits.max_nodes = kTraceMaxNodes;
  const nlohmann::json j = parse_json_bounded(text, "perf", source, limits);
  const nlohmann::json* events = nullptr;
  if (j.is_object() && j.contains("traceEvents") && j["traceEvents"].is_array()) {
    events = &j["traceEvents"];
  } else if (j.is_array()) {
    events = &j;  // the JSON Array Format of the trace-event spec
  }
  VOLT_CHECK(events != nullptr, ConfigError, "[perf] ", source,
             " is not a Chrome trace (no \"traceEvents\" array); pass a file written by "
             "TorchProfiler or torch.profiler's export_chrome_trace.");
  std::vector<Ev> evs, steps;
  for (const auto& e : *events) {
    if (!e.is_object() || string_field(e, "ph") != "X") continue;
    Ev ev;
    ev.name = string_field(e, "name");
    ev.kind = kind_of(string_field(e, "cat"), ev.name);
    const auto pid = e.find("pid"), tid = e.find("tid");
    ev.thread = (pid != e.end() ? pid->dump() : "") + "/" + (tid != e.end() ? tid->dump() : "");
    const auto ts = e.find("ts"), dur = e.find("dur");
    if (ts == e.end() || !ts->is_number() || dur == e.end() || !dur->is_number()) continue;
    ev.ts = ts->get<double>();
    ev.dur = dur->get<double>();
    if (starts_with(ev.name, "ProfilerStep#")) {
      steps.push_back(ev);
    } else if (ev.kind != Kind::kSkip) {
      evs.push_back(std::move(ev));
    }
  }
  VOLT_CHECK(!evs.empty(), ConfigError, "[perf] ", source,
             " has no complete (\"ph\": \"X\") events to scan; record some steps first.");
  PerfScan s;
  s.steps = static_cast<int64_t>(steps.size());
  std::vector<std::pair<double, double>> windows;
  if (steps.empty()) {
    double lo = 1e300, hi = -1e300;
    for (const auto& e : evs) {
      lo = std::min(lo, e.ts);
      hi = std::max(hi, e.ts + e.dur);
    }
    windows.push_back({lo, hi});
  } else {
    for (const auto& st : steps) windows.push_back({st.ts, st.ts + st.dur});
  }
  for (const auto& w : windows) s.step_time_us += w.second - w.first;
  // The thread that runs the steps: the ProfilerStep spans' thread, else the busiest one.
  std::map<std::string, double> busy;
  for (const auto& e : evs) {
    if (e.kind != Kind::kDevice) busy[e.thread] += e.dur;
  }
  std::string main_tid = steps.empty() ? "" : steps.front().thread;
  if (steps.empty()) {
    double best = -1;
    for (const auto& kv : busy) {
      if (kv.second > best) best = kv.second, main_tid = kv.first;
    }
  }
  std::vector<std::pair<double, double>> fetch, optim, coll, covered;
  std::map<std::string, std::vector<const Ev*>> by_tid;
  for (const auto& e : evs) {
    if (e.kind == Kind::kDevice) {
      s.device_time_us += e.dur;
      continue;
    }
    if (e.kind == Kind::kOp) ++s.ops;
    by_tid[e.thread].push_back(&e);
    if (e.thread != main_tid) continue;
    covered.push_back({e.ts, e.ts + e.dur});
    if (is_fetch(e.name)) fetch.push_back({e.ts, e.ts + e.dur});
    if (is_optimizer(e.name)) optim.push_back({e.ts, e.ts + e.dur});
    if (is_collective(e.name)) coll.push_back({e.ts, e.ts + e.dur});
  }
  const double T = std::max(s.step_time_us, 1e-9);
  s.data_share = union_length(fetch) / T;
  s.optimizer_share = union_length(optim) / T;
  s.collective_share = union_length(coll) / T;
  // Idle: step time on the main thread that no event covers (clipped to the steps). The
  // covered union intersected with the steps' union, in one pass over both: clipping each event
  // to each step took events x steps (6,000 overlapping steps and 12,000 events: 72 million
  // pairs, 1.15 GB).
  s.idle_share =
      std::max(0.0, 1.0 - overlap_length(merged(std::move(covered)), merged(windows)) / T);
  const Intervals fetched = merged(fetch);
  // Self time per op name (direct children subtracted, per thread), and host syncs: an op nested
  // in a sync (is_nonzero -> item -> _local_scalar_dense) is part of it, not one more.
  std::map<std::string, double> self;
  double step_self = 0;
  int64_t step_ops = 0;
  for (auto& kv : by_tid) {
    auto& v = kv.second;
    std::sort(v.begin(), v.end(), [](const Ev* a, const Ev* b) {
      return a->ts != b->ts ? a->ts < b->ts : a->dur > b->dur;
    });
    std::vector<const Ev*> stack;
    // How many of the stack's events are host syncs / the non-finite check's scope: counted as
    // they are pushed and popped, not by scanning the stack per event (quadratic in the
    // nesting: a million nested spans would make 10^12 steps).
    int64_t syncs_open = 0, nonfinite_open = 0;
    const auto count = [&](const Ev* a, int64_t d) {
      if (is_host_sync_op(a->name)) syncs_open += d;
      if (a->name == kNonfiniteLossScope) nonfinite_open += d;
    };
    std::map<const Ev*, double> own;
    for (const Ev* e : v) {
      while (!stack.empty() && e->ts >= stack.back()->ts + stack.back()->dur) {
        count(stack.back(), -1);
        stack.pop_back();
      }
      if (is_host_sync_op(e->name) && syncs_open == 0) {
        ++s.host_syncs;
        if (nonfinite_open > 0) ++s.nonfinite_check_syncs;
      }
      own[e] += e->dur;
      if (!stack.empty()) {
        own[stack.back()] -= e->dur;
      }
      stack.push_back(e);
      count(e, +1);
    }
    for (const auto& o : own) {
      if (o.first->kind != Kind::kOp) continue;
      self[o.first->name] += std::max(0.0, o.second);
      // The tiny-op symptom is about the step's own ops: leave out the loader's (other threads,
      // or inside a batch fetch on the main thread).
      const Ev* e = o.first;
      const bool in_fetch = e->thread != main_tid || inside(fetched, e->ts);
      if (!in_fetch) {
        step_self += std::max(0.0, o.second);
        ++step_ops;
      }
    }
  }
  s.mean_op_us = step_ops > 0 ? step_self / static_cast<double>(step_ops) : 0;
  std::vector<std::pair<std::string, double>> top(self.begin(), self.end());
  std::sort(top.begin(), top.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  if (top.size() > 10) top.resize(10);
  s.top_ops = top;

  // ------------------------------------------------------------------ advice
  const double per_step = s.steps > 0 ? static_cast<double>(s.steps) : 1.0;
  const double ops_per_step = static_cast<double>(step_ops) / per_step;
  if (s.data_share > 0.2) {
    s.advice.push_back("data loading takes " + pct(s.data_share) +
                       " of the step: the model waits for batches; load in worker threads "
                       "(DataLoaderOptions::num_workers), make Dataset::get cheaper or implement "
                       "get_batch, and move per-sample transforms out of the loop.");
  }
  if (s.host_syncs > 0) {
    char b[64], own[64];
    std::snprintf(b, sizeof b, "%.1f", s.host_syncs / per_step);
    std::snprintf(own, sizeof own, "%.1f", s.nonfinite_check_syncs / per_step);
    s.advice.push_back(
        std::string(b) + " host read(s) per step (item() / _local_scalar_dense, nonzero, equal" +
        (s.nonfinite_check_syncs > 0
             ? std::string("; ") + own + " of them the Trainer's own non-finite loss check"
             : std::string()) +
        "): on an accelerator each one stalls the host until the device catches up; log "
        "tensors with Module::log instead of reading them, or read every N steps (the "
        "Trainer's own check reads the losses once per logging interval: "
        "TrainerOptions::detect_nonfinite_loss(false)).");
  }
  if (s.mean_op_us > 0 && s.mean_op_us < 20.0 && ops_per_step > 50) {
    char b[96];
    std::snprintf(b, sizeof b, "ops are tiny (mean self time %.1f us per op, %.0f ops per step)",
                  s.mean_op_us, ops_per_step);
    s.advice.push_back(std::string(b) +
                       ": the step is bound by per-op host overhead, not by "
                       "compute; increase the batch size (or accumulate less and batch more).");
  }
  if (s.optimizer_share > 0.3) {
    s.advice.push_back("the optimizer step takes " + pct(s.optimizer_share) +
                       " of the step: use a fused optimizer (FusedAdamW / FusedSGD).");
  }
  if (s.collective_share > 0.2) {
    s.advice.push_back("collectives take " + pct(s.collective_share) +
                       " of the step on the main thread: the job is communication-bound; use "
                       "larger gradient buckets, accumulate gradients (no_sync) or a larger "
                       "batch per rank.");
  }
  if (s.idle_share > 0.2) {
    s.advice.push_back("the main thread is idle for " + pct(s.idle_share) +
                       " of the step (no recorded op or region): look for waits outside "
                       "libtorch (locks, I/O, sleeps) or unprofiled work.");
  }
  if (s.advice.empty()) s.advice.push_back("no symptom above its threshold.");
  return s;
}

std::string format_scan(const PerfScan& s, const std::string& source) {
  const CNumbers c_numbers;
  auto os = detail::c_stream<std::ostringstream>();
  char b[256];
  os << "perf scan of " << source << "\n";
  std::snprintf(b, sizeof b, "  steps: %lld (%.3f ms scanned)\n", static_cast<long long>(s.steps),
                s.step_time_us / 1000.0);
  os << b;
  os << "  data loading: " << pct(s.data_share) << "   optimizer: " << pct(s.optimizer_share)
     << "   collectives: " << pct(s.collective_share)
     << "   idle (main thread): " << pct(s.idle_share) << "\n";
  if (s.device_time_us > 0) {
    std::snprintf(b, sizeof b, "  device time: %.3f ms (%s of the step: %s)\n",
                  s.device_time_us / 1000.0, pct(s.device_time_us / s.step_time_us).c_str(),
                  s.device_time_us < 0.5 * s.step_time_us ? "host-bound" : "device-bound");
  } else {
    std::snprintf(b, sizeof b, "  device time: none in this trace (a CPU run: host time only)\n");
  }
  os << b;
  std::snprintf(b, sizeof b, "  host ops: %lld, mean self time per op %.1f us; host reads: %lld\n",
                static_cast<long long>(s.ops), s.mean_op_us, static_cast<long long>(s.host_syncs));
  os << b << "  top ops by self time:\n";
  for (const auto& t : s.top_ops) {
    std::snprintf(b, sizeof b, "    %-40s %10.3f ms\n", t.first.c_str(), t.second / 1000.0);
    os << b;
  }
  os << "advice:\n";
  for (const auto& a : s.advice) os << "  - " << a << "\n";
  return os.str();
}

}  // namespace detail
}  // namespace volt
