#pragma once
// Training jobs of tests/support/ddp_worker.cpp (and the other workers) for the strategy tests:
// run one (a plain process launching its ranks), its single-process reference on the global
// batch, and compare the flat weights every rank wrote.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <string>
#include <vector>

#include "build_paths.h"
#include "processes.h"

namespace volt_test {

inline const std::string kTrainingWorker = volt_test::ddp_worker();

/// Worker flags `a` then `b`.
inline std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline torch::Tensor load_flat(const std::string& path) {
  torch::Tensor t;
  torch::load(t, path);
  return t;
}

struct Job {
  std::string output;
  int code = 0;
};

/// Runs worker `exe` with `args` to its end (killed after `timeout`).
inline Job run_job(const std::string& exe, const std::vector<std::string>& args,
                   std::chrono::milliseconds timeout = std::chrono::seconds(180)) {
  Process p(exe, args);
  Job j;
  j.code = p.exit_code(timeout);
  j.output = p.output();
  return j;
}

inline Job run_job(const std::vector<std::string>& args,
                   std::chrono::milliseconds timeout = std::chrono::seconds(180)) {
  return run_job(kTrainingWorker, args, timeout);
}

/// The kill-and-resume tests' first two runs: the job `common` uninterrupted into root/a (out
/// root/a/w), then again into root/b with rank 1 SIGKILLed at batch 5 (the survivor gives up
/// after 20 s). Fails the test unless they exit 0 and 1; resume from root/b/every_batch.ckpt.
inline void run_full_then_killed(const std::string& root, const std::vector<std::string>& common) {
  const Job full = run_job(cat({"--root", root + "/a", "--out", root + "/a/w"}, common));
  ASSERT_EQ(full.code, 0) << full.output;
  const Job killed = run_job(cat({"--root", root + "/b", "--out", root + "/b/w", "--die-rank", "1",
                                  "--die-batch", "5", "--timeout", "20"},
                                 common),
                             std::chrono::seconds(60));
  ASSERT_EQ(killed.code, 1) << killed.output;
  // Exit code 1 is also any other error: the run must have died where it was told to.
  ASSERT_NE(killed.output.find("rank 1 dies at step"), std::string::npos) << killed.output;
}

/// The same model, data and seed trained by one process on the global batch (`extra` are more
/// worker flags, e.g. the optimizer).
inline torch::Tensor single_process_reference(const std::string& root, int64_t global_batch,
                                              int64_t epochs, int64_t accum, bool tied,
                                              const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{"--root",    root,
                                "--out",     root + "/single",
                                "--devices", "1",
                                "--batch",   std::to_string(global_batch),
                                "--epochs",  std::to_string(epochs),
                                "--accum",   std::to_string(accum),
                                "--tied",    tied ? "1" : "0"};
  args.insert(args.end(), extra.begin(), extra.end());
  Job j = run_job(args, std::chrono::seconds(120));
  EXPECT_EQ(j.code, 0) << j.output;
  return load_flat(root + "/single.rank0.pt");
}

/// Every rank's weights equal rank 0's and the reference to fp32 round-off.
inline void expect_ranks_equal_reference(const std::string& prefix, int world,
                                         const torch::Tensor& reference, double rtol = 1e-5,
                                         double atol = 1e-6) {
  const auto r0 = load_flat(prefix + ".rank0.pt");
  for (int r = 0; r < world; ++r) {
    const auto w = load_flat(prefix + ".rank" + std::to_string(r) + ".pt");
    EXPECT_TRUE(torch::equal(w, r0)) << "rank " << r << " differs from rank 0";
    EXPECT_TRUE(torch::allclose(w, reference, rtol, atol))
        << "rank " << r << " max diff " << (w - reference).abs().max().item<double>();
  }
}

}  // namespace volt_test
