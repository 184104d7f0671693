// Tensor-parallel inference (DeepSpeedStrategy tensor_parallel, TensorParallelEngine): 2 and 4
// real processes over Gloo predict what one process predicts (fp32 round-off) for an MLP, the
// demo TransformerNet (heads split) and an embedding + blocks model configured three ways (plan,
// DeepSpeed injection_policy, DeepSpeed JSON); each rank holds about 1/N of the split weights,
// and the module leaves predict whole. Plus every configuration error.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <regex>

#include "build_paths.h"
#include "models.h"
#include "processes.h"
#include "requires.h"
#include "tiny.h"
#include "training_jobs.h"
#include "volt/accelerators/cpu.h"
#include "volt/distributed/tensor_parallel.h"
#include "volt/strategies/deepspeed.h"
#include "volt/strategies/deepspeed_config.h"

namespace {

using volt::ConfigError;

using volt_test::Job;

Job run_tp(const std::vector<std::string>& args) {
  return volt_test::run_job(volt_test::tp_worker(), args, std::chrono::seconds(120));
}

torch::Tensor load(const std::string& path) {
  return volt_test::load_flat(path);
}

int64_t field(const std::string& out, int rank, const std::string& name) {
  std::smatch m;
  const std::regex re("rank " + std::to_string(rank) + " done.* " + name + "=([0-9]+)");
  if (!std::regex_search(out, m, re)) return -1;
  return std::stoll(m[1]);
}

/// Runs the single-process reference and the tp-rank job; every rank's predictions equal the
/// reference to fp32 round-off and each other exactly; returns the job's output.
std::string expect_tp_matches(const std::string& model, const std::string& form, int tp,
                              double tol = 1e-5, std::vector<std::string> extra = {}) {
  volt_test::TempDir dir;
  std::vector<std::string> ref{"--root", dir.path,    "--out", dir / "ref", "--model",
                               model,    "--devices", "1",     "--form",    "none"};
  Job r = run_tp(ref);
  EXPECT_EQ(r.code, 0) << r.output;
  std::vector<std::string> args{
      "--root",    dir.path,           "--out", dir / "tp",         "--model", model,
      "--devices", std::to_string(tp), "--tp",  std::to_string(tp), "--form",  form};
  args.insert(args.end(), extra.begin(), extra.end());
  Job j = run_tp(args);
  EXPECT_EQ(j.code, 0) << j.output;
  if (r.code != 0 || j.code != 0) return j.output;
  const auto reference = load(dir / "ref.rank0.pt");
  const auto r0 = load(dir / "tp.rank0.pt");
  for (int k = 0; k < tp; ++k) {
    const auto p = load(dir / ("tp.rank" + std::to_string(k) + ".pt"));
    EXPECT_TRUE(torch::equal(p, r0)) << "rank " << k << " differs from rank 0";
    EXPECT_EQ(p.sizes(), reference.sizes());
    EXPECT_TRUE(torch::allclose(p, reference, tol, tol))
        << model << " tp=" << tp << " rank " << k << " max diff "
        << (p - reference).abs().max().item<double>();
    EXPECT_EQ(field(j.output, k, "restored"), 1) << "rank " << k << " left predict split\n"
                                                 << j.output;
  }
  return j.output;
}

// Per-rank weight bytes: the split layers' share is 1/N (biases of row-parallel layers and
// everything not split stay whole), so the total is between full/N and full.
void expect_bytes(const std::string& out, int tp, int64_t expected_rank_bytes) {
  for (int k = 0; k < tp; ++k) {
    EXPECT_EQ(field(out, k, "param_bytes"), expected_rank_bytes) << out;
  }
}

// join_shards (what consolidating a model_parallel checkpoint folder joins with, and
// gather_whole after its all-gather) undoes the split: rows or columns in rank order, and a packed
// [q; k; v] weight whose every third is split (rank r holds rows r*n..(r+1)*n of each third).
TEST(TensorParallel, JoinShardsUndoesEachSplit) {
  using Layout = volt::TensorParallelEngine::SplitLayout;
  const at::Tensor whole = torch::arange(12 * 4, torch::kFloat).reshape({12, 4});
  for (int64_t tp : {2, 3}) {
    std::vector<at::Tensor> rows;
    for (int64_t r = 0; r < tp; ++r) rows.push_back(whole.chunk(tp, 0)[r]);
    EXPECT_TRUE(at::equal(volt::TensorParallelEngine::join_shards(rows, Layout{0, false}), whole))
        << tp;
  }
  std::vector<at::Tensor> cols{whole.narrow(1, 0, 2), whole.narrow(1, 2, 2)};
  EXPECT_TRUE(at::equal(volt::TensorParallelEngine::join_shards(cols, Layout{1, false}), whole));
  // Packed at 2 ranks: each third has 4 rows, 2 per rank.
  std::vector<at::Tensor> packed;
  for (int64_t r = 0; r < 2; ++r) {
    std::vector<at::Tensor> mine;
    for (int64_t third = 0; third < 3; ++third)
      mine.push_back(whole.narrow(0, third * 4 + r * 2, 2));
    packed.push_back(torch::cat(mine));
  }
  EXPECT_TRUE(at::equal(volt::TensorParallelEngine::join_shards(packed, Layout{0, true}), whole));
  // Read as plain rows, the same shards give another tensor: the layout matters.
  EXPECT_FALSE(at::equal(volt::TensorParallelEngine::join_shards(packed, Layout{0, false}), whole));
  EXPECT_THROW(
      volt::TensorParallelEngine::join_shards({whole, whole.narrow(0, 0, 6)}, Layout{0, false}),
      volt::ValueError);
  EXPECT_THROW(volt::TensorParallelEngine::join_shards({}, Layout{0, false}), volt::ValueError);
  EXPECT_THROW(volt::TensorParallelEngine::join_shards({whole}, Layout{2, false}),
               volt::ValueError);
}

TEST(TensorParallel, MlpTwoAndFourRanksPredictLikeOneProcess) {
  VOLT_REQUIRE_GLOO();
  // MlpNet{64, 48}: fc0 784->64 colwise, fc1 64->48 rowwise, out 48->10 whole.
  const int64_t fc0 = (784 * 64 + 64) * 4, fc1w = 64 * 48 * 4, fc1b = 48 * 4,
                out = (48 * 10 + 10) * 4;
  for (int tp : {2, 4}) {
    const std::string o = expect_tp_matches("mlp", "plan", tp);
    expect_bytes(o, tp, fc0 / tp + fc1w / tp + fc1b + out);
    EXPECT_EQ(field(o, 0, "full_bytes"), fc0 + fc1w + fc1b + out);
    EXPECT_EQ(field(o, 0, "layers"), 2);
  }
}

TEST(TensorParallelTraining, TwoAndFourRanksTrainLikeOneProcess) {
  VOLT_REQUIRE_GLOO();
  // tests/support/dist_worker.cpp, run_tp_train: an MLP (input gradient through "f", a
  // row-parallel layer on a whole input) and a small language model (vocabulary-split
  // embedding, heads split by packed q/k/v, row-parallel projections) and an MLP whose split
  // layers are activation-checkpointed train 4 SGD-momentum steps with norm clipping on every
  // rank: losses, norms, input gradients and the gathered weights equal one process's, also for
  // a split Embedding whose padding row lies in the last rank's shard (a split Embedding with
  // max_norm is a ConfigError); a split Embedding with scale_grad_by_freq refuses to train;
  // SplitRegionRng draws per rank inside a Scope (and is replayed by the recomputation), the shared
  // stream alike.
  for (int tp : {2, 4}) {
    auto ranks = volt_test::start_local_ranks(volt_test::dist_worker(),
                                              {"tp-train", "--devices", std::to_string(tp)}, tp);
    for (size_t r = 0; r < ranks.size(); ++r) {
      const std::string rank = "rank " + std::to_string(r);
      EXPECT_EQ(ranks[r]->exit_code(std::chrono::milliseconds(120000)), 0) << ranks[r]->output();
      const std::string out = ranks[r]->output();
      EXPECT_NE(out.find(rank + ": tp-train mlp ok (3 layers split)"), std::string::npos) << out;
      EXPECT_NE(out.find(rank + ": tp-train lm ok (5 layers split)"), std::string::npos) << out;
      EXPECT_NE(out.find(rank + ": tp-train padded ok (1 layers split)"), std::string::npos) << out;
      EXPECT_NE(out.find(rank + ": tp-train errors ok"), std::string::npos) << out;
      EXPECT_NE(out.find(rank + ": tp-train rng ok"), std::string::npos) << out;
    }
  }
}

TEST(TensorParallel, MlpInjectionPolicyOnAPathEqualsThePlan) {
  VOLT_REQUIRE_GLOO();
  const std::string o = expect_tp_matches("mlp", "policy", 2);
  EXPECT_EQ(field(o, 0, "layers"), 2) << o;  // fc0 colwise, fc1 rowwise; out kept whole
}

TEST(TensorParallel, DemoTransformerSplitsHeadsOnTwoAndFourRanks) {
  VOLT_REQUIRE_GLOO();
  for (int tp : {2, 4}) {
    const std::string o = expect_tp_matches("transformer", "plan", tp, 2e-5, {"--heads", "4"});
    EXPECT_EQ(field(o, 0, "layers"), 8) << o;  // qkv, proj, fc1, fc2 of two layers
    EXPECT_LT(field(o, 0, "param_bytes"), field(o, 0, "full_bytes") * 2 / 3) << o;
  }
}

TEST(TensorParallel, EmbeddingAndBlocksByPlanPolicyAndJson) {
  VOLT_REQUIRE_GLOO();
  // BlocksNet: embed 40x32 (vocabulary split), two Blocks (l1 32->64 colwise, l2 64->32 rowwise).
  for (const char* form : {"plan", "policy", "json"}) {
    const std::string o = expect_tp_matches("blocks", form, 2);
    EXPECT_EQ(field(o, 0, "layers"), 5) << form << "\n" << o;
  }
  const std::string o = expect_tp_matches("blocks", "policy", 4);
  EXPECT_EQ(field(o, 3, "layers"), 5) << o;
}

// An id outside the vocabulary of a vocabulary-split Embedding fails every rank with a
// ValueError naming it, as the unsplit lookup fails; each rank had masked it to a zero vector
// (no rank's rows) and predicted on.
TEST(TensorParallel, AnEmbeddingIdOutsideTheVocabularyIsAValueErrorOnEveryRank) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  for (const std::string id : {"40", "-1"}) {
    SCOPED_TRACE(id);
    Job j = run_tp({"--root", dir.path, "--out", dir / "x", "--model", "blocks", "--devices", "2",
                    "--tp", "2", "--form", "plan", "--bad-id", id});
    EXPECT_NE(j.code, 0) << j.output;
    const std::string said = "[TensorParallel] an embedding id (" + id +
                             ") is outside the vocabulary of 40 rows, split over the "
                             "tensor-parallel group";
    size_t at = j.output.find(said), count = 0;
    for (; at != std::string::npos; at = j.output.find(said, at + 1)) ++count;
    EXPECT_EQ(count, 2u) << j.output;  // both ranks
  }
}

TEST(TensorParallel, ValidateOnTwoRanksLogsWhatOneProcessLogs) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  auto val = [](const std::string& out, int rank) {
    std::smatch m;
    const std::regex re("rank " + std::to_string(rank) + " validated val_out=([-0-9.e+]+)");
    return std::regex_search(out, m, re) ? std::stod(m[1]) : -1.0;
  };
  Job r = run_tp({"--root", dir.path, "--out", dir / "ref", "--model", "blocks", "--devices", "1",
                  "--form", "none", "--stage", "validate"});
  ASSERT_EQ(r.code, 0) << r.output;
  Job j = run_tp({"--root", dir.path, "--out", dir / "tp", "--model", "blocks", "--devices", "2",
                  "--tp", "2", "--form", "policy", "--stage", "validate"});
  ASSERT_EQ(j.code, 0) << j.output;
  const double ref = val(r.output, 0);
  ASSERT_GT(ref, 0.0) << r.output;
  for (int k = 0; k < 2; ++k) EXPECT_NEAR(val(j.output, k), ref, 1e-5 * ref) << j.output;
}

TEST(TensorParallel, Bfloat16WeightsHalveTheBytesAndStayClose) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  Job r = run_tp({"--root", dir.path, "--out", dir / "ref", "--model", "mlp", "--devices", "1",
                  "--form", "none"});
  ASSERT_EQ(r.code, 0) << r.output;
  Job j = run_tp({"--root", dir.path, "--out", dir / "bf", "--model", "mlp", "--devices", "2",
                  "--tp", "2", "--dtype", "bfloat16"});
  ASSERT_EQ(j.code, 0) << j.output;
  const auto reference = load(dir / "ref.rank0.pt");
  const auto p = load(dir / "bf.rank0.pt");
  const double err = (p - reference).abs().max().item<double>();
  const double scale = reference.abs().max().item<double>();
  EXPECT_LT(err, 0.05 * scale) << "bf16 predictions too far from fp32";
  EXPECT_GT(err, 0.0) << "bf16 run must differ from fp32 (was the cast applied?)";
  const int64_t fp32_rank = (784 * 64 + 64) * 4 / 2 + 64 * 48 * 4 / 2 + 48 * 4 + (48 * 10 + 10) * 4;
  EXPECT_EQ(field(j.output, 0, "param_bytes"), fp32_rank / 2) << j.output;
  // Cast back to float32 after the run, with the values bfloat16 rounded them to.
  EXPECT_EQ(field(j.output, 0, "restored"), 2) << j.output;
}

TEST(TensorParallel, FourRanksAsTwoGroupsOfTwoSplitLayersAndData) {
  VOLT_REQUIRE_GLOO();
  // The reference's "8 devices, tp_size 4" shape at half the size: ranks {0,1} and {2,3} each
  // split the layers; the two groups predict different halves of the data.
  volt_test::TempDir dir;
  Job j = run_tp({"--root", dir.path, "--out", dir / "tp", "--model", "transformer", "--devices",
                  "4", "--tp", "2", "--heads", "4"});
  ASSERT_EQ(j.code, 0) << j.output;
  for (int g = 0; g < 2; ++g) {
    const std::string ref = dir / ("ref" + std::to_string(g));
    Job r = run_tp({"--root", dir.path, "--out", ref, "--model", "transformer", "--devices", "1",
                    "--form", "none", "--shard", std::to_string(g) + "/2"});
    ASSERT_EQ(r.code, 0) << r.output;
    const auto expected = load(ref + ".rank0.pt");
    for (int k = 2 * g; k < 2 * g + 2; ++k) {
      const auto p = load(dir / ("tp.rank" + std::to_string(k) + ".pt"));
      ASSERT_EQ(p.sizes(), expected.sizes()) << "rank " << k;
      EXPECT_TRUE(torch::allclose(p, expected, 2e-5, 2e-5))
          << "rank " << k << " max diff " << (p - expected).abs().max().item<double>();
    }
    EXPECT_EQ(field(j.output, 2 * g, "restored"), 1) << j.output;
  }
  EXPECT_FALSE(torch::equal(load(dir / "tp.rank0.pt"), load(dir / "tp.rank2.pt")))
      << "the two groups must read different batches";
}

TEST(TensorParallel, TpSizeLargerThanOrNotDividingTheWorldIsAClearErrorOnEveryRank) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  Job j = run_tp(
      {"--root", dir.path, "--out", dir / "x", "--model", "mlp", "--devices", "2", "--tp", "4"});
  EXPECT_EQ(j.code, 1) << j.output;
  EXPECT_NE(j.output.find("tp_size=4 is larger than the world (2 processes)"), std::string::npos)
      << j.output;
  j = run_tp(
      {"--root", dir.path, "--out", dir / "y", "--model", "mlp", "--devices", "3", "--tp", "2"});
  EXPECT_EQ(j.code, 1) << j.output;
  EXPECT_NE(j.output.find("is not a multiple of tensor_parallel.tp_size=2"), std::string::npos)
      << j.output;
}

TEST(TensorParallel, HeadsNotDividedAndFeaturesNotDividedAreClearErrors) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  Job j = run_tp({"--root", dir.path, "--out", dir / "x", "--model", "transformer", "--devices",
                  "2", "--tp", "2", "--heads", "3"});
  EXPECT_EQ(j.code, 1) << j.output;
  EXPECT_NE(j.output.find("3 attention heads are not divisible by tp_size=2"), std::string::npos)
      << j.output;
  // In process: the plan is checked before anything is split.
  volt_examples::MlpNet net(std::vector<int64_t>{30, 48});
  try {
    volt::resolve_tensor_parallel_plan(
        net, volt::TensorParallelOptions().tp_size(4).plan(volt::parse_tp_plan({"fc0=colwise"})));
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'fc0' has 30 output features, not divisible by "
                                         "tp_size=4"),
              std::string::npos)
        << e.what();
  }
}

TEST(TensorParallel, FitWithTensorParallelIsNotAvailable) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  Job j = run_tp({"--root", dir.path, "--out", dir / "x", "--model", "mlp", "--devices", "2",
                  "--tp", "2", "--stage", "fit"});
  EXPECT_EQ(j.code, 1) << j.output;
  EXPECT_NE(j.output.find("DeepSpeed inference settings"), std::string::npos) << j.output;
  // Names the strategy that trains tensor-parallel.
  EXPECT_NE(j.output.find("use strategy \"model_parallel\""), std::string::npos) << j.output;
}

TEST(TensorParallel, FitWithKernelInjectionIsNotAvailable) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  Job j = run_tp({"--root", dir.path, "--out", dir / "x", "--model", "seqmlp", "--devices", "1",
                  "--kernel-inject", "1", "--stage", "fit"});
  EXPECT_EQ(j.code, 1) << j.output;
  EXPECT_NE(j.output.find("replace_with_kernel_inject=1 are DeepSpeed inference settings"),
            std::string::npos)
      << j.output;
}

// replace_with_kernel_inject: the recognised blocks run volt's fused kernels (Linear+activation
// epilogue, fused_sdpa) for the run, alone and under tensor parallelism, and predict like the
// unfused single process; the model leaves the run with its own modules and weights.
TEST(TensorParallel, KernelInjectionPredictsLikeOneProcessAloneAndSplit) {
  VOLT_REQUIRE_GLOO();
  const std::vector<std::string> inject{"--kernel-inject", "1"};
  // SeqMlp: Linear+GELU (colwise) and Linear+ReLU (rowwise: the sum, then bias and ReLU).
  std::string o = expect_tp_matches("seqmlp", "none", 1, 1e-5, inject);
  EXPECT_EQ(field(o, 0, "injected"), 2) << o;
  for (int tp : {2, 4}) {
    o = expect_tp_matches("seqmlp", "plan", tp, 1e-5, inject);
    EXPECT_EQ(field(o, 0, "injected"), 2) << o;
    EXPECT_EQ(field(o, 0, "layers"), 2) << o;
  }
  // EncoderNet: two TransformerEncoderLayers (attention through fused_sdpa, feed-forward
  // split colwise/rowwise).
  o = expect_tp_matches("encoder", "none", 1, 1e-4, inject);
  EXPECT_EQ(field(o, 0, "injected"), 2) << o;
  o = expect_tp_matches("encoder", "plan", 2, 1e-4, inject);
  EXPECT_EQ(field(o, 0, "injected"), 2) << o;
  EXPECT_EQ(field(o, 1, "injected"), 2) << o;
}

std::string plan_error(torch::nn::Module& m, const volt::TensorParallelOptions& o) {
  try {
    volt::resolve_tensor_parallel_plan(m, o);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(TensorParallel, PlanErrorsNameThePatternAndTheFix) {
  VOLT_REQUIRE_GLOO();
  volt_examples::MlpNet net(std::vector<int64_t>{64, 48});
  volt::TensorParallelOptions o;
  o.tp_size(2);
  EXPECT_NE(plan_error(net, o.plan(volt::parse_tp_plan({"nothing*=colwise"})))
                .find("plan entry \"nothing*\" matches no module"),
            std::string::npos);
  volt_examples::CnnNet cnn;
  EXPECT_NE(plan_error(cnn, volt::TensorParallelOptions().tp_size(2).plan(
                                volt::parse_tp_plan({"conv1=colwise"})))
                .find("a torch::nn::Conv2dImpl"),
            std::string::npos)
      << plan_error(cnn, volt::TensorParallelOptions().tp_size(2).plan(
                             volt::parse_tp_plan({"conv1=colwise"})));
  EXPECT_NE(plan_error(net, volt::TensorParallelOptions().tp_size(2).injection_policy(
                                volt::parse_injection_policy({"NoSuchBlock: o"})))
                .find("injection_policy key \"NoSuchBlock\" matches no module"),
            std::string::npos);
  EXPECT_NE(plan_error(net, volt::TensorParallelOptions().tp_size(2).injection_policy(
                                volt::parse_injection_policy({"MlpNet: wo"})))
                .find("names 'wo', which is no Linear"),
            std::string::npos);
  EXPECT_NE(plan_error(net, volt::TensorParallelOptions().tp_size(0)).find("tp_size=0"),
            std::string::npos);
  // A tensor split for one layer and used by another (tied weights) or a module at two paths.
  {
    struct Tied : torch::nn::Module {
      Tied() {
        a = register_module("a", torch::nn::Linear(8, 8));
        out = register_parameter("out", a->weight);  // e.g. an output projection tied to it
        shared = register_module("shared", torch::nn::Linear(8, 4));
        again = register_module("again", shared);
      }
      torch::nn::Linear a{nullptr}, shared{nullptr}, again{nullptr};
      at::Tensor out;
    } tied;
    const std::string e = plan_error(
        tied, volt::TensorParallelOptions().tp_size(2).plan(volt::parse_tp_plan({"a=colwise"})));
    EXPECT_NE(e.find("'out' is the same tensor as 'a.weight', which the plan splits"),
              std::string::npos)
        << e;
    EXPECT_NE(plan_error(tied, volt::TensorParallelOptions().tp_size(2).plan(
                                   volt::parse_tp_plan({"shared=rowwise"})))
                  .find("'again.weight' is the same tensor as 'shared.weight'"),
              std::string::npos);
    EXPECT_EQ(plan_error(tied, volt::TensorParallelOptions().tp_size(2).plan(
                                   volt::parse_tp_plan({"a=replicated"}))),
              "");
  }
  // A projection the policy takes for packed q/k/v by its name, whose k and v are narrower
  // (grouped-query attention): equal thirds would cut across them. The plan may say otherwise.
  {
    struct Gqa : torch::nn::Module {
      Gqa() {
        qkv = register_module("qkv", torch::nn::Linear(32, 64));  // q 32, k 16, v 16
        o = register_module("o", torch::nn::Linear(32, 32));
      }
      torch::nn::Linear qkv{nullptr}, o{nullptr};
    } gqa;
    const auto policy = volt::parse_injection_policy({"Gqa: o"});
    const std::string e =
        plan_error(gqa, volt::TensorParallelOptions().tp_size(2).injection_policy(policy));
    EXPECT_NE(e.find("'qkv' is taken for a packed q/k/v projection by its name but has 64 "
                     "outputs for 32 inputs"),
              std::string::npos)
        << e;
    EXPECT_EQ(
        plan_error(gqa, volt::TensorParallelOptions().tp_size(2).injection_policy(policy).plan(
                            volt::parse_tp_plan({"qkv=replicated"}))),
        "");
  }
  // The policy by class name: MlpNet's Linears, fc1 row-parallel, the others column-parallel.
  auto layers = volt::resolve_tensor_parallel_plan(
      net, volt::TensorParallelOptions().tp_size(2).injection_policy(
               volt::parse_injection_policy({"MlpNet: fc1"})));
  ASSERT_EQ(layers.size(), 3u);
  EXPECT_EQ(layers[0].path, "fc0");
  EXPECT_EQ(layers[0].style, volt::TpStyle::kColwise);
  EXPECT_EQ(layers[1].path, "fc1");
  EXPECT_EQ(layers[1].style, volt::TpStyle::kRowwise);
}

TEST(TensorParallel, CliFormsParseAndMalformedEntriesAreErrors) {
  VOLT_REQUIRE_GLOO();
  auto plan = volt::parse_tp_plan({" qkv_* = colwise_qkv", "proj_*=rowwise"});
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].first, "qkv_*");
  EXPECT_EQ(plan[0].second, volt::TpStyle::kColwiseQkv);
  auto pol = volt::parse_injection_policy({"Block: attn.o, mlp.fc2"});
  ASSERT_EQ(pol.size(), 1u);
  EXPECT_EQ(pol[0].second, (std::vector<std::string>{"attn.o", "mlp.fc2"}));
  EXPECT_THROW(volt::parse_tp_plan({"fc1"}), ConfigError);
  EXPECT_THROW(volt::parse_tp_plan({"fc1=diagonal"}), ConfigError);
  EXPECT_THROW(volt::parse_injection_policy({"Block"}), ConfigError);
  EXPECT_THROW(volt::parse_injection_policy({"Block: , "}), ConfigError);
}

TEST(TensorParallel, StrategyOptionsRejectWhatIsNotBuilt) {
  VOLT_REQUIRE_GLOO();
  auto acc = volt::registry().accelerators.create("cpu");
  auto prec = volt::registry().precisions.create("32-true");
  auto make = [&](volt::DeepSpeedStrategyOptions o) {
    return std::make_shared<volt::DeepSpeedStrategy>(o, acc, prec, 2);
  };
  EXPECT_NO_THROW(make(volt::DeepSpeedStrategyOptions().replace_with_kernel_inject(true)));
  EXPECT_THROW(make(volt::DeepSpeedStrategyOptions().enable_cuda_graph(true)), volt::NotAvailable);
  EXPECT_THROW(make(volt::DeepSpeedStrategyOptions().dtype("float16")), ConfigError);
  EXPECT_THROW(make(volt::DeepSpeedStrategyOptions().replace_method("kernel")), ConfigError);
  // The JSON form reaches the same options.
  auto s = make(volt::DeepSpeedStrategyOptions().config(
      R"({"tensor_parallel": {"tp_size": 4}, "dtype": "bf16", "injection_policy": {"Block": "o"}})"));
  EXPECT_EQ(s->deepspeed_options().tensor_parallel().tp_size(), 4);
  EXPECT_EQ(s->deepspeed_options().dtype(), "bfloat16");
  ASSERT_EQ(s->deepspeed_options().tensor_parallel().injection_policy().size(), 1u);
  EXPECT_THROW(make(volt::DeepSpeedStrategyOptions().config(R"({"enable_cuda_graph": true})")),
               volt::NotAvailable);
}

std::string json_error(const std::string& json) {
  try {
    volt::parse_deepspeed_config(json, "t.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(TensorParallel, JsonInferenceKeysAreCheckedLikeTheRest) {
  VOLT_REQUIRE_GLOO();
  auto c = volt::parse_deepspeed_config(
      R"({"mp_size": 2, "dtype": "torch.float", "replace_method": "auto",
          "tensor_parallel": {"plan": {"fc*": "colwise"}, "num_heads": 8}})",
      "t.json");
  EXPECT_EQ(*c.tp_size, 2);
  EXPECT_EQ(c.dtype, "float32");
  EXPECT_EQ(*c.tp_num_heads, 8);
  ASSERT_EQ(c.tp_plan.size(), 1u);
  EXPECT_NE(json_error(R"({"dtype": "torch.half"})").find("\"float32\" or \"bfloat16\""),
            std::string::npos);
  EXPECT_NE(json_error(R"({"tensor_parallel": {"tp_size": 0}})").find("must be >= 1"),
            std::string::npos);
  EXPECT_NE(json_error(R"({"tensor_parallel": {"tp_size": 2}, "mp_size": 4})")
                .find("mp_size is the old name"),
            std::string::npos);
  EXPECT_NE(json_error(R"({"tensor_parallel": {"tp_sise": 2}})").find("tp_sise"),
            std::string::npos);
  EXPECT_NE(json_error(R"({"injection_policy": {"Block": 3}})").find("member name"),
            std::string::npos);
  EXPECT_NE(json_error(R"({"tensor_parallel": {"plan": {"fc": 1}}})").find("colwise"),
            std::string::npos);
}

TEST(TensorParallel, RegistryArgumentsTheCliAndYamlGiveReachTheOptions) {
  VOLT_REQUIRE_GLOO();
  // What `--trainer.strategy=deepspeed --trainer.strategy.init_args.tp_size=2 ...` or a YAML
  // init_args block hands the registered factory (the kwargs form of the reference).
  auto& reg = volt::registry();
  volt::StrategyContext ctx{std::make_shared<volt::CpuAccelerator>(),
                            reg.precisions.create("32-true"), 2, 1};
  const auto& entry = reg.strategies.at("deepspeed");
  std::map<std::string, volt::ParamValue> v;
  for (const auto& spec : entry.params.specs()) v[spec.name] = spec.default_value;
  v["tp_size"] = int64_t{2};
  v["tp_plan"] = std::vector<std::string>{"qkv_*=colwise_qkv", "proj_*=rowwise"};
  v["injection_policy"] = std::vector<std::string>{"Block: attn.o, mlp.fc2"};
  v["num_heads"] = int64_t{4};
  v["dtype"] = std::string("bfloat16");
  auto s = std::dynamic_pointer_cast<volt::DeepSpeedStrategy>(
      entry.make(volt::Args("strategy deepspeed", v), ctx));
  ASSERT_NE(s, nullptr);
  const auto& tp = s->deepspeed_options().tensor_parallel();
  EXPECT_EQ(tp.tp_size(), 2);
  EXPECT_EQ(tp.num_heads(), 4);
  ASSERT_EQ(tp.plan().size(), 2u);
  EXPECT_EQ(tp.plan()[1].second, volt::TpStyle::kRowwise);
  ASSERT_EQ(tp.injection_policy().size(), 1u);
  EXPECT_EQ(tp.injection_policy()[0].first, "Block");
  EXPECT_EQ(s->deepspeed_options().dtype(), "bfloat16");
  v["tp_plan"] = std::vector<std::string>{"proj_*"};
  EXPECT_THROW(entry.make(volt::Args("strategy deepspeed", v), ctx), ConfigError);
}

}  // namespace
