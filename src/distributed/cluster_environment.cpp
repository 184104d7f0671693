#include "volt/distributed/cluster_environment.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "core/detail/env_table.h"
#include "volt/core/check.h"

namespace volt {
namespace {

constexpr const char* kTag = "[ClusterEnvironment]";
// torch's TCPStore default port; Open MPI gives no port, so every rank must agree on one.
constexpr int kDefaultMpiPort = 29500;
// Lightning's Slurm defaults: 15000 + the last four digits of the job id, else 12910.
constexpr int kSlurmPortBase = 15000;
constexpr int kSlurmFallbackPort = 12910;

// Parses a decimal integer in [lo, hi]; the whole string must be digits (a sign only for lo < 0).
std::optional<int64_t> parse_int(const std::string& s, int64_t lo, int64_t hi) {
  if (s.empty() || s.size() > 18) return std::nullopt;
  size_t i = 0;
  bool neg = false;
  if (s[0] == '-' && lo < 0) {
    neg = true;
    i = 1;
    if (s.size() == 1) return std::nullopt;
  }
  int64_t v = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return std::nullopt;
    v = v * 10 + (s[i] - '0');
  }
  if (neg) v = -v;
  if (v < lo || v > hi) return std::nullopt;
  return v;
}

// Reads the variables of one environment kind and formats every error the same way.
class Reader {
 public:
  Reader(const EnvLookup& env, std::string who) : env_(env), who_(std::move(who)) {}

  std::optional<std::string> str(const std::string& name) const {
    auto v = env_(name);
    if (v && v->empty()) return std::nullopt;  // VAR= counts as unset, as in torch
    return v;
  }
  bool has(const std::string& name) const { return str(name).has_value(); }

  std::string required_str(const std::string& name, const std::string& why) const {
    auto v = str(name);
    VOLT_CHECK(v, ConfigError, kTag, " ", who_, ": ", name, " is not set", why, "; set ", name,
               ".");
    return *v;
  }

  std::optional<int64_t> integer(const std::string& name, int64_t lo, int64_t hi) const {
    auto v = str(name);
    if (!v) return std::nullopt;
    auto n = parse_int(*v, lo, hi);
    VOLT_CHECK(n, ConfigError, kTag, " ", who_, ": ", name, "='", *v, "' is not an integer in [",
               lo, ", ", hi, "]; set ", name, " to a number in that range.");
    return n;
  }

  int64_t required_int(const std::string& name, int64_t lo, int64_t hi,
                       const std::string& why) const {
    auto n = integer(name, lo, hi);
    VOLT_CHECK(n, ConfigError, kTag, " ", who_, ": ", name, " is not set", why, "; set ", name,
               ".");
    return *n;
  }

  int port(const std::string& name) const {
    auto n = integer(name, 1, 65535);
    return n ? static_cast<int>(*n) : 0;
  }

  const std::string& who() const { return who_; }

 private:
  const EnvLookup& env_;
  std::string who_;
};

constexpr int64_t kMaxRanks = std::numeric_limits<int32_t>::max();

// The attempt volt's own restarts give a plain process or worker (restart_after_failure sets it).
int64_t volt_restart_count(const Reader& r) {
  return r.integer("VOLT_RESTART_COUNT", 0, kMaxRanks).value_or(0);
}

// Checks shared by every kind: world size, local size and the rank layout volt assumes.
void check_layout(const ClusterEnvironment& e, const Reader& r, const std::string& world_var,
                  const std::string& local_size_hint, int64_t devices, int64_t num_nodes) {
  VOLT_CHECK(e.world_size == devices * num_nodes, ConfigError, kTag, " ", r.who(), ": ", world_var,
             "=", e.world_size, " but devices × num_nodes = ", devices, " × ", num_nodes, " = ",
             devices * num_nodes, "; start ", devices * num_nodes,
             " processes or set devices and num_nodes to match.");
  VOLT_CHECK(e.local_rank < devices, ConfigError, kTag, " ", r.who(), ": local rank ", e.local_rank,
             " but devices=", devices, " per node", local_size_hint,
             "; start devices processes per node.");
  VOLT_CHECK(e.node_rank < num_nodes, ConfigError, kTag, " ", r.who(), ": node rank ", e.node_rank,
             " but num_nodes=", num_nodes, "; node ranks run from 0 to num_nodes-1.");
  VOLT_CHECK(e.global_rank == e.node_rank * devices + e.local_rank, ConfigError, kTag, " ", r.who(),
             ": global rank ", e.global_rank,
             " is not node_rank × devices + local_rank = ", e.node_rank, " × ", devices, " + ",
             e.local_rank, " = ", e.node_rank * devices + e.local_rank,
             "; volt needs ranks placed in blocks of devices per node (e.g. srun "
             "--distribution=block, mpirun --map-by slot, mpiexec -ppn ",
             devices, ").");
}

ClusterEnvironment detect_launched_child(const Reader& r, int64_t devices) {
  const std::string why = " (volt's launcher sets it; do not set VOLT_LAUNCHED_CHILD yourself)";
  ClusterEnvironment e;
  e.kind = ClusterKind::kPlain;
  e.launched_child = true;
  e.local_rank = r.required_int("LOCAL_RANK", 0, kMaxRanks, why);
  e.node_rank = r.required_int("NODE_RANK", 0, kMaxRanks, why);
  e.world_size = r.required_int("WORLD_SIZE", 1, kMaxRanks, why);
  e.main_address = r.required_str("MASTER_ADDR", why);
  e.main_port = r.port("MASTER_PORT");
  VOLT_CHECK(e.main_port != 0, ConfigError, kTag, " ", r.who(), ": MASTER_PORT is not set", why,
             ".");
  e.global_rank = e.node_rank * devices + e.local_rank;
  e.restart_count = volt_restart_count(r);
  return e;
}

ClusterEnvironment detect_torchrun(const Reader& r, int64_t devices) {
  const std::string why = " (torchrun sets it)";
  ClusterEnvironment e;
  e.kind = ClusterKind::kTorchrun;
  e.global_rank = r.required_int("RANK", 0, kMaxRanks, why);
  e.local_rank = r.required_int("LOCAL_RANK", 0, kMaxRanks, why);
  e.world_size = r.required_int("WORLD_SIZE", 1, kMaxRanks, why);
  int64_t local_size = r.required_int("LOCAL_WORLD_SIZE", 1, kMaxRanks, why);
  VOLT_CHECK(local_size == devices, ConfigError, kTag, " torchrun: LOCAL_WORLD_SIZE=", local_size,
             " but devices=", devices, "; run torchrun --nproc-per-node=", devices,
             " or set devices=", local_size, ".");
  auto group = r.integer("GROUP_RANK", 0, kMaxRanks);
  e.node_rank = group ? *group : e.global_rank / local_size;
  e.main_address = r.required_str("MASTER_ADDR", why);
  e.main_port = r.port("MASTER_PORT");
  VOLT_CHECK(e.main_port != 0, ConfigError, kTag, " torchrun: MASTER_PORT is not set", why,
             "; set MASTER_PORT.");
  e.restart_count = r.integer("TORCHELASTIC_RESTART_COUNT", 0, kMaxRanks).value_or(0);
  // torchrun's static rendezvous (its default) hosts the store in its agent and says so with
  // "True" (torch compares with exactly that); its c10d rendezvous leaves it to rank 0 ("False").
  e.agent_store = r.str("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  return e;
}

ClusterEnvironment detect_slurm(const Reader& r) {
  const std::string why = " (srun sets it)";
  ClusterEnvironment e;
  e.kind = ClusterKind::kSlurm;
  e.global_rank = r.required_int("SLURM_PROCID", 0, kMaxRanks, why);
  e.world_size = r.required_int("SLURM_NTASKS", 1, kMaxRanks, why);
  e.local_rank = r.required_int("SLURM_LOCALID", 0, kMaxRanks, why);
  e.node_rank = r.required_int("SLURM_NODEID", 0, kMaxRanks, why);
  if (auto addr = r.str("MASTER_ADDR")) {
    e.main_address = *addr;
  } else {
    auto list = r.str("SLURM_NODELIST");
    if (!list) list = r.str("SLURM_JOB_NODELIST");
    VOLT_CHECK(list, ConfigError, kTag,
               " slurm: neither SLURM_NODELIST nor MASTER_ADDR is set; run under srun or set "
               "MASTER_ADDR to the first node's address.");
    e.main_address = expand_slurm_nodelist(*list).front();
  }
  e.main_port = r.port("MASTER_PORT");
  if (e.main_port == 0) {
    auto job = r.str("SLURM_JOB_ID");
    if (job) {
      auto id = parse_int(*job, 0, std::numeric_limits<int64_t>::max() / 10);
      VOLT_CHECK(id, ConfigError, kTag, " slurm: SLURM_JOB_ID='", *job,
                 "' is not an integer; set MASTER_PORT instead.");
      e.main_port = static_cast<int>(kSlurmPortBase + *id % 10000);
    } else {
      e.main_port = kSlurmFallbackPort;
    }
  }
  return e;
}

// An MPI launcher's count of processes on this node (`var`, optional) must be `devices`;
// `option` is its flag that sets it.
void check_local_size(const Reader& r, const char* var, int64_t devices, const char* option) {
  if (auto local_size = r.integer(var, 1, kMaxRanks)) {
    VOLT_CHECK(*local_size == devices, ConfigError, kTag, " ", r.who(), ": ", var, "=", *local_size,
               " but devices=", devices, "; start ", devices, " processes per node (", option,
               devices, ").");
  }
}

// An MPI launcher names no rendezvous: MASTER_ADDR (required on several nodes; else loopback)
// and MASTER_PORT (default kDefaultMpiPort).
void set_mpi_rendezvous(ClusterEnvironment& e, const Reader& r, int64_t num_nodes) {
  if (num_nodes > 1) {
    e.main_address =
        r.required_str("MASTER_ADDR", " (needed on several nodes: the address of rank 0's node)");
  } else if (auto addr = r.str("MASTER_ADDR")) {
    e.main_address = *addr;
  }
  e.main_port = r.port("MASTER_PORT");
  if (e.main_port == 0) e.main_port = kDefaultMpiPort;
}

ClusterEnvironment detect_openmpi(const Reader& r, int64_t devices, int64_t num_nodes) {
  const std::string why = " (mpirun sets it)";
  ClusterEnvironment e;
  e.kind = ClusterKind::kOpenMpi;
  e.global_rank = r.required_int("OMPI_COMM_WORLD_RANK", 0, kMaxRanks, why);
  e.world_size = r.required_int("OMPI_COMM_WORLD_SIZE", 1, kMaxRanks, why);
  e.local_rank = r.required_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, kMaxRanks, why);
  check_local_size(r, "OMPI_COMM_WORLD_LOCAL_SIZE", devices, "mpirun --npernode ");
  // Open MPI gives no node index that counts only this job's nodes; with block placement (the
  // default --map-by slot) it is the rank's block.
  e.node_rank = e.global_rank / devices;
  set_mpi_rendezvous(e, r, num_nodes);
  return e;
}

// MPICH and Intel MPI, whose Hydra launcher gives the local rank and count too; the node index
// and the rendezvous as for Open MPI.
ClusterEnvironment detect_mpich(const Reader& r, int64_t devices, int64_t num_nodes) {
  const std::string why = " (mpiexec sets it)";
  ClusterEnvironment e;
  e.kind = ClusterKind::kMpich;
  e.global_rank = r.required_int("PMI_RANK", 0, kMaxRanks, why);
  e.world_size = r.required_int("PMI_SIZE", 1, kMaxRanks, why);
  VOLT_CHECK(e.global_rank < e.world_size, ConfigError, kTag, " mpich: PMI_RANK=", e.global_rank,
             " is not below PMI_SIZE=", e.world_size, "; start the program with mpiexec.");
  e.local_rank = r.required_int("MPI_LOCALRANKID", 0, kMaxRanks,
                                " (Hydra's mpiexec sets it; another process manager may not: run "
                                "under Hydra, or set MPI_LOCALRANKID and MPI_LOCALNRANKS)");
  check_local_size(r, "MPI_LOCALNRANKS", devices, "mpiexec -ppn ");
  // Hydra's default placement fills a node before the next (block): the rank's block.
  e.node_rank = e.global_rank / devices;
  set_mpi_rendezvous(e, r, num_nodes);
  return e;
}

ClusterEnvironment detect_plain(const Reader& r, int64_t devices, int64_t num_nodes) {
  ClusterEnvironment e;
  e.kind = ClusterKind::kPlain;
  const bool multi_node = num_nodes > 1;
  const std::string multi = " (required with num_nodes=" + std::to_string(num_nodes) + ")";
  auto world = r.integer("WORLD_SIZE", 1, kMaxRanks);
  VOLT_CHECK(world || !multi_node, ConfigError, kTag, " plain: WORLD_SIZE is not set", multi,
             "; set WORLD_SIZE=", devices * num_nodes, " on every node.");
  e.world_size = world ? *world : devices * num_nodes;
  auto node = r.integer("NODE_RANK", 0, kMaxRanks);
  VOLT_CHECK(node || !multi_node, ConfigError, kTag, " plain: NODE_RANK is not set", multi,
             "; set NODE_RANK to this node's index (0 to ", num_nodes - 1, ").");
  e.node_rank = node ? *node : 0;
  auto local = r.integer("LOCAL_RANK", 0, kMaxRanks);
  e.local_rank = local ? *local : 0;
  // Lightning's rule: LOCAL_RANK set means someone else started the local processes.
  e.launches_workers = !local && devices > 1;
  if (auto addr = r.str("MASTER_ADDR")) {
    e.main_address = *addr;
  } else {
    VOLT_CHECK(e.node_rank == 0, ConfigError, kTag,
               " plain: MASTER_ADDR is not set on NODE_RANK=", e.node_rank,
               "; set MASTER_ADDR to the address of the NODE_RANK 0 machine.");
  }
  e.main_port = r.port("MASTER_PORT");
  VOLT_CHECK(e.main_port != 0 || !multi_node, ConfigError, kTag, " plain: MASTER_PORT is not set",
             multi,
             "; set MASTER_PORT to a free port on the NODE_RANK 0 machine, the same on "
             "every node.");
  VOLT_CHECK(e.main_port != 0 || !local || devices == 1, ConfigError, kTag,
             " plain: MASTER_PORT is not set but LOCAL_RANK=", *local,
             " says the processes were started externally; set MASTER_PORT to the same free port "
             "in every process, or unset LOCAL_RANK to let volt start them.");
  e.global_rank = e.node_rank * devices + e.local_rank;
  e.restart_count = volt_restart_count(r);
  return e;
}

}  // namespace

std::string to_string(ClusterKind kind) {
  switch (kind) {
    case ClusterKind::kPlain: return "plain";
    case ClusterKind::kTorchrun: return "torchrun";
    case ClusterKind::kSlurm: return "slurm";
    case ClusterKind::kOpenMpi: return "openmpi";
    case ClusterKind::kMpich: return "mpich";
  }
  return "unknown";
}

std::ostream& operator<<(std::ostream& os, const ClusterEnvironment& e) {
  return os << "ClusterEnvironment(kind=" << to_string(e.kind) << ", world_size=" << e.world_size
            << ", global_rank=" << e.global_rank << ", local_rank=" << e.local_rank
            << ", node_rank=" << e.node_rank << ", local_world_size=" << e.local_world_size
            << ", num_nodes=" << e.num_nodes << ", main=" << e.main_address << ":" << e.main_port
            << ", launches_workers=" << e.launches_workers
            << ", launched_child=" << e.launched_child << ", restart_count=" << e.restart_count
            << ", agent_store=" << e.agent_store << ")";
}

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    // Set-but-empty stays distinguishable here (the detection reports it); the name must still
    // be in volt's table (`volt env`).
    detail::listed_env_var(name);
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

EnvLookup env_from_map(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

ClusterEnvironment detect_cluster_environment(const EnvLookup& env, int64_t devices,
                                              int64_t num_nodes) {
  VOLT_CHECK(devices >= 1, ConfigError, kTag, " devices=", devices,
             " must be at least 1 (resolve devices=-1 to a count first).");
  VOLT_CHECK(num_nodes >= 1, ConfigError, kTag, " num_nodes=", num_nodes, " must be at least 1.");
  VOLT_CHECK(devices <= kMaxRanks / num_nodes, ConfigError, kTag,
             " devices × num_nodes = ", devices, " × ", num_nodes,
             " is too large; a job has at most ", kMaxRanks,
             " processes (devices is the count per node).");
  ClusterEnvironment e;
  const Reader child(env, "volt worker"), torchrun(env, "torchrun"), slurm(env, "slurm"),
      mpi(env, "openmpi"), mpich(env, "mpich"), plain(env, "plain");
  // An interactive Slurm allocation (salloc, srun --pty bash) sets SLURM_* in the shell, but the
  // program in it was not started by srun: Lightning's rule (SLURMEnvironment) by the job name.
  const std::string job_name = env("SLURM_JOB_NAME").value_or("");
  const bool slurm_interactive = job_name == "bash" || job_name == "interactive";
  if (env(kLaunchedChildVar).value_or("") == "1") {
    e = detect_launched_child(child, devices);
    check_layout(e, child, "WORLD_SIZE", "", devices, num_nodes);
  } else if (torchrun.has("RANK") && torchrun.has("LOCAL_RANK") && torchrun.has("WORLD_SIZE") &&
             torchrun.has("LOCAL_WORLD_SIZE")) {
    e = detect_torchrun(torchrun, devices);
    check_layout(e, torchrun, "WORLD_SIZE", " (LOCAL_WORLD_SIZE)", devices, num_nodes);
  } else if (slurm.has("SLURM_PROCID") && slurm.has("SLURM_NTASKS") && !slurm_interactive) {
    e = detect_slurm(slurm);
    check_layout(e, slurm, "SLURM_NTASKS", " (srun --ntasks-per-node)", devices, num_nodes);
  } else if (mpi.has("OMPI_COMM_WORLD_RANK") && mpi.has("OMPI_COMM_WORLD_SIZE")) {
    e = detect_openmpi(mpi, devices, num_nodes);
    check_layout(e, mpi, "OMPI_COMM_WORLD_SIZE", "", devices, num_nodes);
  } else if (mpich.has("PMI_RANK") && mpich.has("PMI_SIZE")) {
    e = detect_mpich(mpich, devices, num_nodes);
    check_layout(e, mpich, "PMI_SIZE", "", devices, num_nodes);
  } else {
    e = detect_plain(plain, devices, num_nodes);
    check_layout(e, plain, "WORLD_SIZE", "", devices, num_nodes);
  }
  e.local_world_size = devices;
  e.num_nodes = num_nodes;
  return e;
}

std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist) {
  // Bounds on what a 128 KiB environment variable may expand to: a million hosts of at most
  // 255 characters (a DNS name's limit). Checked as it expands: one bracket group of many long
  // ranges, or text after a large group (appended to every host so far), made billions of
  // strings or hundreds of GB before a check after the fact.
  constexpr size_t kMaxHosts = 1 << 20;
  constexpr size_t kMaxHostName = 255;
  auto fail = [&](const std::string& why) {
    VOLT_CHECK(false, ConfigError, kTag, " slurm: SLURM_NODELIST='", nodelist, "' is malformed (",
               why, "); set MASTER_ADDR to the first node's address instead.");
  };
  std::vector<std::string> hosts;
  size_t i = 0;
  const size_t n = nodelist.size();
  if (n == 0) fail("empty");
  // Hosts are separated by a comma or a space outside brackets (Lightning's
  // resolve_root_node_address takes both: "host0 host1" was one host name "host0 host1").
  const auto separator = [](char c) { return c == ',' || c == ' '; };
  while (i < n) {
    // One host pattern: text with bracket groups, up to a separator outside brackets.
    std::vector<std::string> partial{""};
    while (i < n && !separator(nodelist[i])) {
      if (nodelist[i] == ']') fail("']' without '['");
      if (nodelist[i] != '[') {
        if (partial.front().size() >= kMaxHostName) fail("a host name over 255 characters");
        for (auto& p : partial) p += nodelist[i];
        ++i;
        continue;
      }
      size_t close = nodelist.find(']', i);
      if (close == std::string::npos) fail("'[' without ']'");
      std::string group = nodelist.substr(i + 1, close - i - 1);
      if (group.empty()) fail("empty []");
      std::vector<std::string> items;
      size_t widest = 0;  // of the items
      size_t start = 0;
      while (start <= group.size()) {
        size_t comma = group.find(',', start);
        if (comma == std::string::npos) comma = group.size();
        std::string range = group.substr(start, comma - start);
        size_t dash = range.find('-');
        std::string lo_s = range.substr(0, dash);
        std::string hi_s = dash == std::string::npos ? lo_s : range.substr(dash + 1);
        auto lo = parse_int(lo_s, 0, std::numeric_limits<int64_t>::max() / 10);
        auto hi = parse_int(hi_s, 0, std::numeric_limits<int64_t>::max() / 10);
        if (!lo || !hi) fail("'" + range + "' is not a number or a range a-b");
        if (*lo > *hi) fail("range '" + range + "' runs backwards");
        if (static_cast<size_t>(*hi - *lo) >= kMaxHosts) fail("range '" + range + "' too long");
        // Zero padding follows the lower bound, as Slurm writes it ("003-005").
        const size_t width = lo_s.size();
        for (int64_t v = *lo; v <= *hi; ++v) {
          std::string s = std::to_string(v);
          if (s.size() < width) s.insert(0, width - s.size(), '0');
          widest = std::max(widest, s.size());
          items.push_back(s);
        }
        if (items.size() > kMaxHosts) fail("too many hosts");
        start = comma + 1;
      }
      std::vector<std::string> next;
      if (partial.size() * items.size() > kMaxHosts) fail("too many hosts");
      if (partial.front().size() + widest > kMaxHostName) {
        fail("a host name over 255 characters");
      }
      for (const auto& p : partial) {
        for (const auto& it : items) next.push_back(p + it);
      }
      partial = std::move(next);
      i = close + 1;
    }
    if (partial.size() == 1 && partial[0].empty()) fail("empty host name");
    hosts.insert(hosts.end(), partial.begin(), partial.end());
    if (hosts.size() > kMaxHosts) fail("too many hosts");
    if (i < n) {
      ++i;  // the separator
      if (i == n) fail("a trailing separator");
    }
  }
  return hosts;
}

}  // namespace volt
