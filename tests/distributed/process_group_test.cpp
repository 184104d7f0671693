#include "volt/distributed/process_group.h"
#include "requires.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "build_paths.h"
#include "distributed/detail/async_collective.h"
#include "distributed/detail/net.h"
#include "processes.h"
#include "volt/core/errors.h"

namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using volt_test::Process;

const std::string kWorker = volt_test::dist_worker();
constexpr milliseconds kWait{60000};  // bound on any worker run in these tests

volt::ClusterEnvironment single(int port) {
  volt::ClusterEnvironment env;
  env.main_port = port;
  return env;
}

// Checks that every rank exited `code` and printed every phrase.
void expect_all(std::vector<std::unique_ptr<Process>>& ranks, int code,
                std::initializer_list<std::string> phrases) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(ranks[r]->exit_code(kWait), code) << ranks[r]->output();
    for (const auto& p : phrases) {
      EXPECT_NE(ranks[r]->output().find(p), std::string::npos) << "'" << p << "' in\n"
                                                               << ranks[r]->output();
    }
  }
}

// ---- backend resolution ----

TEST(ResolveBackend, AutoIsGlooOnCpu) {
  VOLT_REQUIRE_GLOO();
  EXPECT_EQ(volt::resolve_backend("auto", c10::DeviceType::CPU), volt::Backend::kGloo);
  EXPECT_EQ(volt::resolve_backend("gloo", c10::DeviceType::CPU), volt::Backend::kGloo);
  EXPECT_EQ(volt::to_string(volt::Backend::kNccl), "nccl");
}

TEST(ResolveBackend, NcclOnCpuIsNotAvailable) {
  try {
    volt::resolve_backend("nccl", c10::DeviceType::CPU);
    FAIL() << "no error";
  } catch (const volt::NotAvailable& e) {
    EXPECT_NE(std::string(e.what()).find("\"nccl\" needs CUDA tensors but the device is cpu"),
              std::string::npos)
        << e.what();
  }
}

TEST(ResolveBackend, UnknownName) {
  try {
    volt::resolve_backend("mpi", c10::DeviceType::CPU);
    FAIL() << "no error";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown process group backend \"mpi\""),
              std::string::npos);
  }
}

TEST(ProcessGroup, NcclBackendWithoutAGpuOrNcclFailsAtConstruction) {
  if (volt_test::nccl_unavailable_reason().empty()) {
    GTEST_SKIP() << "this machine runs NCCL (tests/distributed/nccl_test.cpp tests it)";
  }
  EXPECT_THROW(volt::ProcessGroup(single(volt::detail::find_free_port()),
                                  volt::ProcessGroupOptions().backend(volt::Backend::kNccl)),
               volt::NotAvailable);
}

// ---- one process (world size 1) in this test process ----

TEST(ProcessGroup, WorldOfOneRunsEveryCollective) {
  VOLT_REQUIRE_GLOO();
  const int port = volt::detail::find_free_port();
  volt::ProcessGroup pg(single(port));
  EXPECT_EQ(pg.rank(), 0);
  EXPECT_EQ(pg.world_size(), 1);
  EXPECT_FALSE(volt::detail::release_port(port)) << "the group hosting the store let the hold go";
  auto x = at::arange(4, at::kFloat);
  EXPECT_TRUE(pg.all_reduce(x, volt::Reduce::kMean).equal(x));
  EXPECT_EQ(pg.all_gather(x).size(), 1u);
  EXPECT_TRUE(pg.reduce_scatter(x).equal(x));
  EXPECT_EQ(pg.reduce_scatter(at::empty({0, 3})).sizes(), (std::vector<int64_t>{0, 3}));
  EXPECT_TRUE(
      pg.reduce_scatter(x.to(at::kBFloat16), volt::Reduce::kMean).equal(x.to(at::kBFloat16)));
  pg.barrier();
  EXPECT_TRUE(pg.all_of(true));
  EXPECT_FALSE(pg.any_of(false));
}

TEST(ProcessGroup, RunOnLeadersChecksItsLeaders) {
  VOLT_REQUIRE_GLOO();
  volt::ProcessGroup pg(single(volt::detail::find_free_port()));
  int runs = 0;
  pg.run_on_leaders("prepare", {0}, [&] { ++runs; });
  EXPECT_EQ(runs, 1);
  const auto refused = [&](std::vector<int64_t> leaders, const std::string& phrase) {
    try {
      pg.run_on_leaders("prepare", leaders, [&] { ++runs; });
      ADD_FAILURE() << "no error for " << leaders.size() << " leaders";
    } catch (const volt::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
    }
  };
  refused({1}, "[ProcessGroup] prepare: leaders must be ascending ranks in [0, 1), got rank 1");
  refused({0, 0}, "got rank 0 at position 1");
  refused({-1}, "got rank -1 at position 0");
  refused({}, "no leader to run it");
  EXPECT_EQ(runs, 1) << "a refused call runs nothing";
  pg.run_on_leaders("prepare", {0}, [&] { ++runs; });  // the group is still usable
  EXPECT_EQ(runs, 2);
}

// Three ranks: the whole group's leaders, a subgroup's leader nested in them, work longer than
// the timeout (run_leaders in dist_worker.cpp).
TEST(ProcessGroup, RunOnLeadersOnTheGroupAndOnASubgroup) {
  VOLT_REQUIRE_GLOO();
  auto ranks = volt_test::start_local_ranks(
      kWorker, {"leaders", "--devices", "3", "--timeout-ms", "3000"}, 3);
  expect_all(ranks, 0, {"leaders ok"});
  for (int r : {1, 2}) {
    EXPECT_NE(ranks[r]->output().find("pair rounds ok"), std::string::npos) << ranks[r]->output();
  }
}

void count_sigpipe(int) {}

// A write to a dead peer's socket must fail the collective, not kill the survivor with SIGPIPE
// (whose default action ends the process; Python ignores it, a C++ program does not).
TEST(ProcessGroup, AWriteToAClosedSocketFailsInsteadOfKillingTheProcess) {
  VOLT_REQUIRE_GLOO();
  struct sigaction custom {};
  custom.sa_handler = &count_sigpipe;
  sigemptyset(&custom.sa_mask);
  ASSERT_EQ(::sigaction(SIGPIPE, &custom, nullptr), 0);
  { volt::ProcessGroup pg(single(volt::detail::find_free_port())); }
  struct sigaction now {};
  ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, &count_sigpipe) << "the program's own handler is kept";

  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ASSERT_EQ(::sigaction(SIGPIPE, &dfl, nullptr), 0);
  volt::ProcessGroup pg(single(volt::detail::find_free_port()));
  ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, SIG_IGN);
  // What Gloo meets when a peer died: without the group's setting this write ends the test
  // process with SIGPIPE.
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  ::close(fds[1]);
  const char byte = 0;
  EXPECT_EQ(::write(fds[0], &byte, 1), -1);
  EXPECT_EQ(errno, EPIPE);
  ::close(fds[0]);
}

TEST(ProcessGroup, ReceivedRowsAreReducedInRankOrder) {
  // What reduce_scatter does with the rows the all-to-all brought (row r from rank r). In fp32
  // 1e8 + 1 rounds to 1e8: rank order gives ((1e8 + 1) - 1e8) + 1 = 1, any order that adds the
  // ones first would give 2 or 0, so a result of 1 shows the order.
  auto rows = torch::tensor({{1e8f, 2.0f}, {1.0f, -5.0f}, {-1e8f, 7.0f}, {1.0f, 3.0f}});
  auto sum = volt::detail::reduce_rows(rows, volt::Reduce::kSum);
  EXPECT_EQ(sum[0].item<float>(), 1.0f);
  EXPECT_EQ(sum[1].item<float>(), 7.0f);
  EXPECT_TRUE(
      volt::detail::reduce_rows(rows, volt::Reduce::kMin).equal(torch::tensor({-1e8f, -5.0f})));
  EXPECT_TRUE(
      volt::detail::reduce_rows(rows, volt::Reduce::kMax).equal(torch::tensor({1e8f, 7.0f})));
  // The input is left as it was (it is the received buffer, not the result).
  EXPECT_EQ(rows[0][0].item<float>(), 1e8f);
  // bf16 rows (sent as 16 bits) are summed in fp32: 256 + 1 + 1 is 258 there, while a bf16 sum
  // rounds each 256 + 1 back to 256 (bf16 has 8 significant bits).
  auto narrow = torch::tensor({{256.0f}, {1.0f}, {1.0f}}).to(torch::kBFloat16);
  auto wide = volt::detail::reduce_rows(narrow, volt::Reduce::kSum);
  EXPECT_EQ(wide.scalar_type(), torch::kFloat);
  EXPECT_EQ(wide[0].item<float>(), 258.0f);
  EXPECT_TRUE(volt::detail::reduce_rows(narrow, volt::Reduce::kMax).equal(torch::tensor({256.0f})));
  EXPECT_TRUE(volt::detail::reduce_rows(narrow, volt::Reduce::kMin).equal(torch::tensor({1.0f})));
}

TEST(ProcessGroup, MasterPortInUseOnRankZero) {
  VOLT_REQUIRE_GLOO();
  // A listening socket holds the port, as another program would.
  int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_any;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin6_port);
  try {
    volt::ProcessGroup pg(single(port), volt::ProcessGroupOptions().timeout(seconds(5)));
    ADD_FAILURE() << "no error";
  } catch (const volt::ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("MASTER_PORT=" + std::to_string(port) + " is already in use"),
              std::string::npos)
        << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  ::close(fd);
}

TEST(ProcessGroup, MasterAddrUnreachableNamesAddressAndTimeout) {
  VOLT_REQUIRE_GLOO();
  // Nothing listens on this port: rank 1 retries until its timeout.
  volt::ClusterEnvironment env;
  env.world_size = 2;
  env.global_rank = 1;
  env.local_rank = 1;
  env.local_world_size = 2;
  env.main_port = volt::detail::find_free_port();
  const auto start = std::chrono::steady_clock::now();
  try {
    volt::ProcessGroup pg(env, volt::ProcessGroupOptions().timeout(milliseconds(1500)));
    ADD_FAILURE() << "no error";
  } catch (const volt::DistributedError& e) {
    const std::string msg = e.what();
    EXPECT_NE(
        msg.find("could not reach the rendezvous store at MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                 std::to_string(env.main_port) + " within 1.5 s"),
        std::string::npos)
        << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(20)) << "bounded by the timeout";
}

TEST(ProcessGroup, MissingRanksAreNamedAfterTheTimeout) {
  VOLT_REQUIRE_GLOO();
  volt::ClusterEnvironment env = single(volt::detail::find_free_port());
  env.world_size = 3;
  env.local_world_size = 3;
  try {
    volt::ProcessGroup pg(env, volt::ProcessGroupOptions().timeout(milliseconds(800)));
    ADD_FAILURE() << "no error";
  } catch (const volt::DistributedError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks 1, 2 of 3 did not join the rendezvous"),
              std::string::npos)
        << e.what();
  }
}

// A worker that dies before it joins (its launching process reports it to the store) fails the
// rendezvous at once, with its exit status: the others waited out the whole timeout and said
// only that it "did not join".
TEST(ProcessGroup, AWorkerLostBeforeJoiningFailsTheRendezvousAtOnceSayingHow) {
  VOLT_REQUIRE_GLOO();
  volt::ClusterEnvironment env = single(volt::detail::find_free_port());
  env.world_size = 2;
  env.local_world_size = 2;
  std::thread launcher([env] {
    std::this_thread::sleep_for(milliseconds(300));
    volt::ClusterEnvironment worker = env;
    worker.global_rank = 1;
    volt::report_lost_rank(worker, "rank 1 (pid 7) exited with code 3", seconds(5));
  });
  const auto start = std::chrono::steady_clock::now();
  std::string what = "<no error>";
  try {
    volt::ProcessGroup pg(env, volt::ProcessGroupOptions().timeout(seconds(30)));
  } catch (const volt::DistributedError& e) {
    what = e.what();
  }
  launcher.join();
  EXPECT_NE(what.find("rank 1 of 2 did not join the rendezvous"), std::string::npos) << what;
  EXPECT_NE(what.find("lost: rank 1 (pid 7) exited with code 3"), std::string::npos) << what;
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(10)) << "not the 30 s timeout";
}

// A store rank 0 kept from a group serves the job's next attempt (elastic restarts): the group of
// that attempt joins it (a new server would find the port taken: the kept one still holds it),
// and each attempt's keys are its own.
TEST(ProcessGroup, AKeptStoreServesTheNextAttemptUnderKeysOfItsOwn) {
  VOLT_REQUIRE_GLOO();
  volt::ClusterEnvironment env = single(volt::detail::find_free_port());
  const auto opts = volt::ProcessGroupOptions().timeout(seconds(5));
  std::shared_ptr<volt::RendezvousStore> kept;
  {
    volt::ProcessGroup first(env, opts);
    kept = first.rendezvous_store();
    ASSERT_NE(kept, nullptr);
  }
  EXPECT_THROW(volt::ProcessGroup(env, opts), volt::ConfigError) << "the kept store still serves";
  env.restart_count = 1;
  {
    volt::ProcessGroup second(env, volt::ProcessGroupOptions(opts).store(kept));
    EXPECT_EQ(second.rendezvous_store(), kept);
    EXPECT_TRUE(second.all_of(true));
  }
  try {
    volt::ProcessGroup again(env, volt::ProcessGroupOptions(opts).store(kept));
    ADD_FAILURE() << "attempt 1's rank 0 joined twice";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("two processes claim global rank 0"), std::string::npos)
        << e.what();
  }
  env.restart_count = 2;
  volt::ProcessGroup third(env, volt::ProcessGroupOptions(opts).store(kept));
  EXPECT_TRUE(third.all_of(true));
}

// A launching process reports a worker that died after rank 0 ended the run and its store: the
// report waits for the store within its bound and gives up silently, without c10d's client
// printing a "socket has timed out" line for every attempt to connect (once tens of lines).
TEST(ProcessGroup, AReportToAStoreThatIsGoneGivesUpQuietlyWithinItsBound) {
  volt::ClusterEnvironment env = single(volt::detail::find_free_port());  // nothing listens
  env.world_size = 2;
  env.global_rank = 1;
  testing::internal::CaptureStderr();
  const auto start = std::chrono::steady_clock::now();
  volt::report_lost_rank(env, "rank 1 (pid 1) was killed by SIGKILL", milliseconds(1500));
  const auto took = std::chrono::steady_clock::now() - start;
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "");
  EXPECT_GE(took, milliseconds(1400));  // it waited for the store to come up
  EXPECT_LT(took, seconds(4));
}

// ---- real processes over loopback ----

TEST(ProcessGroup, CollectivesTwoRanksStartedExternally) {
  VOLT_REQUIRE_GLOO();
  auto ranks = volt_test::start_local_ranks(kWorker, {"collectives", "--devices", "2"}, 2);
  expect_all(ranks, 0, {"collectives ok", "plain"});
}

TEST(ProcessGroup, CollectivesUnderTorchrunVariables) {
  VOLT_REQUIRE_GLOO();
  const int port = volt::detail::find_free_port();
  auto ranks = volt_test::start_ranks(kWorker, {"collectives", "--devices", "2"}, 2, [&](int r) {
    return std::map<std::string, std::string>{{"RANK", std::to_string(r)},
                                              {"LOCAL_RANK", std::to_string(r)},
                                              {"WORLD_SIZE", "2"},
                                              {"LOCAL_WORLD_SIZE", "2"},
                                              {"GROUP_RANK", "0"},
                                              {"MASTER_ADDR", "127.0.0.1"},
                                              {"MASTER_PORT", std::to_string(port)}};
  });
  expect_all(ranks, 0, {"collectives ok", "torchrun"});
}

TEST(ProcessGroup, CollectivesUnderSlurmVariables) {
  VOLT_REQUIRE_GLOO();
  const int port = volt::detail::find_free_port();
  auto ranks = volt_test::start_ranks(kWorker, {"collectives", "--devices", "2"}, 2, [&](int r) {
    return std::map<std::string, std::string>{{"SLURM_PROCID", std::to_string(r)},
                                              {"SLURM_LOCALID", std::to_string(r)},
                                              {"SLURM_NTASKS", "2"},
                                              {"SLURM_NODEID", "0"},
                                              {"SLURM_NODELIST", "localhost"},
                                              {"SLURM_JOB_ID", "4242"},
                                              {"MASTER_PORT", std::to_string(port)}};
  });
  expect_all(ranks, 0, {"collectives ok", "slurm"});
}

TEST(ProcessGroup, CollectivesUnderOpenMpiVariables) {
  VOLT_REQUIRE_GLOO();
  const int port = volt::detail::find_free_port();
  auto ranks = volt_test::start_ranks(kWorker, {"collectives", "--devices", "3"}, 3, [&](int r) {
    return std::map<std::string, std::string>{{"OMPI_COMM_WORLD_RANK", std::to_string(r)},
                                              {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(r)},
                                              {"OMPI_COMM_WORLD_SIZE", "3"},
                                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
                                              {"MASTER_PORT", std::to_string(port)}};
  });
  expect_all(ranks, 0, {"collectives ok", "openmpi"});
}

// TORCH_DISTRIBUTED_DEBUG=DETAIL (PyTorch's switch): ranks whose collective calls differ all get
// one ValueError naming every rank's call, and the group stays usable. Without it, a broadcast
// into a smaller buffer aborts the receiving rank inside Gloo.
TEST(ProcessGroup, DetailDebugNamesRanksWhoseCallsDiffer) {
  VOLT_REQUIRE_GLOO();
  const int port = volt::detail::find_free_port();
  auto ranks = volt_test::start_ranks(kWorker, {"call-checks", "--devices", "2"}, 2, [&](int r) {
    auto env = volt_test::plain_rank_env(r, 2, port);
    env["TORCH_DISTRIBUTED_DEBUG"] = r == 0 ? "DETAIL" : "detail";
    return env;
  });
  expect_all(
      ranks, 0,
      {"call error: [ProcessGroup] the ranks' collective calls differ (TORCH_DISTRIBUTED_DEBUG="
       "DETAIL): rank 0: broadcast from rank 0 of 1 tensor, the first [6] Float, 6 elements in "
       "all; rank 1: broadcast from rank 0 of 1 tensor, the first [1] Float, 1 element in all; "
       "every rank must call the same collectives in the same order, with tensors of the same "
       "shapes and dtypes.",
       "rank 0: all_reduce (sum) of 1 tensor, the first [2, 3] Float, 6 elements in all; rank 1: "
       "all_reduce (sum) of 1 tensor, the first [2, 3] Double",
       "rank 0: barrier; rank 1: all_reduce (max) of 1 tensor",
       "rank 0: all_gather of 1 tensor, the first [2, 2] Float, 4 elements in all; rank 1: "
       "all_gather of 1 tensor, the first [2, 5] Float, 10 elements in all;",
       "rank 0: all_gather of 1 tensor, the first [3] Float, 3 elements in all; rank 1: "
       "all_gather of 1 tensor, the first [4] Float, 4 elements in all;",
       "rank 0: reduce_scatter (sum) of 1 tensor, the first [2, 2] Float, 4 elements in all; "
       "rank 1: reduce_scatter (max) of 1 tensor",
       "call checks ok"});
  // Any case, as PyTorch; an unknown level fails every rank before the rendezvous.
  const int bad_port = volt::detail::find_free_port();
  auto bad = volt_test::start_ranks(kWorker, {"collectives", "--devices", "2"}, 2, [&](int r) {
    auto env = volt_test::plain_rank_env(r, 2, bad_port);
    env["TORCH_DISTRIBUTED_DEBUG"] = "LOUD";
    return env;
  });
  expect_all(bad, 3,
             {"error: [ProcessGroup] TORCH_DISTRIBUTED_DEBUG=LOUD is not a level; use OFF, INFO "
              "or DETAIL (as PyTorch)."});
}

TEST(ProcessGroup, RanksWithDifferentConfigsFailNamingThem) {
  VOLT_REQUIRE_GLOO();
  const int port = volt::detail::find_free_port();
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(
        std::make_unique<Process>(kWorker,
                                  std::vector<std::string>{"collectives", "--devices", "3",
                                                           "--config-hash", r == 1 ? "b7" : "a1"},
                                  volt_test::plain_rank_env(r, 3, port)));
  }
  expect_all(ranks, 3,
             {"[ProcessGroup] ranks' configurations differ: ranks 0, 2: world_size=3 "
              "backend=gloo config_hash=a1 call_checks=off; rank 1: world_size=3 backend=gloo "
              "config_hash=b7 call_checks=off"});
  // Call checks on one rank only (TORCH_DISTRIBUTED_DEBUG=DETAIL there): its extra all-gather
  // before each collective met the other's collective (a Gloo size abort or a hang).
  const int port2 = volt::detail::find_free_port();
  auto mixed = volt_test::start_ranks(kWorker, {"collectives", "--devices", "2"}, 2, [&](int r) {
    auto env = volt_test::plain_rank_env(r, 2, port2);
    if (r == 1) env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL";
    return env;
  });
  expect_all(mixed, 3,
             {"[ProcessGroup] ranks' configurations differ: rank 0: world_size=2 backend=gloo "
              "config_hash=same call_checks=off; rank 1: world_size=2 backend=gloo "
              "config_hash=same call_checks=on (TORCH_DISTRIBUTED_DEBUG=DETAIL)"});
}

// A second process with rank 1 arriving while the job runs fails at once, naming the rank. (When
// it arrives during the rendezvous, every rank fails with the same message; which of the two
// happens first is a race between processes, so this test builds the late case.)
TEST(ProcessGroup, SecondProcessClaimingARankFails) {
  VOLT_REQUIRE_GLOO();
  const int port = volt::detail::find_free_port();
  auto ranks = volt_test::start_ranks(
      kWorker, {"hold", "--devices", "2", "--victim", "1", "--timeout-ms", "60000"}, 2,
      [&](int r) { return volt_test::plain_rank_env(r, 2, port); });
  ASSERT_TRUE(ranks[1]->wait_for_output("victim waiting", kWait)) << ranks[1]->output();
  Process dup(kWorker, {"collectives", "--devices", "2"}, volt_test::plain_rank_env(1, 2, port));
  EXPECT_EQ(dup.exit_code(kWait), 3) << dup.output();
  EXPECT_NE(dup.output().find("[ProcessGroup] two processes claim global rank 1; give every "
                              "process its own rank"),
            std::string::npos)
      << dup.output();
}

// A rank that stops answering: the others' collective fails after the timeout, and the process
// still exits (destruction does not hang on the pending operation).
TEST(ProcessGroup, HungPeerTimesOut) {
  VOLT_REQUIRE_GLOO();
  const int port = volt::detail::find_free_port();
  const std::vector<std::string> args{"hold", "--devices",    "2",   "--victim",
                                      "1",    "--timeout-ms", "3000"};
  Process rank0(kWorker, args, volt_test::plain_rank_env(0, 2, port));
  ASSERT_TRUE(rank0.wait_for_output("rank 0: pid", kWait)) << rank0.output();
  Process rank1(kWorker, args, volt_test::plain_rank_env(1, 2, port));
  ASSERT_TRUE(rank1.wait_for_output("victim waiting", kWait)) << rank1.output();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(rank0.exit_code(kWait), 3) << rank0.output();
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(30));
  EXPECT_NE(rank0.output().find("[ProcessGroup] all_reduce timed out after 3 s on rank 0 of 2"),
            std::string::npos)
      << rank0.output();
}

// A peer killed mid-collective (started externally, so nobody reports which one): the survivor
// fails at once, without waiting for the timeout.
TEST(ProcessGroup, DeadPeerFailsFast) {
  VOLT_REQUIRE_GLOO();
  auto ranks = volt_test::start_local_ranks(
      kWorker, {"hold", "--devices", "2", "--victim", "1", "--timeout-ms", "60000"}, 2);
  ASSERT_TRUE(ranks[1]->wait_for_output("victim waiting", kWait)) << ranks[1]->output();
  ASSERT_TRUE(ranks[0]->wait_for_output("entering all_reduce", kWait)) << ranks[0]->output();
  ::kill(ranks[1]->pid(), SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(ranks[0]->exit_code(kWait), 3) << ranks[0]->output();
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(20))
      << "well before the 60 s timeout";
  EXPECT_NE(ranks[0]->output().find("[ProcessGroup] all_reduce failed on rank 0 of 2"),
            std::string::npos)
      << ranks[0]->output();
}

}  // namespace
