#include "volt/core/env.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include "core/detail/env_table.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/core/registry.h"

extern char** environ;

namespace volt {
namespace {

std::vector<EnvVar> make_table() {
  using G = EnvGroup;
  // One entry per line reads better than one field per line.
  // clang-format off
  return {
      {"VOLT_LOG_HOST_SYNCS", G::kVolt, "0 | 1 | 2",
       "log host syncs and CPU ops inside training steps for every Trainer: 1 the first of each "
       "and a table at the end of fit, 2 each one (HostSyncMonitor)",
       {"0", "1", "2"}},
      {"VOLT_CACHE_DIR", G::kVolt, "PATH",
       "folder of volt's per-machine caches (the bf16 probe); default $XDG_CACHE_HOME/volt, "
       "then ~/.cache/volt",
       {}},
      {"VOLT_KERNEL_CACHE_CONFIG", G::kVolt, "DIR,CLEAR_AT_START,SIZE_MB",
       "folder, clear-at-start (true/false) and size cap in MiB of the JIT's kernel cache "
       "(KernelCache, as PT_HPU_RECIPE_CACHE_CONFIG); default <VOLT_CACHE_DIR>/kernels,false,1024",
       {}},
      {"VOLT_JIT_CC", G::kVolt, "COMMAND",
       "C compiler (with leading words, e.g. \"ccache cc\") the JIT compiles kernels with; "
       "default cc", {}},
      {"VOLT_ALLOCATOR", G::kVolt, "default | jemalloc | tcmalloc",
       "host allocator scripts/demo.sh runs under (scripts/with_allocator.sh); not read by the "
       "library", {}},
      {"VOLT_CHROMIUM", G::kVolt, "PATH",
       "browser scripts/check_report.sh renders the run report with; not read by the library", {}},
      {"LOWER_LIST", G::kReference, "PATH",
       "file of op names added to the bf16 autocast list (mixed precision, read_env_lists)", {}},
      {"FP32_LIST", G::kReference, "PATH",
       "file of op names added to the fp32 autocast list (mixed precision, read_env_lists)", {}},
      {"QUANT_CONFIG", G::kReference, "PATH",
       "fp8 inference measure/quantize JSON, when Fp8PrecisionOptions::quant_config is empty",
       {}},
      {"MASTER_ADDR", G::kCluster, "HOST", "address of node 0's rendezvous store", {}},
      {"MASTER_PORT", G::kCluster, "PORT", "port of the rendezvous store", {}},
      {"WORLD_SIZE", G::kCluster, "N", "number of processes in the job", {}},
      {"NODE_RANK", G::kCluster, "N", "this node's index (volt's launcher, Lightning's)", {}},
      {"GROUP_RANK", G::kCluster, "N", "this node's index under torchrun", {}},
      {"TORCHELASTIC_RESTART_COUNT", G::kCluster, "N",
       "torchrun: attempt of the job (restarts so far); keys the rendezvous per attempt", {}},
      {"TORCHELASTIC_USE_AGENT_STORE", G::kCluster, "True|False",
       "torchrun: True when its agent hosts the store at MASTER_ADDR:MASTER_PORT", {}},
      {"TORCHELASTIC_ERROR_FILE", G::kCluster, "PATH",
       "torchrun: where a failed worker writes its error (the CLI does), for torchrun's summary",
       {}},
      {"RANK", G::kCluster, "N", "global rank (torchrun)", {}},
      {"LOCAL_RANK", G::kCluster, "N", "rank on this node", {}},
      {"LOCAL_WORLD_SIZE", G::kCluster, "N", "processes on this node (torchrun)", {}},
      {"SLURM_NTASKS", G::kCluster, "N", "Slurm: number of tasks (world size)", {}},
      {"SLURM_PROCID", G::kCluster, "N", "Slurm: global rank", {}},
      {"SLURM_LOCALID", G::kCluster, "N", "Slurm: local rank", {}},
      {"SLURM_NODEID", G::kCluster, "N", "Slurm: node rank", {}},
      {"SLURM_JOB_ID", G::kCluster, "ID", "Slurm: job id (seeds the rendezvous port)", {}},
      {"SLURM_NODELIST", G::kCluster, "LIST", "Slurm: nodes; the first hosts the store", {}},
      {"SLURM_JOB_NODELIST", G::kCluster, "LIST", "Slurm: nodes (newer name)", {}},
      {"SLURM_JOB_NAME", G::kCluster, "NAME",
       "Slurm: job name; bash or interactive is an interactive shell, not srun's task (plain)",
       {}},
      {"OMPI_COMM_WORLD_SIZE", G::kCluster, "N", "Open MPI: world size", {}},
      {"OMPI_COMM_WORLD_RANK", G::kCluster, "N", "Open MPI: global rank", {}},
      {"OMPI_COMM_WORLD_LOCAL_RANK", G::kCluster, "N", "Open MPI: local rank", {}},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", G::kCluster, "N", "Open MPI: processes on this node", {}},
      {"PMI_RANK", G::kCluster, "N", "MPICH / Intel MPI (Hydra): global rank", {}},
      {"PMI_SIZE", G::kCluster, "N", "MPICH / Intel MPI (Hydra): world size", {}},
      {"MPI_LOCALRANKID", G::kCluster, "N", "MPICH / Intel MPI (Hydra): local rank", {}},
      {"MPI_LOCALNRANKS", G::kCluster, "N", "MPICH / Intel MPI (Hydra): processes on this node",
       {}},
      {"TORCH_DISTRIBUTED_DEBUG", G::kSystem, "OFF | INFO | DETAIL",
       "DETAIL (any case): before each collective the ranks compare their calls (op, shapes, "
       "dtypes) and all fail with a ValueError naming them when they differ (PyTorch's switch; "
       "INFO as OFF)",
       {}},
      {"GLOO_SOCKET_IFNAME", G::kSystem, "IFACE",
       "network interface Gloo uses when ProcessGroupOptions::interface is empty", {}},
      {"OMP_NUM_THREADS", G::kSystem, "N",
       "when set (or OPENBLAS_NUM_THREADS), DDP leaves OpenBLAS's thread count alone", {}},
      {"OPENBLAS_NUM_THREADS", G::kSystem, "N", "as OMP_NUM_THREADS", {}},
      {"CUBLAS_WORKSPACE_CONFIG", G::kSystem, ":SIZE:COUNT",
       "deterministic=true sets :4096:8 when it is unset (deterministic cuBLAS)", {}},
      {"MALLOC_MMAP_THRESHOLD_", G::kSystem, "BYTES",
       "glibc malloc's mmap threshold; when set (or any of the next four), the Trainer leaves "
       "malloc's thresholds to the environment (TrainerOptions::reuse_host_memory)", {}},
      {"MALLOC_TRIM_THRESHOLD_", G::kSystem, "BYTES", "glibc malloc's trim threshold; as above",
       {}},
      {"MALLOC_TOP_PAD_", G::kSystem, "BYTES", "glibc malloc's top padding; as above", {}},
      {"MALLOC_MMAP_MAX_", G::kSystem, "N", "glibc malloc's mmap count limit; as above", {}},
      {"GLIBC_TUNABLES", G::kSystem, "NAME=VALUE:...",
       "as above when it names a glibc.malloc tunable", {}},
      {"TMPDIR", G::kSystem, "PATH",
       "folder of the temporary file a ZeRO checkpoint is consolidated into (/tmp without it)",
       {}},
      {"XDG_CACHE_HOME", G::kSystem, "PATH", "cache root when VOLT_CACHE_DIR is unset", {}},
      {"HOME", G::kSystem, "PATH", "~/.cache/volt when neither cache variable is set", {}},
      {"VOLT_LAUNCHED_CHILD", G::kLauncher, "1", "marks a worker volt's launcher started", {}},
      {"VOLT_GLOBAL_SEED", G::kLauncher, "N",
       "seed_everything's seed, for the processes it starts (loaders without a seed shuffle by "
       "it)",
       {}},
      {"VOLT_RESTART_COUNT", G::kLauncher, "N",
       "how many times the job restarted its workers (restart_after_failure)", {}},
      {"VOLT_RESTART_CHECKPOINT", G::kLauncher, "PATH",
       "checkpoint a restarted worker resumes from", {}},
      {"VOLT_TEST_AIO_SUBMIT_FAILS", G::kTesting, "N",
       "the N-th io_uring submission of each NVMe swap file fails with EAGAIN (aio tests)", {}},
      {"VOLT_TEST_KILL_AFTER_NVME_WRITES", G::kTesting, "RANK:N",
       "SIGKILL local rank RANK after its N-th NVMe swap write (crash tests)", {}},
  };
  // clang-format on
}

// The listed name nearest to `name` by registry.h's closest_match (also comparing without the
// VOLT_ prefix, so that VOLT_QUANT_CONFIG finds QUANT_CONFIG), or "" when none is close.
std::string closest_name(const std::string& name) {
  std::vector<std::string> names;
  for (const auto& v : env_vars()) names.push_back(v.name);
  const std::string near = closest_match(name, names);
  if (!near.empty() || name.rfind("VOLT_", 0) != 0) return near;
  return closest_match(name.substr(5), names);
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

}  // namespace

const char* to_string(EnvGroup g) {
  switch (g) {
    case EnvGroup::kVolt: return "volt";
    case EnvGroup::kReference: return "reference";
    case EnvGroup::kCluster: return "cluster";
    case EnvGroup::kSystem: return "system";
    case EnvGroup::kLauncher: return "launcher";
    case EnvGroup::kTesting: return "testing";
  }
  return "?";
}

const std::vector<EnvVar>& env_vars() {
  static const std::vector<EnvVar> table = make_table();
  return table;
}

const EnvVar* find_env_var(const std::string& name) {
  for (const auto& v : env_vars()) {
    if (v.name == name) return &v;
  }
  return nullptr;
}

namespace detail {

const EnvVar& listed_env_var(const std::string& name) {
  const EnvVar* var = find_env_var(name);
  VOLT_CHECK(var != nullptr, InternalError, "[env] ", name,
             " is read but not listed in volt's table of environment variables (src/core/env.cpp); "
             "add it there.");
  return *var;
}

}  // namespace detail

std::optional<std::string> env_value(const std::string& name) {
  const EnvVar* var = &detail::listed_env_var(name);
  const char* v = std::getenv(name.c_str());
  if (v == nullptr || *v == '\0') return std::nullopt;
  const std::string value = v;
  const auto& c = var->choices;
  VOLT_CHECK(c.empty() || std::find(c.begin(), c.end(), value) != c.end(), ConfigError, "[env] ",
             name, "=\"", value, "\" is not one of ", join(c, ", "), "; ", name,
             " means: ", var->meaning, ". Set one of those values or unset it.");
  return value;
}

std::vector<std::string> unknown_env_warnings() {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    if (name.rfind("VOLT_", 0) != 0 || find_env_var(name) != nullptr) continue;
    std::string w = name + " is set but volt reads no such variable";
    const std::string near = closest_name(name);
    w += near.empty() ? "; `volt env` lists the ones it reads." : "; did you mean " + near + "?";
    out.push_back(std::move(w));
  }
  std::sort(out.begin(), out.end());
  return out;
}

void check_environment() {
  // Values first, every call: a bad one must stop every run, not only the first.
  std::vector<std::string> set;
  for (const auto& v : env_vars()) {
    const auto value = env_value(v.name);
    if (value && (v.group == EnvGroup::kVolt || v.group == EnvGroup::kReference)) {
      set.push_back(v.name + "=" + *value);
    }
  }
  static std::once_flag logged;
  std::call_once(logged, [&] {
    for (const auto& w : unknown_env_warnings()) log_warning("env", w);
    if (!set.empty()) log_info("env", "set: " + join(set, ", "));
  });
}

}  // namespace volt
