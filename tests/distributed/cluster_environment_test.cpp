#include "volt/distributed/cluster_environment.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "volt/core/errors.h"

namespace {

using volt::ClusterEnvironment;
using volt::ClusterKind;
using Vars = std::map<std::string, std::string>;

ClusterEnvironment detect(const Vars& vars, int64_t devices, int64_t num_nodes = 1) {
  return volt::detect_cluster_environment(volt::env_from_map(vars), devices, num_nodes);
}

// Expects a ConfigError whose message contains every phrase.
void expect_error(const Vars& vars, int64_t devices, int64_t num_nodes,
                  std::initializer_list<const char*> phrases) {
  try {
    detect(vars, devices, num_nodes);
    ADD_FAILURE() << "no ConfigError";
  } catch (const volt::ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
    EXPECT_EQ(msg.rfind("[ClusterEnvironment]", 0), 0u) << msg;
    for (const char* p : phrases)
      EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' in " << msg;
  }
}

// ---- plain ----

TEST(ClusterEnvironment, PlainSingleProcess) {
  auto e = detect({}, 1);
  EXPECT_EQ(e.kind, ClusterKind::kPlain);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.global_rank, 0);
  EXPECT_FALSE(e.launches_workers);
  EXPECT_FALSE(e.launched_child);
}

TEST(ClusterEnvironment, PlainOneNodeLaunchesItsWorkers) {
  auto e = detect({}, 4);
  EXPECT_EQ(e.kind, ClusterKind::kPlain);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.num_nodes, 1);
  EXPECT_EQ(e.global_rank, 0);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.main_address, "127.0.0.1");
  EXPECT_EQ(e.main_port, 0) << "the launcher picks a free port";
  EXPECT_TRUE(e.launches_workers);
}

TEST(ClusterEnvironment, PlainOneNodeKeepsAGivenPort) {
  auto e = detect({{"MASTER_PORT", "29600"}}, 2);
  EXPECT_EQ(e.main_port, 29600);
  EXPECT_TRUE(e.launches_workers);
}

TEST(ClusterEnvironment, PlainMultiNodeAsTheReferenceDescribes) {
  // Node 0: MASTER_ADDR may be omitted.
  auto n0 = detect({{"MASTER_PORT", "29500"}, {"WORLD_SIZE", "16"}, {"NODE_RANK", "0"}}, 8, 2);
  EXPECT_EQ(n0.world_size, 16);
  EXPECT_EQ(n0.node_rank, 0);
  EXPECT_EQ(n0.global_rank, 0);
  EXPECT_EQ(n0.main_port, 29500);
  EXPECT_TRUE(n0.launches_workers);
  auto n1 = detect({{"MASTER_ADDR", "10.0.0.1"},
                    {"MASTER_PORT", "29500"},
                    {"WORLD_SIZE", "16"},
                    {"NODE_RANK", "1"}},
                   8, 2);
  EXPECT_EQ(n1.node_rank, 1);
  EXPECT_EQ(n1.global_rank, 8) << "node_rank × devices + local_rank";
  EXPECT_EQ(n1.main_address, "10.0.0.1");
  EXPECT_TRUE(n1.launches_workers);
}

TEST(ClusterEnvironment, PlainWithLocalRankIsStartedExternally) {
  auto e = detect({{"MASTER_ADDR", "10.0.0.1"},
                   {"MASTER_PORT", "29500"},
                   {"WORLD_SIZE", "4"},
                   {"NODE_RANK", "1"},
                   {"LOCAL_RANK", "1"}},
                  2, 2);
  EXPECT_FALSE(e.launches_workers);
  EXPECT_EQ(e.global_rank, 3);
}

TEST(ClusterEnvironment, PlainErrors) {
  expect_error({{"MASTER_PORT", "1"}, {"NODE_RANK", "0"}}, 2, 2, {"WORLD_SIZE is not set", "=4"});
  expect_error({{"MASTER_PORT", "1"}, {"WORLD_SIZE", "4"}}, 2, 2, {"NODE_RANK is not set"});
  expect_error({{"MASTER_PORT", "1"}, {"WORLD_SIZE", "4"}, {"NODE_RANK", "1"}}, 2, 2,
               {"MASTER_ADDR is not set on NODE_RANK=1"});
  expect_error({{"MASTER_ADDR", "h"}, {"WORLD_SIZE", "4"}, {"NODE_RANK", "1"}}, 2, 2,
               {"MASTER_PORT is not set", "free port"});
  expect_error({{"WORLD_SIZE", "3"}}, 2, 1, {"WORLD_SIZE=3", "devices × num_nodes = 2 × 1 = 2"});
  expect_error(
      {{"MASTER_PORT", "1"}, {"WORLD_SIZE", "4"}, {"NODE_RANK", "2"}, {"MASTER_ADDR", "h"}}, 2, 2,
      {"node rank 2", "num_nodes=2"});
  expect_error({{"LOCAL_RANK", "1"}}, 2, 1, {"MASTER_PORT is not set but LOCAL_RANK=1"});
  expect_error({{"LOCAL_RANK", "2"}, {"MASTER_PORT", "5"}}, 2, 1, {"local rank 2", "devices=2"});
}

TEST(ClusterEnvironment, MalformedNumbersNameTheVariable) {
  expect_error({{"WORLD_SIZE", "4x"}}, 4, 1, {"WORLD_SIZE='4x' is not an integer"});
  expect_error({{"WORLD_SIZE", "-4"}}, 4, 1, {"WORLD_SIZE='-4'"});
  expect_error({{"WORLD_SIZE", "0"}}, 4, 1, {"WORLD_SIZE='0'", "[1, "});
  expect_error({{"MASTER_PORT", "70000"}}, 2, 1, {"MASTER_PORT='70000'", "65535"});
  expect_error({{"MASTER_PORT", " 80"}}, 2, 1, {"MASTER_PORT=' 80'"});
  expect_error({{"NODE_RANK", "99999999999999999999"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}},
               1, 2, {"NODE_RANK='99999999999999999999'"});
}

TEST(ClusterEnvironment, EmptyVariableCountsAsUnset) {
  auto e = detect({{"MASTER_PORT", ""}, {"LOCAL_RANK", ""}}, 2);
  EXPECT_EQ(e.main_port, 0);
  EXPECT_TRUE(e.launches_workers);
}

TEST(ClusterEnvironment, BadDevicesOrNodes) {
  expect_error({}, 0, 1, {"devices=0"});
  expect_error({}, -1, 1, {"devices=-1", "resolve"});
  expect_error({}, 1, 0, {"num_nodes=0"});
}

// ---- volt's own workers ----

TEST(ClusterEnvironment, LaunchedChild) {
  Vars v{{"VOLT_LAUNCHED_CHILD", "1"},
         {"LOCAL_RANK", "2"},
         {"NODE_RANK", "1"},
         {"WORLD_SIZE", "8"},
         {"MASTER_ADDR", "10.1.1.1"},
         {"MASTER_PORT", "4000"},
         // A worker started inside a torchrun-looking environment is still volt's worker.
         {"RANK", "0"},
         {"LOCAL_WORLD_SIZE", "4"}};
  auto e = detect(v, 4, 2);
  EXPECT_EQ(e.kind, ClusterKind::kPlain);
  EXPECT_TRUE(e.launched_child);
  EXPECT_FALSE(e.launches_workers);
  EXPECT_EQ(e.global_rank, 6);
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.main_port, 4000);
}

TEST(ClusterEnvironment, LaunchedChildMissingVariable) {
  expect_error({{"VOLT_LAUNCHED_CHILD", "1"},
                {"LOCAL_RANK", "1"},
                {"NODE_RANK", "0"},
                {"WORLD_SIZE", "2"},
                {"MASTER_ADDR", "127.0.0.1"}},
               2, 1, {"volt worker", "MASTER_PORT is not set", "VOLT_LAUNCHED_CHILD"});
}

// ---- torchrun ----

Vars torchrun(int rank, int local, int world, int local_world, int group) {
  return {{"RANK", std::to_string(rank)},
          {"LOCAL_RANK", std::to_string(local)},
          {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_WORLD_SIZE", std::to_string(local_world)},
          {"GROUP_RANK", std::to_string(group)},
          {"MASTER_ADDR", "node0"},
          {"MASTER_PORT", "29400"},
          {"TORCHELASTIC_RUN_ID", "x"}};
}

TEST(ClusterEnvironment, Torchrun) {
  auto e = detect(torchrun(5, 1, 8, 4, 1), 4, 2);
  EXPECT_EQ(e.kind, ClusterKind::kTorchrun);
  EXPECT_EQ(e.global_rank, 5);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.main_address, "node0");
  EXPECT_EQ(e.main_port, 29400);
  EXPECT_FALSE(e.launches_workers);
}

TEST(ClusterEnvironment, TorchrunAttemptAndAgentStore) {
  // What torchrun 1.13 gave its workers here (python3 -m torch.distributed.run): the static
  // rendezvous, its default, hosts the store in the agent; --standalone (c10d) does not.
  auto v = torchrun(1, 1, 2, 2, 0);
  auto e = detect(v, 2);
  EXPECT_EQ(e.restart_count, 0);
  EXPECT_FALSE(e.agent_store) << "unset: rank 0 hosts the store";
  v["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  v["TORCHELASTIC_RESTART_COUNT"] = "3";
  e = detect(v, 2);
  EXPECT_TRUE(e.agent_store);
  EXPECT_EQ(e.restart_count, 3);
  v["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_FALSE(detect(v, 2).agent_store);
  v["TORCHELASTIC_RESTART_COUNT"] = "-1";
  expect_error(v, 2, 1, {"torchrun", "TORCHELASTIC_RESTART_COUNT='-1'", "not an integer"});
}

TEST(ClusterEnvironment, VoltRestartCountIsTheAttempt) {
  Vars child{{"VOLT_LAUNCHED_CHILD", "1"}, {"LOCAL_RANK", "1"},          {"NODE_RANK", "0"},
             {"WORLD_SIZE", "2"},          {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "4000"}};
  EXPECT_EQ(detect(child, 2).restart_count, 0);
  child["VOLT_RESTART_COUNT"] = "2";
  EXPECT_EQ(detect(child, 2).restart_count, 2);
  EXPECT_FALSE(detect(child, 2).agent_store);
  // The launching process reads it too (restart_after_failure sets it in its own environment).
  EXPECT_EQ(detect({{"VOLT_RESTART_COUNT", "1"}}, 2).restart_count, 1);
  expect_error({{"VOLT_RESTART_COUNT", "x"}}, 2, 1, {"plain", "VOLT_RESTART_COUNT='x'"});
  // torchrun's attempt is torchrun's: a stray VOLT_RESTART_COUNT does not count there.
  auto t = torchrun(0, 0, 2, 2, 0);
  t["VOLT_RESTART_COUNT"] = "4";
  EXPECT_EQ(detect(t, 2).restart_count, 0);
}

TEST(ClusterEnvironment, TorchrunWithoutGroupRankDerivesTheNode) {
  auto v = torchrun(6, 2, 8, 4, 0);
  v.erase("GROUP_RANK");
  EXPECT_EQ(detect(v, 4, 2).node_rank, 1);
}

TEST(ClusterEnvironment, TorchrunErrors) {
  expect_error(torchrun(1, 1, 4, 2, 0), 4, 1, {"torchrun", "LOCAL_WORLD_SIZE=2", "devices=4"});
  expect_error(torchrun(1, 1, 4, 2, 0), 2, 1, {"WORLD_SIZE=4", "2 × 1 = 2"});
  expect_error(torchrun(3, 1, 4, 2, 0), 2, 2, {"global rank 3", "0 × 2 + 1 = 1", "blocks"});
  auto v = torchrun(0, 0, 2, 2, 0);
  v.erase("MASTER_ADDR");
  expect_error(v, 2, 1, {"torchrun", "MASTER_ADDR is not set"});
}

// ---- Slurm ----

Vars slurm(int procid, int ntasks, int localid, int nodeid) {
  return {{"SLURM_PROCID", std::to_string(procid)},   {"SLURM_NTASKS", std::to_string(ntasks)},
          {"SLURM_LOCALID", std::to_string(localid)}, {"SLURM_NODEID", std::to_string(nodeid)},
          {"SLURM_NODELIST", "node[003-005,9],gpu1"}, {"SLURM_JOB_ID", "1234567"}};
}

TEST(ClusterEnvironment, Slurm) {
  auto e = detect(slurm(3, 4, 1, 1), 2, 2);
  EXPECT_EQ(e.kind, ClusterKind::kSlurm);
  EXPECT_EQ(e.global_rank, 3);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.main_address, "node003") << "first host of the expanded SLURM_NODELIST";
  EXPECT_EQ(e.main_port, 15000 + 4567) << "Lightning's port from the job id";
  EXPECT_FALSE(e.launches_workers);
}

TEST(ClusterEnvironment, SlurmOverridesAndFallbacks) {
  auto v = slurm(0, 2, 0, 0);
  v["MASTER_ADDR"] = "10.9.9.9";
  v["MASTER_PORT"] = "31000";
  auto e = detect(v, 2, 1);
  EXPECT_EQ(e.main_address, "10.9.9.9");
  EXPECT_EQ(e.main_port, 31000);
  v = slurm(0, 2, 0, 0);
  v.erase("SLURM_JOB_ID");
  v.erase("SLURM_NODELIST");
  v["SLURM_JOB_NODELIST"] = "a[1-2]";
  e = detect(v, 2, 1);
  EXPECT_EQ(e.main_port, 12910);
  EXPECT_EQ(e.main_address, "a1");
}

TEST(ClusterEnvironment, SlurmErrors) {
  expect_error(slurm(0, 1, 0, 0), 2, 1, {"slurm", "SLURM_NTASKS=1", "2 × 1 = 2"});
  // Cyclic placement: task 1 on node 1.
  expect_error(slurm(1, 4, 0, 1), 2, 2, {"global rank 1", "--distribution=block"});
  auto v = slurm(0, 2, 0, 0);
  v.erase("SLURM_NODELIST");
  expect_error(v, 2, 1, {"neither SLURM_NODELIST nor MASTER_ADDR"});
  v = slurm(0, 2, 0, 0);
  v["SLURM_NODELIST"] = "node[1-";
  expect_error(v, 2, 1, {"SLURM_NODELIST='node[1-'", "malformed"});
  v = slurm(0, 2, 0, 0);
  v.erase("SLURM_LOCALID");
  expect_error(v, 2, 1, {"SLURM_LOCALID is not set", "srun"});
}

TEST(SlurmNodelist, Expands) {
  using V = std::vector<std::string>;
  EXPECT_EQ(volt::expand_slurm_nodelist("node[003-005,9],gpu1"),
            (V{"node003", "node004", "node005", "node9", "gpu1"}));
  EXPECT_EQ(volt::expand_slurm_nodelist("host"), (V{"host"}));
  EXPECT_EQ(volt::expand_slurm_nodelist("a[1-2]b,c"), (V{"a1b", "a2b", "c"}));
  EXPECT_EQ(volt::expand_slurm_nodelist("r[1-2]-n[08-10]"),
            (V{"r1-n08", "r1-n09", "r1-n10", "r2-n08", "r2-n09", "r2-n10"}));
  EXPECT_EQ(volt::expand_slurm_nodelist("n[7]"), (V{"n7"}));
  // Space-separated, as Lightning's resolve_root_node_address reads it (this was one host).
  EXPECT_EQ(volt::expand_slurm_nodelist("host0 host1,n[2-3]"), (V{"host0", "host1", "n2", "n3"}));
}

TEST(SlurmNodelist, RejectsMalformed) {
  for (const char* bad :
       {"", "n[", "n]", "n[]", "n[5-3]", "n[a-b]", "a,,b", "a,", "n[1-2", "a  b", " a", "a "}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(volt::expand_slurm_nodelist(bad), volt::ConfigError);
  }
}

TEST(SlurmNodelist, WhatAVariableExpandsToIsBoundedAsItExpands) {
  const auto error_of = [](const std::string& list) -> std::string {
    try {
      volt::expand_slurm_nodelist(list);
    } catch (const volt::ConfigError& e) {
      return e.what();
    }
    return "<no ConfigError>";
  };
  // One group of 3,000 ranges of a million each (64 KB): every host was made (3 billion
  // strings) before the count was checked.
  std::string group = "n[0-1048574";
  for (int i = 0; i < 3000; ++i) group += ",0-1048574";
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(error_of(group + "]").find("too many hosts"), std::string::npos);
  // Text after a large group went onto every host: 1,000 hosts x 100,000 characters (100 MB;
  // a million hosts and 128 KiB would be 128 GB).
  EXPECT_NE(error_of("n[0-999]" + std::string(100000, 'x')).find("a host name over 255"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(250, 'x') + "[000000-000009]").find("a host name over 255"),
            std::string::npos);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 2.0);
  // Up to the bounds it expands.
  EXPECT_EQ(volt::expand_slurm_nodelist("n[0-1048575]").size(), size_t{1} << 20);
  EXPECT_EQ(volt::expand_slurm_nodelist(std::string(250, 'x') + "[00000-00009]").back(),
            std::string(250, 'x') + "00009");
}

// ---- Open MPI ----

Vars ompi(int rank, int size, int local, int local_size) {
  return {{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
          {"OMPI_COMM_WORLD_SIZE", std::to_string(size)},
          {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(local)},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(local_size)}};
}

TEST(ClusterEnvironment, OpenMpi) {
  auto e = detect(ompi(1, 2, 1, 2), 2, 1);
  EXPECT_EQ(e.kind, ClusterKind::kOpenMpi);
  EXPECT_EQ(e.global_rank, 1);
  EXPECT_EQ(e.main_address, "127.0.0.1");
  EXPECT_EQ(e.main_port, 29500);
  auto v = ompi(3, 4, 1, 2);
  v["MASTER_ADDR"] = "10.0.0.1";
  v["MASTER_PORT"] = "30000";
  e = detect(v, 2, 2);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.main_address, "10.0.0.1");
  EXPECT_EQ(e.main_port, 30000);
}

TEST(ClusterEnvironment, OpenMpiErrors) {
  expect_error(ompi(3, 4, 1, 2), 2, 2, {"openmpi", "MASTER_ADDR is not set", "several nodes"});
  expect_error(ompi(0, 4, 0, 4), 2, 2, {"OMPI_COMM_WORLD_LOCAL_SIZE=4", "devices=2"});
  auto v = ompi(1, 4, 0, 2);  // cyclic: rank 1 is local rank 0 of node 1
  v["MASTER_ADDR"] = "h";
  expect_error(v, 2, 2, {"global rank 1", "--map-by slot"});
}

// ---- MPICH and Intel MPI (Hydra) ----

Vars mpich(int rank, int size, int local, int local_size) {
  return {{"PMI_RANK", std::to_string(rank)},
          {"PMI_SIZE", std::to_string(size)},
          {"MPI_LOCALRANKID", std::to_string(local)},
          {"MPI_LOCALNRANKS", std::to_string(local_size)}};
}

TEST(ClusterEnvironment, Mpich) {
  auto e = detect(mpich(1, 2, 1, 2), 2, 1);
  EXPECT_EQ(e.kind, ClusterKind::kMpich);
  EXPECT_EQ(volt::to_string(e.kind), "mpich");
  EXPECT_EQ(e.global_rank, 1);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_FALSE(e.launches_workers) << "mpiexec started every process";
  EXPECT_EQ(e.main_address, "127.0.0.1");
  EXPECT_EQ(e.main_port, 29500);
  auto v = mpich(5, 6, 1, 2);
  v["MASTER_ADDR"] = "10.0.0.2";
  v["MASTER_PORT"] = "30001";
  e = detect(v, 2, 3);
  EXPECT_EQ(e.node_rank, 2);
  EXPECT_EQ(e.main_address, "10.0.0.2");
  EXPECT_EQ(e.main_port, 30001);
}

TEST(ClusterEnvironment, MpichErrors) {
  expect_error(mpich(3, 4, 1, 2), 2, 2, {"mpich", "MASTER_ADDR is not set", "several nodes"});
  expect_error(mpich(0, 4, 0, 4), 2, 2, {"MPI_LOCALNRANKS=4", "devices=2", "mpiexec -ppn 2"});
  expect_error(mpich(4, 4, 0, 2), 2, 2, {"PMI_RANK=4 is not below PMI_SIZE=4"});
  expect_error(mpich(0, 3, 0, 2), 2, 1, {"mpich: PMI_SIZE=3 but devices × num_nodes"});
  auto v = mpich(1, 4, 0, 2);  // round-robin: rank 1 is local rank 0 of node 1
  v["MASTER_ADDR"] = "h";
  expect_error(v, 2, 2, {"global rank 1", "mpiexec -ppn 2"});
  Vars no_local = mpich(0, 2, 0, 2);
  no_local.erase("MPI_LOCALRANKID");
  expect_error(no_local, 2, 1, {"MPI_LOCALRANKID", "Hydra"});
}

TEST(ClusterEnvironment, PrecedenceOpenMpiOverMpich) {
  // Open MPI's PMIx may set PMI_RANK too: its own variables decide.
  auto v = ompi(1, 2, 1, 2);
  auto m = mpich(1, 2, 1, 2);
  v.insert(m.begin(), m.end());
  EXPECT_EQ(detect(v, 2, 1).kind, ClusterKind::kOpenMpi);
}

// Lightning's SLURMEnvironment: in an interactive allocation (SLURM_JOB_NAME bash or
// interactive) the program was not started by srun; it is a plain process, which starts its
// local workers itself.
TEST(ClusterEnvironment, AnInteractiveSlurmShellIsPlain) {
  for (const char* name : {"bash", "interactive"}) {
    SCOPED_TRACE(name);
    auto v = slurm(0, 1, 0, 0);
    v["SLURM_JOB_NAME"] = name;
    auto e = detect(v, 2, 1);
    EXPECT_EQ(e.kind, ClusterKind::kPlain);
    EXPECT_TRUE(e.launches_workers);
    EXPECT_EQ(e.world_size, 2);
  }
  auto batch = slurm(0, 2, 0, 0);
  batch["SLURM_JOB_NAME"] = "train";
  EXPECT_EQ(detect(batch, 2, 1).kind, ClusterKind::kSlurm);
}

TEST(ClusterEnvironment, PrecedenceTorchrunOverSlurm) {
  auto v = slurm(0, 2, 0, 0);
  auto t = torchrun(1, 1, 2, 2, 0);
  v.insert(t.begin(), t.end());
  EXPECT_EQ(detect(v, 2, 1).kind, ClusterKind::kTorchrun);
}

TEST(ClusterEnvironment, PrintsEveryField) {
  std::ostringstream os;
  os << detect({}, 2);
  EXPECT_NE(os.str().find("kind=plain"), std::string::npos);
  EXPECT_NE(os.str().find("launches_workers=1"), std::string::npos);
}

}  // namespace
