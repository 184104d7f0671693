#include "volt/distributed/process_group.h"

#include <signal.h>
#include <torch/torch.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <ostream>
#include <thread>

#include "core/detail/ascii.h"
#include "core/detail/numbers.h"
#include "core/detail/print.h"
#include "core/detail/tracing.h"
#include "detail/async_collective.h"
#include "detail/c10d.h"
#include "detail/collective_checks.h"
#include "detail/dtype_buckets.h"
#include "detail/net.h"
#include "volt/core/check.h"
#include "volt/core/env.h"

#if VOLT_DIST_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace volt {
namespace {

constexpr const char* kTag = "[ProcessGroup]";

}  // namespace

std::string to_string(Backend backend) {
  return backend == Backend::kGloo ? "gloo" : "nccl";
}

Backend resolve_backend(const std::string& name, c10::DeviceType device) {
  VOLT_CHECK(name == "auto" || name == "gloo" || name == "nccl", ConfigError, kTag,
             " unknown process group backend \"", name, "\"; use \"auto\", \"gloo\" or \"nccl\".");
  const bool cuda = device == c10::DeviceType::CUDA;
  Backend b = name == "gloo"   ? Backend::kGloo
              : name == "nccl" ? Backend::kNccl
                               : (cuda ? Backend::kNccl : Backend::kGloo);
  if (b == Backend::kNccl) {
    VOLT_CHECK(cuda, NotAvailable, kTag, " backend \"nccl\" needs CUDA tensors but the device is ",
               c10::DeviceTypeName(device, /*lower_case=*/true),
               "; use \"gloo\" (or \"auto\") on CPU.");
  }
  const std::string missing = ProcessGroup::backend_unavailable_reason(b);
  VOLT_CHECK(missing.empty(), NotAvailable, kTag, " backend \"", to_string(b),
             "\" is not in this build (", missing, ")",
             b == Backend::kNccl ? "; use \"gloo\"."
             : cuda              ? "; use \"nccl\"."
                                 : "; use a libtorch with Gloo (Debian's libtorch-dev).");
  return b;
}

std::string ProcessGroup::backend_unavailable_reason(Backend backend) {
  if (backend == Backend::kNccl && !VOLT_DIST_NCCL) {
    return "it needs a libtorch >= 2.0 built with USE_C10D_NCCL, and nccl.h where CMake looks: "
           "NCCL_INCLUDE_DIR";
  }
  if (backend == Backend::kGloo && !VOLT_DIST_GLOO) {
    return "libtorch without USE_C10D_GLOO, or no gloo headers as in the CUDA wheel";
  }
  return "";
}

bool ProcessGroup::gloo_available() {
  return backend_unavailable_reason(Backend::kGloo).empty();
}

#if !VOLT_DIST

struct ProcessGroup::Impl {};

ProcessGroup::ProcessGroup(const ClusterEnvironment& env, ProcessGroupOptions options)
    : rank_(env.global_rank), world_size_(env.world_size), options_(std::move(options)) {
  const bool nccl = options_.backend() == Backend::kNccl;
  resolve_backend(to_string(options_.backend()), nccl ? c10::kCUDA : c10::kCPU);
  VOLT_ASSERT(false, "resolve_backend accepted a backend this build cannot create");
}
ProcessGroup::~ProcessGroup() = default;
at::Tensor ProcessGroup::all_reduce(const at::Tensor&, Reduce) {
  VOLT_ASSERT(false);
}
void ProcessGroup::broadcast_(at::Tensor&, int64_t) {
  VOLT_ASSERT(false);
}
void ProcessGroup::broadcast_(std::vector<at::Tensor>&, int64_t) {
  VOLT_ASSERT(false);
}
void ProcessGroup::all_reduce_(std::vector<at::Tensor>&, Reduce) {
  VOLT_ASSERT(false);
}
std::vector<at::Tensor> ProcessGroup::all_gather(const at::Tensor&) {
  VOLT_ASSERT(false);
}
at::Tensor ProcessGroup::all_gather_flat(const at::Tensor&) {
  VOLT_ASSERT(false);
}
at::Tensor ProcessGroup::reduce_scatter(const at::Tensor&, Reduce) {
  VOLT_ASSERT(false);
}
void ProcessGroup::barrier() {
  VOLT_ASSERT(false);
}
void ProcessGroup::send(const at::Tensor&, int64_t) {
  VOLT_ASSERT(false);
}
void ProcessGroup::recv_(at::Tensor&, int64_t) {
  VOLT_ASSERT(false);
}
struct ProcessGroup::Transfer::State {};
void ProcessGroup::Transfer::wait() {}
ProcessGroup::Transfer ProcessGroup::isend(const at::Tensor&, int64_t) {
  VOLT_ASSERT(false);
}
ProcessGroup::Transfer ProcessGroup::irecv_(at::Tensor&, int64_t) {
  VOLT_ASSERT(false);
}
bool ProcessGroup::all_of(bool) {
  VOLT_ASSERT(false);
}
bool ProcessGroup::any_of(bool) {
  VOLT_ASSERT(false);
}
void ProcessGroup::run_on_leaders(const std::string&, const std::vector<int64_t>&,
                                  const std::function<void()>&) {
  VOLT_ASSERT(false);
}
std::shared_ptr<ProcessGroup> ProcessGroup::new_group(const std::vector<int64_t>&,
                                                      const std::string&) {
  VOLT_ASSERT(false);
}
std::shared_ptr<RendezvousStore> ProcessGroup::rendezvous_store() const {
  return nullptr;
}
void report_lost_rank(const ClusterEnvironment&, const std::string&,
                      std::chrono::milliseconds) noexcept {}

namespace detail {
struct PendingCollective::State {};
PendingCollective start_reduce_scatter(const std::shared_ptr<ProcessGroup>&, at::Tensor, Reduce) {
  VOLT_ASSERT(false);
}
PendingCollective start_all_gather(const std::shared_ptr<ProcessGroup>&, const at::Tensor&) {
  VOLT_ASSERT(false);
}
std::vector<at::Tensor> PendingCollective::wait() {
  VOLT_ASSERT(false);
}
}  // namespace detail

#else  // VOLT_DIST

namespace {

// A peer that dies closes its sockets, and the next write to one raises SIGPIPE, whose default
// action kills this process before Gloo can report the EPIPE as an error: the survivor of a
// killed rank would die too instead of throwing a DistributedError (seen in the NVMe kill test,
// now and then). Python ignores SIGPIPE at start-up, so PyTorch users never meet this; a C++
// program gets the default. Ignored here, unless the program installed its own handler.
void ignore_sigpipe() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return;
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, nullptr);
}

// The dtypes libtorch 1.13's Gloo moves and reduces itself (2.x adds bool and bf16; NCCL lacks
// int16 and complex). The collectives that only copy (broadcast, all-gather, the all-to-all under
// reduce-scatter, send and recv) carry any other dtype as its bytes; all_reduce, which computes,
// widens it instead (ProcessGroup::all_reduce).
bool carried_as_is(c10::ScalarType t) {
  switch (t) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kChar:
    case at::kByte:
    case at::kInt:
    case at::kLong: return true;
    default: return false;
  }
}

// Contiguous `t` as a copying collective carries it: itself, or a view of its bytes (1-D at
// least: a scalar becomes one element). A view: what the collective writes lands in `t`.
at::Tensor wire_form(const at::Tensor& t) {
  if (carried_as_is(t.scalar_type())) return t;
  return (t.dim() == 0 ? t.reshape({1}) : t).view(at::kByte);
}

// What wire_form(a tensor of `dtype` and `shape`) carried, as that tensor again (a view).
at::Tensor from_wire_form(const at::Tensor& w, c10::ScalarType dtype, at::IntArrayRef shape) {
  return w.scalar_type() == dtype ? w.view(shape) : w.view(dtype).view(shape);
}

void check_operand(const at::Tensor& t, const char* op, const char* where = "") {
  detail::check_collective_operand(t, kTag, op, where);
}

void check_reduction(c10::ScalarType dtype, Reduce op, const char* name) {
  detail::check_reduction(dtype, op, kTag, name);
}

// TORCH_DISTRIBUTED_DEBUG=DETAIL, PyTorch's switch for its ProcessGroupWrapper: before each
// collective the ranks compare what they are about to call (one small all-gather). Ranks that
// call different collectives, or one with tensors of other shapes or dtypes, then all get the
// same ValueError naming each rank's call, where Gloo would abort a process (a receive larger
// than its buffer fails an assertion on Gloo's own thread), mix up the data or hang.
bool checks_calls() {
  static const bool on = [] {
    const std::string level =
        detail::ascii_upper(env_value("TORCH_DISTRIBUTED_DEBUG").value_or("OFF"));
    VOLT_CHECK(level == "OFF" || level == "INFO" || level == "DETAIL", ConfigError, kTag,
               " TORCH_DISTRIBUTED_DEBUG=", env_value("TORCH_DISTRIBUTED_DEBUG").value_or(""),
               " is not a level; use OFF, INFO or DETAIL (as PyTorch).");
    return level == "DETAIL";
  }();
  return on;
}

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Store keys, under the attempt's prefix (attempt_prefix): a store serves one job, and a restarted
// attempt of it finds none of the failed attempt's keys.
const std::string kClaimKey = "volt/claim/";      // + rank: counts processes claiming a rank
const std::string kConfigKey = "volt/config/";    // + rank: the rank's configuration line
const std::string kJoinedKey = "volt/joined";     // counts ranks that wrote their config
const std::string kReadyKey = "volt/ready";       // "ok", or "abort:<message>"
const std::string kReadKey = "volt/read";         // counts ranks that read every config
const std::string kAllReadKey = "volt/all_read";  // set by the last reader
const std::string kLostCountKey = "volt/lost_count";
const std::string kLostKey = "volt/lost";  // the first lost rank's description
// How long a failed collective waits for some process to report which rank was lost.
constexpr milliseconds kLostReportGrace{2000};
// How long report_lost_rank tries to reach the store.
constexpr milliseconds kReportBound{5000};

// The prefix of every key of attempt `restart_count`: torch's own ("/worker/attempt_<k>", what its
// workers use in torchrun's agent store), so that volt's keys sit where torchrun expects them.
std::string attempt_prefix(int64_t restart_count) {
  return "/worker/attempt_" + std::to_string(restart_count);
}

std::vector<uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}
std::string text(const std::vector<uint8_t>& b) {
  return {b.begin(), b.end()};
}

std::string seconds(milliseconds t) {
  auto os = detail::c_stream<std::ostringstream>();
  os << static_cast<double>(t.count()) / 1000.0 << " s";
  return os.str();
}

// The first line of an exception's message, without c10's backtrace.
std::string reason_of(const std::exception& e) {
  std::string s;
  if (auto* c = dynamic_cast<const c10::Error*>(&e)) {
    s = c->what_without_backtrace();
  } else {
    s = e.what();
  }
  auto nl = s.find('\n');
  if (nl != std::string::npos) s.resize(nl);
  while (!s.empty() && (s.back() == ' ' || s.back() == '.')) s.pop_back();
  return s;
}

bool contains(const std::string& s, const char* what) {
  return s.find(what) != std::string::npos;
}

std::string rank_list(const std::vector<int64_t>& ranks) {
  auto os = detail::c_stream<std::ostringstream>();
  os << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i == 8) {
      os << " and " << ranks.size() - 8 << " more";
      break;
    }
    os << (i ? ", " : "") << ranks[i];
  }
  return os.str();
}

// Polls `keys` until one exists (its index) or `deadline` passes (-1). TCPStore::wait with a
// timeout leaves its reply pending on the socket when it times out (1.13), so later requests on
// that client would read the wrong answer; check() is a plain request/reply.
int poll_keys(c10d::Store& store, const std::vector<std::string>& keys,
              Clock::time_point deadline) {
  milliseconds pause{1};
  for (;;) {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (store.check({keys[i]})) return static_cast<int>(i);
    }
    if (Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(
        std::min(pause, std::chrono::duration_cast<milliseconds>(deadline - Clock::now())));
    pause = std::min(pause * 2, milliseconds(50));
  }
}

bool poll_key(c10d::Store& store, const std::string& key, Clock::time_point deadline) {
  return poll_keys(store, {key}, deadline) == 0;
}

c10d::ReduceOp to_c10d(Reduce op) {
  switch (op) {
    case Reduce::kMin: return c10d::ReduceOp::MIN;
    case Reduce::kMax: return c10d::ReduceOp::MAX;
    case Reduce::kSum:
    case Reduce::kMean: return c10d::ReduceOp::SUM;  // Gloo has no AVG: volt divides afterwards
  }
  return c10d::ReduceOp::SUM;
}

// Opens the store (rank 0 hosts it) before `deadline`. c10d 1.13's client gives up early: it
// counts its connect timeout in whole seconds (800 ms is 0 s) and its retry back-off can exceed
// what is left, so volt retries until the deadline with attempts of at least one second. The
// store then gets the full `timeout` for its operations (Gloo's key exchange uses it).
c10::intrusive_ptr<c10d::TCPStore> open_store(const ClusterEnvironment& env, milliseconds timeout,
                                              Clock::time_point deadline, bool server) {
  while (true) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(env.main_port);
    so.isServer = server;
    so.waitWorkers = false;  // volt's own join below names the missing ranks
    so.timeout = std::max(
        std::chrono::duration_cast<milliseconds>(std::chrono::ceil<std::chrono::seconds>(left)),
        milliseconds(1000));
    try {
      auto store = c10::make_intrusive<c10d::TCPStore>(env.main_address, so);
      store->setTimeout(timeout);
      return store;
    } catch (const std::exception&) {
      if (server || Clock::now() + milliseconds(100) >= deadline) throw;
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
}

#if VOLT_DIST_GLOO
std::shared_ptr<gloo::transport::Device> gloo_device(const ClusterEnvironment& env,
                                                     const std::string& option_interface,
                                                     std::string& where) {
  std::string iface = option_interface;
  if (iface.empty()) {
    iface = env_value("GLOO_SOCKET_IFNAME").value_or("");
  }
  if (!iface.empty()) {
    where = "interface " + iface;
    try {
      return c10d::ProcessGroupGloo::createDeviceForInterface(iface);
    } catch (const std::exception& e) {
      VOLT_CHECK(false, ConfigError, kTag, " cannot bind Gloo to network interface \"", iface,
                 "\" (", reason_of(e),
                 "); set GLOO_SOCKET_IFNAME or the interface option to an "
                 "interface this machine has (see `ip addr`).");
    }
  }
  std::string host = "127.0.0.1";
  if (env.num_nodes > 1) {
    // Other nodes must reach this address: the one this machine uses towards MASTER_ADDR. On
    // node 0 without MASTER_ADDR that is loopback; torch's default then resolves the hostname.
    host = detail::local_address_towards(env.main_address);
    if (host.rfind("127.", 0) == 0 || host == "::1") {
      where = "this machine's hostname";
      return c10d::ProcessGroupGloo::createDefaultDevice();
    }
  }
  where = host;
  return c10d::ProcessGroupGloo::createDeviceForHostname(host);
}

// Connects a Gloo group of `size` ranks, this one being `rank`, on impl.device through impl.store
// under the key prefix `prefix`, and keeps it in impl. Throws what c10d throws: the callers say
// which group failed.
void attach_gloo(ProcessGroup::Impl& impl, const std::string& prefix, int rank, int size,
                 milliseconds timeout) {
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  opts->devices.push_back(impl.device);
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, impl.store);
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
#if VOLT_TORCH_AT_LEAST(2, 0)
  // [S] read from 2.x sources, not compiled: the 2.11 wheel has no gloo headers.
  impl.backend = gloo;
  impl.group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  impl.group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  impl.group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
#else
  impl.group = gloo;
#endif
}
#endif  // VOLT_DIST_GLOO

#if VOLT_DIST_NCCL
// This rank's CUDA device: the current one, which the strategy set to the rank's own
// (DdpStrategy::setup_environment) before it built the group.
c10::Device nccl_device() {
  return c10::Device(c10::kCUDA, c10::cuda::current_device());
}

// Makes a NCCL group of `size` ranks, this one being `rank`, under the key prefix `prefix` of
// impl.store, and keeps it in impl. NCCL connects lazily, at the group's first collective (and
// then through the store, bounded by `timeout`).
void attach_nccl(ProcessGroup::Impl& impl, const std::string& prefix, int rank, int size,
                 milliseconds timeout) {
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, impl.store);
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
  impl.backend = nccl;
  impl.group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  impl.group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
  impl.group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
  impl.wire_device = nccl_device();
}
#endif  // VOLT_DIST_NCCL

// Connects the group of `size` ranks (this one `rank`) with `backend`, under key prefix
// `prefix`. Throws what c10d throws: the callers say which group failed.
void attach(ProcessGroup::Impl& impl, Backend backend, const std::string& prefix, int rank,
            int size, milliseconds timeout) {
#if VOLT_DIST_NCCL
  if (backend == Backend::kNccl) return attach_nccl(impl, prefix, rank, size, timeout);
#endif
#if VOLT_DIST_GLOO
  if (backend == Backend::kGloo) return attach_gloo(impl, prefix, rank, size, timeout);
#endif
  VOLT_ASSERT(false, "resolve_backend accepted a backend this build cannot create");
}

}  // namespace

ProcessGroup::ProcessGroup(const ClusterEnvironment& env, ProcessGroupOptions options)
    : rank_(env.global_rank), world_size_(env.world_size), options_(std::move(options)) {
  ignore_sigpipe();
  const bool nccl = options_.backend() == Backend::kNccl;
  resolve_backend(to_string(options_.backend()), nccl ? c10::kCUDA : c10::kCPU);
  VOLT_CHECK(!nccl || torch::cuda::is_available(), NotAvailable, kTag,
             " backend \"nccl\" needs a CUDA device and this process sees none; use \"gloo\" "
             "(or check CUDA_VISIBLE_DEVICES).");
  const milliseconds timeout = options_.timeout();
  VOLT_CHECK(timeout.count() > 0, ConfigError, kTag, " timeout=", timeout.count(),
             " ms must be positive.");
  checks_calls();  // a bad TORCH_DISTRIBUTED_DEBUG fails here, before the rendezvous
  VOLT_CHECK(env.world_size >= 1 && env.global_rank >= 0 && env.global_rank < env.world_size,
             ConfigError, kTag, " global rank ", env.global_rank, " is outside world size ",
             env.world_size, ".");
  VOLT_CHECK(env.main_port > 0 && env.main_port < 65536, ConfigError, kTag,
             " MASTER_PORT=", env.main_port,
             " is not a port; choose one (LocalLauncher picks a free one).");
  impl_ = std::make_unique<Impl>();
  impl_->address = env.main_address + ":" + std::to_string(env.main_port);
  impl_->agent_store = env.agent_store;
  const auto deadline = Clock::now() + timeout;

  // 1. The store: rank 0 hosts it (torchrun's agent does when it says so), every rank is a client.
  // A store rank 0 kept from an earlier attempt serves again (elastic restarts); this group then
  // talks to it through a connection of its own, as the other ranks do.
  const bool host = rank_ == 0 && !env.agent_store;
  const auto& kept = options_.store();
  const bool reuse = host && kept && kept->server && kept->tcp &&
                     kept->address == env.main_address && kept->port == env.main_port;
  c10::intrusive_ptr<c10d::TCPStore> client;
  try {
    if (reuse) {
      impl_->rendezvous = kept;
      client = open_store(env, timeout, deadline, /*server=*/false);
    } else {
      impl_->rendezvous = std::make_shared<RendezvousStore>();
      impl_->rendezvous->address = env.main_address;
      impl_->rendezvous->port = env.main_port;
      impl_->rendezvous->server = host;
      client = impl_->rendezvous->tcp = open_store(env, timeout, deadline, host);
    }
    // The store listens on the port now; find_free_port's hold on it, if this process picked
    // it, has done its job.
    if (host) detail::release_port(env.main_port);
  } catch (const std::exception& e) {
    if (host) detail::release_port(env.main_port);
    const std::string why = reason_of(e);
    if (host && !reuse) {
      VOLT_CHECK(!contains(why, "Address already in use") && !contains(why, "errno: 98"),
                 ConfigError, kTag, " MASTER_PORT=", env.main_port,
                 " is already in use on this machine (rank 0 hosts the rendezvous store there); "
                 "choose a free port, or unset MASTER_PORT on one node to let volt pick one.");
      VOLT_CHECK(false, DistributedError, kTag, " rank 0 could not start the rendezvous store on ",
                 impl_->address, " (", why, "); check MASTER_ADDR and MASTER_PORT.");
    }
    VOLT_CHECK(false, DistributedError, kTag, " rank ", rank_,
               " could not reach the rendezvous store at MASTER_ADDR=", env.main_address,
               " MASTER_PORT=", env.main_port, " within ", seconds(timeout), " (", why,
               "); check that ", env.agent_store ? "torchrun's agent" : "rank 0",
               " is running and that MASTER_ADDR/MASTER_PORT name its machine and port.");
  }
  impl_->prefix = attempt_prefix(env.restart_count);
  impl_->store = c10::make_intrusive<c10d::PrefixStore>(impl_->prefix, client);
  c10d::Store& store = *impl_->store;

  // 2. Join: claim the rank, publish the configuration, wait for everyone.
  auto cfg = detail::c_stream<std::ostringstream>();
  // The call checks too: with TORCH_DISTRIBUTED_DEBUG=DETAIL on some ranks only, their extra
  // all-gather before each collective met another rank's collective (a Gloo size abort).
  cfg << "world_size=" << world_size_ << " backend=" << to_string(options_.backend())
      << " config_hash=" << (options_.config_hash().empty() ? "''" : options_.config_hash())
      << " call_checks=" << (checks_calls() ? "on (TORCH_DISTRIBUTED_DEBUG=DETAIL)" : "off");
  const std::string me = std::to_string(rank_);
  try {
    if (store.add(kClaimKey + me, 1) > 1) {
      std::string msg =
          detail::str_cat(kTag, " two processes claim global rank ", rank_,
                          "; give every process its own rank (check LOCAL_RANK, NODE_RANK, RANK).");
      store.set(kReadyKey, bytes("abort:" + msg));  // wakes the others at once
      throw ConfigError(msg);
    }
    store.set(kConfigKey + me, bytes(cfg.str()));
    if (store.add(kJoinedKey, 1) == world_size_) store.set(kReadyKey, bytes("ok"));
    // Until everyone joined, or a launching process reported a worker that died (before it
    // could join: its exit status is the reason, and waiting out the timeout told nothing more).
    const int seen = poll_keys(store, {kReadyKey, kLostKey}, deadline);
    if (seen != 0) {
      const bool lost = seen == 1;
      std::vector<int64_t> missing;
      for (int64_t r = 0; r < world_size_; ++r) {
        if (!store.check({kConfigKey + std::to_string(r)})) missing.push_back(r);
      }
      const std::string why =
          lost ? "; lost: " + text(store.get(kLostKey))
               : "; start every rank with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE.";
      VOLT_CHECK(false, DistributedError, kTag, " ", rank_list(missing), " of ", world_size_,
                 " did not join the rendezvous at ", impl_->address,
                 lost ? std::string() : " within " + seconds(timeout), why);
    }
    const std::string ready = text(store.get(kReadyKey));
    VOLT_CHECK(ready.rfind("abort:", 0) != 0, ConfigError, ready.substr(6));
    // A second claimant may have come after "ok" was set: look at every claim once more (it is
    // caught here unless it arrives after this check, and then it fails alone).
    for (int64_t r = 0; r < world_size_; ++r) {
      VOLT_CHECK(store.add(kClaimKey + std::to_string(r), 0) <= 1, ConfigError, kTag,
                 " two processes claim global rank ", r,
                 "; give every process its own rank (check LOCAL_RANK, NODE_RANK, RANK).");
    }
    // 3. Every rank compares every rank's configuration, so all of them fail alike.
    std::map<std::string, std::vector<int64_t> > groups;
    std::vector<int64_t> missing;
    for (int64_t r = 0; r < world_size_; ++r) {
      const std::string key = kConfigKey + std::to_string(r);
      if (!store.check({key})) {
        missing.push_back(r);
      } else {
        groups[text(store.get(key))].push_back(r);
      }
    }
    if (store.add(kReadKey, 1) == world_size_) store.set(kAllReadKey, bytes("1"));
    if (host) {
      // The store lives in this process: keep it up until everyone has read what they need to
      // fail with the same message (bounded by the deadline).
      poll_key(store, kAllReadKey, deadline);
    }
    VOLT_CHECK(missing.empty(), DistributedError, kTag, " ", rank_list(missing),
               " did not join although ", world_size_,
               " processes did (some process has another WORLD_SIZE or rank); start every rank "
               "with the same WORLD_SIZE.");
    if (groups.size() > 1) {
      auto os = detail::c_stream<std::ostringstream>();
      os << kTag << " ranks' configurations differ:";
      const char* sep = " ";
      for (const auto& g : groups) {
        os << sep << rank_list(g.second) << ": " << g.first;
        sep = "; ";
      }
      os << "; start every rank with the same options.";
      throw ConfigError(os.str());
    }
  } catch (const volt::Error&) {
    throw;
  } catch (const std::exception& e) {
    VOLT_CHECK(false, DistributedError, kTag, " rendezvous failed on rank ", rank_, " at ",
               impl_->address, ": ", reason_of(e), "; rank 0 (the store's host) probably exited.");
  }

#if VOLT_DIST_NCCL
  // 4. NCCL: the group is made now and connects at its first collective.
  if (nccl) {
    try {
      attach(*impl_, Backend::kNccl, "volt/nccl", static_cast<int>(rank_),
             static_cast<int>(world_size_), timeout);
    } catch (const std::exception& e) {
      VOLT_CHECK(false, DistributedError, kTag, " rank ", rank_,
                 " could not create its NCCL group (", reason_of(e),
                 "); check that this rank has a CUDA device of its own.");
    }
    return;
  }
#endif
#if VOLT_DIST_GLOO
  // 4. Gloo connects every pair of ranks through the store.
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = gloo_device(env, options_.interface(), impl_->gloo_address);
  } catch (const volt::Error&) {
    throw;
  } catch (const std::exception& e) {
    VOLT_CHECK(false, DistributedError, kTag, " cannot create a Gloo device on ",
               impl_->gloo_address, " (", reason_of(e), "); set GLOO_SOCKET_IFNAME.");
  }
  impl_->device = device;
  try {
    attach(*impl_, Backend::kGloo, "volt/gloo", static_cast<int>(rank_),
           static_cast<int>(world_size_), timeout);
  } catch (const std::exception& e) {
    VOLT_CHECK(false, DistributedError, kTag, " rank ", rank_, " could not connect Gloo to its ",
               world_size_ - 1, " peers within ", seconds(timeout), " (listening on ",
               impl_->gloo_address, ": ", reason_of(e),
               "); check that the nodes can reach each other on that address or set "
               "GLOO_SOCKET_IFNAME.");
  }
#endif
}

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl, int64_t rank, int64_t world_size,
                           ProcessGroupOptions options)
    : rank_(rank), world_size_(world_size), options_(std::move(options)), impl_(std::move(impl)) {}

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(const std::vector<int64_t>& ranks,
                                                      const std::string& tag) {
  VOLT_CHECK(!ranks.empty(), ValueError, kTag, " new_group needs at least one rank.");
  int64_t me = -1;
  const bool nccl = options_.backend() == Backend::kNccl;
  std::string key =
      (impl_->key.empty() ? std::string(nccl ? "volt/nccl" : "volt/gloo") : impl_->key) +
      "/group/" + tag;
  for (size_t i = 0; i < ranks.size(); ++i) {
    VOLT_CHECK(ranks[i] >= 0 && ranks[i] < world_size_ && (i == 0 || ranks[i] > ranks[i - 1]),
               ValueError, kTag, " new_group ranks must be ascending and in [0, ", world_size_,
               "); got rank ", ranks[i], " at position ", i, ".");
    if (ranks[i] == rank_) me = static_cast<int64_t>(i);
    key += "/" + std::to_string(ranks[i]);
  }
  VOLT_CHECK(me >= 0, ValueError, kTag, " rank ", rank_,
             " called new_group for ranks it is not among; only members call it.");
  auto impl = std::make_unique<Impl>();
  impl->rendezvous = impl_->rendezvous;
  impl->store = impl_->store;
#if VOLT_DIST_GLOO
  impl->device = impl_->device;
#endif
  impl->address = impl_->address;
  impl->agent_store = impl_->agent_store;
  impl->gloo_address = impl_->gloo_address;
  impl->prefix = impl_->prefix;
  impl->key = key;
  const int size = static_cast<int>(ranks.size());
  try {
    attach(*impl, options_.backend(), key, static_cast<int>(me), size, options_.timeout());
  } catch (const std::exception& e) {
    VOLT_CHECK(false, DistributedError, kTag, " rank ", rank_, " could not connect its group of ",
               size, " ranks (", key, ") within ", seconds(options_.timeout()), ": ", reason_of(e),
               "; every member must call new_group with the same ranks and tag.");
  }
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(impl), me, size, options_));
}

ProcessGroup::~ProcessGroup() {
  if (!impl_) return;
  // The group first (Gloo's destructor lets queued work finish, each bounded by the Gloo
  // timeout, and joins its threads; NCCL is shut down), then the store (rank 0 stops serving).
  try {
#if VOLT_DIST_NCCL
    // NCCL's normal exit (its communicators and watchdog); without it 2.x warns at exit.
    if (options_.backend() == Backend::kNccl && impl_->backend && impl_->broken.empty()) {
      impl_->backend->shutdown();
    }
#endif
    impl_->group.reset();
#if VOLT_TORCH_AT_LEAST(2, 0)
    impl_->backend.reset();
#endif
    impl_->store.reset();
    impl_->rendezvous.reset();  // rank 0 stops serving, unless someone kept the store
  } catch (...) {
  }
}

std::shared_ptr<RendezvousStore> ProcessGroup::rendezvous_store() const {
  return impl_ ? impl_->rendezvous : nullptr;
}

namespace {

// Why the group failed, with the lost rank when some process reported it.
std::string lost_rank_note(ProcessGroup::Impl& impl, int64_t rank, milliseconds timeout) {
  try {
    if (!poll_key(*impl.store, kLostKey, Clock::now() + std::min(timeout, kLostReportGrace))) {
      return "";
    }
    return "; lost: " + text(impl.store->get(kLostKey));
  } catch (const std::exception&) {
    if (impl.agent_store) {
      return "; torchrun's store (" + impl.address +
             ") is unreachable too, so its agent (or that node) was probably lost";
    }
    return rank == 0 ? ""
                     : "; the rendezvous store on rank 0 (" + impl.address +
                           ") is unreachable too, so rank 0 was probably lost";
  }
}

}  // namespace

namespace detail {

// Builds and records the error of a failed collective.
void throw_collective_error(ProcessGroup& pg, const char* op, const std::exception& e) {
  auto& impl = pg.impl();
  const milliseconds timeout = pg.options().timeout();
  const std::string why = reason_of(e);
  const bool timed_out = contains(why, "timed out") || contains(why, "Timed out") ||
                         contains(why, "Timeout") || contains(why, "timeout");
  const std::string lost = lost_rank_note(impl, pg.rank(), timeout);
  std::string msg =
      timed_out
          ? detail::str_cat(kTag, " ", op, " timed out after ", seconds(timeout), " on rank ",
                            pg.rank(), " of ", pg.world_size(), " (", why, ")", lost,
                            "; a peer hung or died, or the ranks called collectives in different "
                            "orders.")
          : detail::str_cat(kTag, " ", op, " failed on rank ", pg.rank(), " of ", pg.world_size(),
                            " (", why, ")", lost,
                            "; a peer process died or the network failed "
                            "(see the other ranks' output).");
  impl.broken = msg;
  throw DistributedError(msg);
}

}  // namespace detail

namespace {

// Refuses a collective the group cannot run now (alike on every rank: the same code).
void check_runnable(ProcessGroup& pg, const char* op) {
  VOLT_CHECK(!detail::tracing(), ValueError, kTag, " ", op,
             " while libtorch's tracer records (a TracedFunction, trace_training_step): a trace "
             "holds libtorch ops, and a replay would skip the collective; run it outside the "
             "traced function.");
  VOLT_CHECK(pg.impl().broken.empty(), DistributedError, kTag, " ", op, " on rank ", pg.rank(),
             ": the group is unusable after an earlier failure (", pg.impl().broken,
             "); restart the run.");
}

// Runs one collective: starts it, waits at most the timeout, turns any failure into a
// DistributedError and marks the group broken.
template <class Start>
void run_collective(ProcessGroup& pg, const char* op, Start&& start) {
  check_runnable(pg, op);
  try {
    auto work = start();
    work->wait(pg.options().timeout());
  } catch (const std::exception& e) {
    detail::throw_collective_error(pg, op, e);
  }
}

// c10d's Gloo runs each collective on a thread of its own, where c10::InferenceMode (thread-local)
// is off, and a tensor made in inference mode (the Trainer's evaluation loops, a program's own
// inference) cannot be written there ("Inplace update to inference tensor outside
// InferenceMode"). So every buffer a collective writes is made with inference mode off (a normal
// tensor, also where the caller is in inference mode); a caller's inference tensor is written
// only by the collective itself (its memory, no tensor op) or through detach(), whose alias
// libtorch lets an in-place copy write.
struct NormalTensors {
  c10::InferenceMode off{false};  // turns grad mode on too ...
  at::NoGradGuard no_grad;        // ... which this turns off again
};

// `t` where the group's collectives run: NCCL's CUDA device (a host tensor is copied there);
// Gloo takes tensors where they are.
at::Tensor to_wire(const ProcessGroup::Impl& impl, const at::Tensor& t) {
  if (!impl.wire_device.is_cuda() || t.device() == impl.wire_device) return t;
  return t.to(impl.wire_device);
}

// Starts reduce-scatter's all-to-all: row block j of `rows` goes to rank j, and row block r of
// `received` (the same shape) comes from rank r. Both blocking and started reduce-scatters.
auto alltoall_rows(ProcessGroup& pg, at::Tensor& rows, at::Tensor& received) {
  std::vector<int64_t> equal_split;
  c10d::AllToAllOptions o;
  o.timeout = pg.options().timeout();
  return pg.impl().group->alltoall_base(received, rows, equal_split, equal_split, o);
}

}  // namespace

namespace {

constexpr int64_t kCallDims = 8;  // a call's first tensor's sizes kept in its record

// What a rank is about to call: [op, argument, tensors, dtype, elements, dims, sizes (8),
// a digest of every tensor's dtype and sizes].
at::Tensor call_record(int64_t op, int64_t arg, const std::vector<at::Tensor>& tensors) {
  at::Tensor record = at::full({6 + kCallDims + 1}, -1, at::kLong);
  auto r = record.accessor<int64_t, 1>();
  r[0] = op;
  r[1] = arg;
  r[2] = static_cast<int64_t>(tensors.size());
  int64_t elements = 0;
  uint64_t digest = 1469598103934665603ull;  // FNV-1a over (dtype, dims, sizes...)
  const auto mix = [&digest](int64_t v) {
    digest = (digest ^ static_cast<uint64_t>(v)) * 1099511628211ull;
  };
  for (const at::Tensor& t : tensors) {
    elements += t.numel();
    mix(static_cast<int64_t>(t.scalar_type()));
    mix(t.dim());
    for (int64_t d : t.sizes()) mix(d);
  }
  r[4] = elements;
  if (!tensors.empty()) {
    const at::Tensor& first = tensors.front();
    r[3] = static_cast<int64_t>(first.scalar_type());
    r[5] = first.dim();
    for (int64_t d = 0; d < std::min(first.dim(), kCallDims); ++d) r[6 + d] = first.size(d);
  }
  r[6 + kCallDims] = static_cast<int64_t>(digest >> 1);  // non-negative
  return record;
}

std::string describe_call(const at::Tensor& record) {
  static const char* const kOps[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter",
                                     "barrier"};
  const auto r = record.accessor<int64_t, 1>();
  auto os = detail::c_stream<std::ostringstream>();
  os << (r[0] >= 0 && r[0] < 5 ? kOps[r[0]] : "?");
  static const char* const kReduces[] = {"mean", "sum", "max", "min"};  // Reduce's order
  if ((r[0] == 0 || r[0] == 3) && r[1] >= 0 && r[1] < 4) os << " (" << kReduces[r[1]] << ")";
  if (r[0] == 1) os << " from rank " << r[1];
  if (r[0] == 4) return os.str();
  os << " of " << r[2] << (r[2] == 1 ? " tensor" : " tensors");
  if (r[2] > 0) {
    os << ", the first [";
    for (int64_t d = 0; d < std::min(r[5], kCallDims); ++d) os << (d ? ", " : "") << r[6 + d];
    if (r[5] > kCallDims) os << ", ...";
    os << "] " << static_cast<c10::ScalarType>(r[3]) << ", " << r[4]
       << (r[4] == 1 ? " element" : " elements") << " in all";
  }
  return os.str();
}

enum CallOp : int64_t {
  kCallAllReduce,
  kCallBroadcast,
  kCallAllGather,
  kCallReduceScatter,
  kCallBarrier
};

// With checks_calls(): every rank's record of the call it is about to make, compared; a
// ValueError on every rank (they all see the same records) when they differ. True when the
// records were compared (and were the same).
bool check_same_call(ProcessGroup& pg, CallOp op, int64_t arg,
                     const std::vector<at::Tensor>& tensors) {
  if (!checks_calls() || pg.world_size() == 1) return false;
  const NormalTensors normal_tensors;
  const at::Tensor mine = call_record(op, arg, tensors);
  std::vector<at::Tensor> in{to_wire(pg.impl(), mine)};
  std::vector<std::vector<at::Tensor> > out(1);
  for (int64_t q = 0; q < pg.world_size(); ++q) out[0].push_back(at::empty_like(in[0]));
  run_collective(pg, "collective check (TORCH_DISTRIBUTED_DEBUG=DETAIL)",
                 [&] { return pg.impl().group->allgather(out, in); });
  bool same = true;
  for (auto& t : out[0]) {
    t = t.cpu();
    same = same && t.equal(out[0][0].cpu());
  }
  if (same) return true;
  auto os = detail::c_stream<std::ostringstream>();
  for (int64_t q = 0; q < pg.world_size(); ++q) {
    os << (q ? "; " : "") << "rank " << q << ": " << describe_call(out[0][q]);
  }
  VOLT_CHECK(false, ValueError, kTag,
             " the ranks' collective calls differ (TORCH_DISTRIBUTED_DEBUG=DETAIL): ", os.str(),
             "; every rank must call the same collectives in the same order, with tensors of the "
             "same shapes and dtypes.");
  return false;  // not reached
}

}  // namespace

at::Tensor ProcessGroup::all_reduce(const at::Tensor& value, Reduce op) {
  check_operand(value, "all_reduce");
  const c10::ScalarType dtype = value.scalar_type();
  check_reduction(dtype, op, "all_reduce");
  check_same_call(*this, kCallAllReduce, static_cast<int64_t>(op), {value});
  const NormalTensors normal_tensors;
  // Complex tensors are reduced as their real and imaginary parts. Then 16-bit floats in fp32,
  // rounded back (Gloo in libtorch 1.13 has no bf16, and its fp16 sum accumulates in fp16: the
  // fp32 sum is also the more accurate one); bool and int16, which Gloo lacks, in int32 (a sum
  // of bools is their "or", as in torch; int16 wraps as its own arithmetic would).
  const bool complex = at::isComplexType(dtype);
  at::Tensor v = to_wire(*impl_, value.detach());
  if (complex) v = at::view_as_real(v.resolve_conj());
  const c10::ScalarType part = v.scalar_type();
  const c10::ScalarType reduce_as = part == at::kBFloat16 || part == at::kHalf ? at::kFloat
                                    : part == at::kBool || part == at::kShort  ? at::kInt
                                                                               : part;
  std::vector<at::Tensor> t{
      v.to(reduce_as, /*non_blocking=*/false, /*copy=*/true, at::MemoryFormat::Contiguous)};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = options_.timeout();
  run_collective(*this, "all_reduce", [&] { return impl_->group->allreduce(t, o); });
  if (op == Reduce::kMean) t[0].div_(world_size_);
  at::Tensor out = reduce_as == part ? t[0] : t[0].to(part);
  if (complex) out = at::view_as_complex(out);
  return out.to(value.device());
}

void ProcessGroup::broadcast_(at::Tensor& tensor, int64_t src) {
  std::vector<at::Tensor> one{tensor};
  broadcast_(one, src);
}

void ProcessGroup::broadcast_(std::vector<at::Tensor>& tensors, int64_t src) {
  VOLT_CHECK(src >= 0 && src < world_size_, ValueError, kTag, " broadcast source rank ", src,
             " is outside world size ", world_size_, ".");
  const NormalTensors normal_tensors;  // grad mode off as well
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_operand(tensors[i], "broadcast_", detail::str_cat(" at index ", i).c_str());
  }
  check_same_call(*this, kCallBroadcast, src, tensors);
  // One flat buffer per dtype bucket: a collective per bucket instead of one per tensor.
  constexpr int64_t kBroadcastBucket = int64_t{1} << 20;
  for (const auto& bucket : detail::dtype_buckets(tensors, kBroadcastBucket)) {
    std::vector<at::Tensor> flat_parts;
    for (size_t k : bucket) flat_parts.push_back(to_wire(*impl_, tensors[k].detach().reshape(-1)));
    // A lone contiguous tensor where the collective runs is broadcast in place (its reshape
    // is a view of it; the collective writes its memory, no tensor op runs on it).
    const at::Tensor& lone = tensors[bucket[0]];
    const bool in_place =
        bucket.size() == 1 && lone.is_contiguous() && lone.device() == flat_parts[0].device();
    std::vector<at::Tensor> buf{in_place ? flat_parts[0] : at::cat(flat_parts)};
    const at::Tensor flat = buf[0];
    buf[0] = wire_form(flat);  // a view: in place stays in place
    c10d::BroadcastOptions o;
    o.rootRank = src;
    o.timeout = options_.timeout();
    run_collective(*this, "broadcast", [&] { return impl_->group->broadcast(buf, o); });
    int64_t offset = 0;
    for (size_t k : bucket) {
      at::Tensor t = tensors[k].detach();
      const int64_t n = t.numel();
      if (!in_place) t.copy_(flat.narrow(0, offset, n).view(t.sizes()));
      offset += n;
    }
  }
}

void ProcessGroup::all_reduce_(std::vector<at::Tensor>& tensors, Reduce op) {
  const NormalTensors normal_tensors;
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_operand(tensors[i], "all_reduce_", detail::str_cat(" at index ", i).c_str());
    check_reduction(tensors[i].scalar_type(), op, "all_reduce_");
  }
  // One all_reduce per dtype bucket, its flat result copied back into the tensors.
  constexpr int64_t kReduceBucket = int64_t{1} << 22;
  for (const auto& bucket : detail::dtype_buckets(tensors, kReduceBucket)) {
    std::vector<at::Tensor> flat_parts;
    for (size_t k : bucket) flat_parts.push_back(tensors[k].detach().reshape(-1));
    const at::Tensor reduced = all_reduce(at::cat(flat_parts), op);
    int64_t offset = 0;
    for (size_t k : bucket) {
      at::Tensor t = tensors[k].detach();
      const int64_t n = t.numel();
      t.copy_(reduced.narrow(0, offset, n).view(t.sizes()));
      offset += n;
    }
  }
}

std::vector<at::Tensor> ProcessGroup::all_gather(const at::Tensor& value) {
  // Shapes first: Gloo with mismatched sizes corrupts or hangs, a ValueError is clearer.
  constexpr int64_t kMaxDims = 8;
  check_operand(value, "all_gather");
  VOLT_CHECK(value.dim() <= kMaxDims, ValueError, kTag, " all_gather supports up to ", kMaxDims,
             " dimensions, got ", value.sizes(), ".");
  // A call check that passed compared every rank's dtype and sizes (all kMaxDims of them).
  static_assert(kMaxDims <= kCallDims, "the call record keeps all_gather's sizes");
  const bool checked = check_same_call(*this, kCallAllGather, 0, {value});
  const NormalTensors normal_tensors;
  if (!checked) {
    auto meta = at::full({kMaxDims + 2}, -1, at::kLong);
    auto m = meta.accessor<int64_t, 1>();
    m[0] = value.dim();
    m[1] = static_cast<int64_t>(value.scalar_type());
    for (int64_t d = 0; d < value.dim(); ++d) m[d + 2] = value.size(d);
    std::vector<at::Tensor> meta_in{to_wire(*impl_, meta)};
    std::vector<std::vector<at::Tensor> > meta_out(1);
    for (int64_t r = 0; r < world_size_; ++r) meta_out[0].push_back(at::empty_like(meta_in[0]));
    run_collective(*this, "all_gather", [&] { return impl_->group->allgather(meta_out, meta_in); });
    for (auto& t : meta_out[0]) t = t.cpu();
    for (int64_t r = 0; r < world_size_; ++r) {
      if (meta_out[0][r].equal(meta)) continue;
      auto os = detail::c_stream<std::ostringstream>();
      for (int64_t q = 0; q < world_size_; ++q) {
        auto mq = meta_out[0][q].accessor<int64_t, 1>();
        os << (q ? "; " : "") << "rank " << q << ": [";
        for (int64_t d = 0; d < mq[0]; ++d) os << (d ? ", " : "") << mq[d + 2];
        os << "] " << static_cast<c10::ScalarType>(mq[1]);
      }
      VOLT_CHECK(false, ValueError, kTag,
                 " all_gather needs the same shape and dtype on every rank (", os.str(),
                 "); pad to a common shape first.");
    }
  }
  std::vector<std::vector<at::Tensor> > out(1);
  const at::Tensor in =
      wire_form(to_wire(*impl_, value.detach().clone(at::MemoryFormat::Contiguous)));
  for (int64_t r = 0; r < world_size_; ++r) out[0].push_back(at::empty_like(in));
  std::vector<at::Tensor> ins{in};
  run_collective(*this, "all_gather", [&] { return impl_->group->allgather(out, ins); });
  for (auto& t : out[0]) {
    t = from_wire_form(t, value.scalar_type(), value.sizes()).to(value.device());
  }
  return out[0];
}

at::Tensor ProcessGroup::all_gather_flat(const at::Tensor& value) {
  VOLT_CHECK(value.dim() >= 1, ValueError, kTag, " all_gather_flat needs at least one dimension.");
  return at::cat(all_gather(value), 0);
}

at::Tensor ProcessGroup::reduce_scatter(const at::Tensor& value, Reduce op) {
  check_operand(value, "reduce_scatter");
  VOLT_CHECK(value.dim() >= 1 && value.size(0) % world_size_ == 0, ValueError, kTag,
             " reduce_scatter needs size(0) divisible by world_size=", world_size_, ", got ",
             value.sizes(), "; pad dim 0 to a multiple of ", world_size_, ".");
  check_reduction(value.scalar_type(), op, "reduce_scatter");
  check_same_call(*this, kCallReduceScatter, static_cast<int64_t>(op), {value});
  // Gloo has no reduce-scatter (1.13) or emulates it with an all-reduce (2.x): one all-to-all
  // hands row block j of every rank to rank j, which reduces them itself (detail::reduce_rows).
  // The all-to-all only copies, so each dtype travels as itself (one Gloo lacks as its bytes);
  // 16-bit floats are reduced in fp32, as all_reduce does, then rounded back.
  const c10::ScalarType dtype = value.scalar_type();
  const NormalTensors normal_tensors;
  at::Tensor in = to_wire(*impl_, value.detach().contiguous());
  in = in.reshape({world_size_, in.numel() / world_size_});
  const std::vector<int64_t> rows = in.sizes().vec();
  in = wire_form(in);
  at::Tensor received = at::empty_like(in);
  run_collective(*this, "reduce_scatter", [&] { return alltoall_rows(*this, in, received); });
  auto shape = value.sizes().vec();
  shape[0] /= world_size_;
  at::Tensor out = detail::reduce_rows(from_wire_form(received, dtype, rows),
                                       op == Reduce::kMean ? Reduce::kSum : op)
                       .view(shape);
  if (op == Reduce::kMean) out.div_(world_size_);
  return (out.scalar_type() == dtype ? out : out.to(dtype)).to(value.device());
}

// The blocking forms are the others waited for at once: the same checks, timeout and errors.
void ProcessGroup::send(const at::Tensor& tensor, int64_t dst) {
  isend(tensor, dst).wait();
}

void ProcessGroup::recv_(at::Tensor& tensor, int64_t src) {
  irecv_(tensor, src).wait();
}

struct ProcessGroup::Transfer::State {
  ProcessGroup* group = nullptr;
  const char* op = "";
  c10::intrusive_ptr<c10d::Work> work;
  std::vector<at::Tensor> buffers;  // what the transfer reads or writes, alive until it ends
  at::Tensor target;                // irecv_ through a buffer: the caller's tensor, ...
  at::Tensor wire;                  // ... written from this one after the wait
};

void ProcessGroup::Transfer::wait() {
  if (!state_) return;
  const std::unique_ptr<State> s = std::move(state_);  // done (or failed) either way
  try {
    s->work->wait(s->group->options().timeout());
  } catch (const std::exception& e) {
    detail::throw_collective_error(*s->group, s->op, e);
  }
  if (s->target.defined()) {
    const NormalTensors normal_tensors;
    s->target.copy_(s->wire);
  }
}

ProcessGroup::Transfer ProcessGroup::isend(const at::Tensor& tensor, int64_t dst) {
  VOLT_CHECK(dst >= 0 && dst < world_size_ && dst != rank_, ValueError, kTag, " send from rank ",
             rank_, " to rank ", dst, ": the destination must be another rank of the ", world_size_,
             ".");
  check_operand(tensor, "send");
  check_runnable(*this, "send");
  const NormalTensors normal_tensors;
  Transfer out;
  out.state_ = std::make_unique<Transfer::State>();
  Transfer::State& s = *out.state_;
  s.group = this;
  s.op = "send";
  const at::Tensor t = to_wire(*impl_, tensor.detach().contiguous());
  s.buffers = {wire_form(t)};
  try {
    s.work = impl_->group->send(s.buffers, static_cast<int>(dst), 0);
  } catch (const std::exception& e) {
    detail::throw_collective_error(*this, s.op, e);
  }
  return out;
}

ProcessGroup::Transfer ProcessGroup::irecv_(at::Tensor& tensor, int64_t src) {
  VOLT_CHECK(src >= 0 && src < world_size_ && src != rank_, ValueError, kTag, " recv on rank ",
             rank_, " from rank ", src, ": the source must be another rank of the ", world_size_,
             ".");
  check_operand(tensor, "recv_");
  check_runnable(*this, "recv");
  const NormalTensors normal_tensors;
  Transfer out;
  out.state_ = std::make_unique<Transfer::State>();
  Transfer::State& s = *out.state_;
  s.group = this;
  s.op = "recv";
  // A contiguous tensor where the transfer runs is written in place (by the transfer itself, no
  // tensor op: an inference tensor may be the target); anything else through a buffer, copied
  // into it by wait().
  const at::Tensor target = tensor.detach();
  const bool in_place = target.is_contiguous() && to_wire(*impl_, target).is_same(target);
  const at::Tensor wire =
      in_place ? target : to_wire(*impl_, at::empty_like(target, at::MemoryFormat::Contiguous));
  if (!in_place) {
    s.target = target;
    s.wire = wire;
  }
  s.buffers = {wire_form(wire)};
  try {
    s.work = impl_->group->recv(s.buffers, static_cast<int>(src), 0);
  } catch (const std::exception& e) {
    detail::throw_collective_error(*this, s.op, e);
  }
  return out;
}

void ProcessGroup::barrier() {
  c10d::BarrierOptions o;
  o.timeout = options_.timeout();
  // NCCL: this rank's own device. Without it, a barrier before any other collective guesses
  // the device from the global rank, which is wrong when ranks do not map to devices in order.
  if (impl_->wire_device.is_cuda()) o.device_ids = {impl_->wire_device.index()};
  check_same_call(*this, kCallBarrier, 0, {});
  run_collective(*this, "barrier", [&] { return impl_->group->barrier(o); });
}

bool ProcessGroup::all_of(bool local) {
  return all_reduce(at::full({1}, local ? 1 : 0, at::kInt), Reduce::kMin).item<int>() == 1;
}

bool ProcessGroup::any_of(bool local) {
  return all_reduce(at::full({1}, local ? 1 : 0, at::kInt), Reduce::kMax).item<int>() == 1;
}

namespace {

// A leader's heartbeat for run_on_leaders: adds 1 to `key` every beat_period(timeout) from a
// thread with a store connection of its own (the group's client belongs to the calling thread),
// until destroyed. A store it cannot reach ends the beats: the waiting ranks then time out.
// Half a second, or a quarter of a short timeout, so that several beats fall within it.
milliseconds beat_period(milliseconds timeout) {
  return std::clamp(timeout / 4, milliseconds(10), milliseconds(500));
}

class Heartbeat {
 public:
  Heartbeat(const RendezvousStore& rendezvous, const std::string& prefix, std::string key,
            milliseconds timeout)
      : thread_([this, address = rendezvous.address, port = rendezvous.port, prefix,
                 key = std::move(key), timeout] {
          try {
            c10d::TCPStoreOptions so;
            so.port = static_cast<std::uint16_t>(port);
            so.isServer = false;
            so.waitWorkers = false;
            so.timeout = std::min(timeout, kReportBound);
            auto store = c10::make_intrusive<c10d::PrefixStore>(
                prefix, c10::make_intrusive<c10d::TCPStore>(address, so));
            std::unique_lock<std::mutex> lock(mutex_);
            while (!stop_) {
              lock.unlock();
              store->add(key, 1);
              lock.lock();
              stopped_.wait_for(lock, beat_period(timeout), [this] { return stop_; });
            }
          } catch (...) {
          }
        }) {}
  ~Heartbeat() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    stopped_.notify_all();
    thread_.join();
  }
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable stopped_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace

void ProcessGroup::run_on_leaders(const std::string& name, const std::vector<int64_t>& leaders,
                                  const std::function<void()>& work) {
  ProcessGroup::Impl& impl = *impl_;
  VOLT_CHECK(impl.broken.empty(), DistributedError, kTag, " ", name, " on rank ", rank_,
             ": the group is unusable after an earlier failure (", impl.broken,
             "); restart the run.");
  for (size_t i = 0; i < leaders.size(); ++i) {
    VOLT_CHECK(
        leaders[i] >= 0 && leaders[i] < world_size_ && (i == 0 || leaders[i] > leaders[i - 1]),
        ValueError, kTag, " ", name, ": leaders must be ascending ranks in [0, ", world_size_,
        "), got rank ", leaders[i], " at position ", i, "; every rank passes the same list.");
  }
  VOLT_CHECK(!leaders.empty(), ValueError, kTag, " ", name,
             ": no leader to run it; name at least one rank (0 for the whole group).");
  c10d::Store& store = *impl.store;
  const milliseconds timeout = options_.timeout();
  // A subgroup's rounds are its own: its key tells them from the root's and its siblings'.
  const std::string base = (impl.key.empty() ? "" : impl.key + "/") + "volt/lead/" +
                           std::to_string(++impl.lead_rounds) + "/";
  const auto done_key = [&](int64_t r) { return base + "done/" + std::to_string(r); };
  const auto beat_key = [&](int64_t r) { return base + "beat/" + std::to_string(r); };
  const bool leading = std::find(leaders.begin(), leaders.end(), rank_) != leaders.end();
  const char* store_host =
      impl.agent_store ? "torchrun's agent (the store's host)" : "rank 0 (the store's host)";
  std::exception_ptr own_failure;
  if (leading) {
    std::string outcome = "ok";
    {
      Heartbeat beat(*impl.rendezvous, impl.prefix, beat_key(rank_), timeout);
      try {
        work();
      } catch (const std::exception& e) {
        own_failure = std::current_exception();
        outcome = "error:" + reason_of(e);
      } catch (...) {
        own_failure = std::current_exception();
        outcome = "error:an exception that is not a std::exception";
      }
    }
    try {
      store.set(done_key(rank_), bytes(outcome));
    } catch (const std::exception& e) {
      if (own_failure) std::rethrow_exception(own_failure);
      VOLT_CHECK(false, DistributedError, kTag, " ", name, " on rank ", rank_,
                 ": could not reach the store at ", impl.address, " (", reason_of(e), "); ",
                 store_host, " probably exited.");
    }
  }
  // Every rank waits for every leader (each leader for the others too), watching its beats.
  std::string failure;  // the first leader's error another leader's rank reports
  try {
    for (int64_t leader : leaders) {
      if (leader == rank_) continue;
      int64_t beats = -1;
      auto last_progress = Clock::now();
      milliseconds pause{1};
      while (!store.check({done_key(leader)})) {
        const int64_t now_beats = store.add(beat_key(leader), 0);
        if (now_beats != beats) {
          beats = now_beats;
          last_progress = Clock::now();
        }
        VOLT_CHECK(Clock::now() - last_progress < timeout, DistributedError, kTag, " rank ", leader,
                   " stopped answering while it ran ", name, " for the others (no heartbeat for ",
                   seconds(timeout), "); it died or its machine is unreachable: see its log.");
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, milliseconds(100));
      }
      const std::string outcome = text(store.get(done_key(leader)));
      if (failure.empty() && outcome.rfind("error:", 0) == 0) {
        failure = detail::str_cat(name, " failed on rank ", leader, ": ", outcome.substr(6));
      }
    }
  } catch (const volt::Error&) {
    throw;
  } catch (const std::exception& e) {
    VOLT_CHECK(false, DistributedError, kTag, " ", name, " on rank ", rank_, ": lost the store at ",
               impl.address, " (", reason_of(e), "); ", store_host, " probably exited.");
  }
  if (own_failure || !failure.empty()) {
    // Rank 0 usually hosts the store: it stays until every rank has read how the work ended
    // (bounded), so that each fails with the leader's message rather than a lost connection.
    try {
      store.add(base + "read", 1);
      if (rank_ == 0) {
        const auto deadline = Clock::now() + timeout;
        while (store.add(base + "read", 0) < world_size_ && Clock::now() < deadline) {
          std::this_thread::sleep_for(milliseconds(10));
        }
      }
    } catch (...) {
    }
    if (own_failure) std::rethrow_exception(own_failure);
    throw Error(detail::str_cat(kTag, " ", failure, "; the other ranks stop with it."));
  }
}

void report_lost_rank(const ClusterEnvironment& env, const std::string& description,
                      std::chrono::milliseconds timeout) noexcept {
  try {
    // A client of its own: the caller is usually a monitor thread, and the group's client may
    // be busy in another thread.
    // Bounded by a few seconds: the store either runs (connecting is immediate) or not yet.
    const milliseconds bound = std::min(timeout, kReportBound);
    // c10d's client logs an error line for every failed attempt to connect, ten a second: when
    // the store is not up yet, or gone (rank 0 ended the run before this worker died), wait
    // for its port quietly and connect through c10d once it accepts.
    const auto deadline = Clock::now() + bound;
    while (!detail::accepts_connections(env.main_address, env.main_port, milliseconds(200))) {
      if (Clock::now() + milliseconds(100) >= deadline) return;
      std::this_thread::sleep_for(milliseconds(100));
    }
    auto store = c10::make_intrusive<c10d::PrefixStore>(
        attempt_prefix(env.restart_count),
        open_store(env, bound, Clock::now() + bound, /*server=*/false));
    if (store->add(kLostCountKey, 1) == 1) store->set(kLostKey, bytes(description));
  } catch (...) {
  }
}

namespace detail {

struct PendingCollective::State {
  std::shared_ptr<ProcessGroup> group;  // kept alive: wait() reports through it
  const char* op = "";
  decltype(std::declval<c10d::ProcessGroup&>().barrier()) work;
  std::vector<std::vector<at::Tensor> > outputs;  // all_gather's, one per rank
  std::vector<at::Tensor> inputs;  // all_gather's value; reduce_scatter's rows and those received
  c10::ScalarType dtype = at::kFloat;         // the caller's tensor's, ...
  std::vector<int64_t> shape;                 // ... and its shape (reduce_scatter: its rows)
  c10::optional<Reduce> reduce_received;      // reduce_scatter: how to reduce the received rows
  c10::Device home = c10::Device(c10::kCPU);  // where the caller's tensor was (results go back)
};

namespace {

// The checks and error mapping of run_collective, for a collective that is only started here.
template <typename Start>
PendingCollective start_collective(const std::shared_ptr<ProcessGroup>& group,
                                   std::unique_ptr<PendingCollective::State> st, Start&& start) {
  VOLT_ASSERT(group != nullptr);
  auto& impl = group->impl();
  VOLT_CHECK(impl.broken.empty(), DistributedError, kTag, " ", st->op, " on rank ", group->rank(),
             ": the group is unusable after an earlier failure (", impl.broken,
             "); restart the run.");
  st->group = group;
  try {
    st->work = start(*st);
  } catch (const std::exception& e) {
    throw_collective_error(*group, st->op, e);
  }
  return PendingCollective::make(std::move(st));
}

}  // namespace

PendingCollective start_reduce_scatter(const std::shared_ptr<ProcessGroup>& group, at::Tensor rows,
                                       Reduce op) {
  VOLT_ASSERT(op != Reduce::kMean && rows.is_contiguous() && rows.dim() >= 1 &&
              rows.size(0) == group->world_size());
  check_same_call(*group, kCallReduceScatter, static_cast<int64_t>(op), {rows});
  const NormalTensors normal_tensors;
  auto st = std::make_unique<PendingCollective::State>();
  st->op = "reduce_scatter";
  st->reduce_received = op;
  st->home = rows.device();
  st->dtype = rows.scalar_type();
  st->shape = rows.sizes().vec();
  // Only copied on the wire (a dtype Gloo lacks as its bytes).
  st->inputs.push_back(wire_form(to_wire(group->impl(), rows)));
  st->inputs.push_back(at::empty_like(st->inputs[0]));
  return start_collective(group, std::move(st), [&](PendingCollective::State& s) {
    return alltoall_rows(*group, s.inputs[0], s.inputs[1]);
  });
}

PendingCollective start_all_gather(const std::shared_ptr<ProcessGroup>& group,
                                   const at::Tensor& value) {
  check_same_call(*group, kCallAllGather, 0, {value});
  const NormalTensors normal_tensors;
  auto st = std::make_unique<PendingCollective::State>();
  st->op = "all_gather";
  st->home = value.device();
  st->dtype = value.scalar_type();
  st->shape = value.sizes().vec();
  const at::Tensor in = wire_form(to_wire(group->impl(), value.detach().contiguous()));
  st->inputs.push_back(in);
  st->outputs.resize(1);
  for (int64_t r = 0; r < group->world_size(); ++r) st->outputs[0].push_back(at::empty_like(in));
  return start_collective(group, std::move(st), [&](PendingCollective::State& s) {
    c10d::AllgatherOptions o;
    o.timeout = group->options().timeout();
    return group->impl().group->allgather(s.outputs, s.inputs, o);
  });
}

std::vector<at::Tensor> PendingCollective::wait() {
  VOLT_CHECK(pending(), ValueError, kTag, " wait() on a collective that is not pending.");
  std::unique_ptr<State> st = std::move(state_);
  try {
    st->work->wait(st->group->options().timeout());
  } catch (const std::exception& e) {
    throw_collective_error(*st->group, st->op, e);
  }
  if (st->reduce_received) {
    const at::Tensor& received = st->inputs[1];
    return {reduce_rows(from_wire_form(received, st->dtype, st->shape), *st->reduce_received)
                .to(st->home)};
  }
  std::vector<at::Tensor> out = std::move(st->outputs[0]);
  for (auto& t : out) t = from_wire_form(t, st->dtype, st->shape).to(st->home);
  return out;
}

}  // namespace detail

#endif  // VOLT_DIST

namespace detail {
PendingCollective::PendingCollective() = default;
PendingCollective::PendingCollective(std::unique_ptr<State> state) : state_(std::move(state)) {}
PendingCollective PendingCollective::make(std::unique_ptr<State> state) {
  return PendingCollective(std::move(state));
}
PendingCollective::~PendingCollective() = default;
PendingCollective::PendingCollective(PendingCollective&&) noexcept = default;
PendingCollective& PendingCollective::operator=(PendingCollective&&) noexcept = default;
bool PendingCollective::pending() const {
  return state_ != nullptr;
}

at::Tensor reduce_rows(const at::Tensor& received, Reduce op) {
  VOLT_ASSERT(op != Reduce::kMean && received.dim() >= 1 && received.size(0) >= 1);
  // Rank 0's row first, then each next rank's: the same order on every run. 16-bit floats are
  // reduced in fp32, as when they were widened before an fp32 all-reduce (which added them in
  // an order of its own when there are more than two ranks).
  const c10::ScalarType t = received.scalar_type();
  at::Tensor acc = t == at::kBFloat16 || t == at::kHalf ? received.select(0, 0).to(at::kFloat)
                                                        : received.select(0, 0).clone();
  for (int64_t r = 1; r < received.size(0); ++r) {
    const at::Tensor row = received.select(0, r);
    switch (op) {
      case Reduce::kMin: at::minimum_out(acc, acc, row); break;
      case Reduce::kMax: at::maximum_out(acc, acc, row); break;
      default: acc.add_(row); break;
    }
  }
  return acc;
}
}  // namespace detail

std::ostream& operator<<(std::ostream& os, const ProcessGroupOptions& o) {
  return os << "ProcessGroupOptions(backend=" << to_string(o.backend())
            << ", timeout_ms=" << o.timeout().count()
            << ", config_hash=" << detail::quoted(o.config_hash())
            << ", interface=" << detail::quoted(o.interface())
            << ", store=" << (o.store() ? "kept" : "none") << ")";
}

ProcessGroup::Transfer::Transfer() = default;
ProcessGroup::Transfer::Transfer(Transfer&& other) noexcept = default;

ProcessGroup::Transfer& ProcessGroup::Transfer::operator=(Transfer&& other) noexcept = default;
// Gloo holds a transfer's buffer weakly: freeing it drops what was still pending.
ProcessGroup::Transfer::~Transfer() = default;

bool ProcessGroup::Transfer::pending() const {
  return state_ != nullptr;
}

}  // namespace volt
