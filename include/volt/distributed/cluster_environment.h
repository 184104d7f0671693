#pragma once
/// Cluster environments: where this process sits in a multi-process job (ranks, rendezvous
/// address) and whether volt itself must start the other local processes. No torch headers.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace volt {

/// Who started this process.
enum class ClusterKind {
  kPlain,     ///< a plain process (volt launches its local workers) or one of volt's workers
  kTorchrun,  ///< torchrun / torch.distributed.run
  kSlurm,     ///< srun
  kOpenMpi,   ///< Open MPI's mpirun
  kMpich,     ///< MPICH's or Intel MPI's mpiexec (Hydra: PMI_RANK, MPI_LOCALRANKID)
};

/// "plain", "torchrun", "slurm", "openmpi" or "mpich".
std::string to_string(ClusterKind kind);

/// The environment variable volt's local launcher sets to "1" in the workers it starts.
inline constexpr const char* kLaunchedChildVar = "VOLT_LAUNCHED_CHILD";

/// This process's place in the job. Ranks satisfy
/// global_rank = node_rank * local_world_size + local_rank.
struct ClusterEnvironment {
  ClusterKind kind = ClusterKind::kPlain;
  int64_t world_size = 1;
  int64_t global_rank = 0;
  int64_t local_rank = 0;
  int64_t node_rank = 0;
  /// Processes per node (= devices).
  int64_t local_world_size = 1;
  int64_t num_nodes = 1;
  /// Address of the node hosting global rank 0 (the rendezvous store).
  std::string main_address = "127.0.0.1";
  /// Port of the rendezvous store; 0 = not chosen yet (a local run: the launcher picks a free one).
  int main_port = 0;
  /// True when this plain process must start local ranks 1..local_world_size-1 itself.
  bool launches_workers = false;
  /// True in a worker started by volt's local launcher.
  bool launched_child = false;
  /// The attempt of an elastic job: 0 at first, k after k restarts (VOLT_RESTART_COUNT, set by
  /// volt's restarts; TORCHELASTIC_RESTART_COUNT under torchrun). A group keeps its rendezvous
  /// keys apart per attempt, so a store that outlives a failed attempt serves the next one.
  int64_t restart_count = 0;
  /// True when the launcher hosts the rendezvous store at MASTER_ADDR:MASTER_PORT (torchrun's
  /// agent store, TORCHELASTIC_USE_AGENT_STORE=True): rank 0 connects to it instead of hosting one.
  bool agent_store = false;
};

std::ostream& operator<<(std::ostream& os, const ClusterEnvironment& env);

/// Reads one environment variable; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

/// The process environment (getenv).
EnvLookup process_env();

/// A fixed environment (tests, or a launcher preparing a child's variables).
EnvLookup env_from_map(std::map<std::string, std::string> vars);

/// Detects the cluster environment from the variables `env` returns, for `devices` processes per
/// node on `num_nodes` nodes. Checked in this order (the first whose variables are present wins):
/// - volt's own workers (VOLT_LAUNCHED_CHILD=1 with LOCAL_RANK, NODE_RANK, WORLD_SIZE,
///   MASTER_ADDR, MASTER_PORT);
/// - torchrun (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR/PORT);
/// - Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_NODELIST; MASTER_ADDR
///   and MASTER_PORT override the first node and the port derived from SLURM_JOB_ID), unless
///   SLURM_JOB_NAME is "bash" or "interactive" (an interactive allocation, as Lightning's
///   SLURMEnvironment: the program was not started by srun, so it is a plain process);
/// - Open MPI (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; MASTER_ADDR, needed on
///   several nodes, and MASTER_PORT, default 29500);
/// - MPICH and Intel MPI (Hydra's PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS; MASTER_ADDR
///   and MASTER_PORT as for Open MPI);
/// - plain, as the reference describes: MASTER_PORT (a free port on node 0), MASTER_ADDR
///   (required except on NODE_RANK 0), WORLD_SIZE and NODE_RANK, all required on several nodes;
///   on one node none is needed. Without LOCAL_RANK this process is local rank 0 and launches
///   the others.
/// Throws ConfigError (one line naming the variable, its value and the fix) when a variable is
/// malformed or contradicts devices × num_nodes.
ClusterEnvironment detect_cluster_environment(const EnvLookup& env, int64_t devices,
                                              int64_t num_nodes);

/// Expands a Slurm host list ("node[003-005,9],gpu1" -> node003 node004 node005 node9 gpu1);
/// throws ConfigError on malformed input.
std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist);

}  // namespace volt
