// to_torchscript: a module's computation exported as a TorchScript file that libtorch's
// torch::jit::load and Python's torch.jit.load (python3-torch, no volt code) run alike.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <volt/volt.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "build_paths.h"
#include "error_text.h"
#include "file_text.h"
#include "models.h"
#include "python_tool.h"
#include "tiny.h"

namespace {

using volt_test::error_of;

// Linear - BatchNorm - ReLU - Dropout - Linear: evaluation mode matters twice (running
// statistics, no dropout).
struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    bn = register_module("bn", torch::nn::BatchNorm1d(16));
    drop = register_module("drop", torch::nn::Dropout(0.5));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2(drop(torch::relu(bn(fc1(x.flatten(1))))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::Dropout drop{nullptr};
};

std::shared_ptr<Net> trained_net() {
  torch::manual_seed(3);
  auto net = std::make_shared<Net>();
  for (int i = 0; i < 3; ++i) net->forward(torch::randn({32, 2, 3}));  // running statistics move
  return net;
}

volt::ExportFunction forward_of(const std::shared_ptr<Net>& net) {
  return [net](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{net->forward(in[0])};
  };
}

std::vector<at::Tensor> run(torch::jit::Module& m, const std::vector<at::Tensor>& inputs,
                            const std::string& method = "forward") {
  torch::NoGradGuard no_grad;
  c10::IValue out = m.get_method(method)(std::vector<c10::IValue>(inputs.begin(), inputs.end()));
  if (out.isTensor()) return {out.toTensor()};
  std::vector<at::Tensor> r;
  for (const auto& e : out.toTupleRef().elements()) r.push_back(e.toTensor());
  return r;
}

nlohmann::json python_run(
    const std::string& model, const std::string& cases_path,
    const std::vector<std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>>& cases) {
  c10::Dict<std::string, at::Tensor> dict;
  for (size_t c = 0; c < cases.size(); ++c) {
    for (size_t i = 0; i < cases[c].first.size(); ++i) {
      dict.insert("input_" + std::to_string(c) + "_" + std::to_string(i), cases[c].first[i]);
    }
    for (size_t k = 0; k < cases[c].second.size(); ++k) {
      dict.insert("output_" + std::to_string(c) + "_" + std::to_string(k), cases[c].second[k]);
    }
  }
  const std::vector<char> bytes = torch::pickle_save(dict);
  std::ofstream(cases_path, std::ios::binary).write(bytes.data(), bytes.size());
  const auto run = volt_test::run_python_tool("check_torchscript.py", {model, cases_path});
  EXPECT_EQ(run.status, 0) << run.out;
  return nlohmann::json::parse(run.out);
}

TEST(TorchScript, AModulesForwardRunsWithoutVoltInCppAndPythonAtAnyBatchSize) {
  volt_test::TempDir dir;
  auto net = trained_net();
  net->train();
  const std::string path = dir / "net.pt";
  const at::Tensor example = torch::randn({8, 2, 3});
  torch::jit::Module exported = volt::to_torchscript(*net, forward_of(net), {example},
                                                     volt::TorchScriptOptions().file_path(path));
  // Classes named after the C++ ones (Python prints `original_name=Net`).
  EXPECT_EQ(exported.type()->name()->name(), "Net");
  EXPECT_EQ(exported.attr("fc1").toModule().type()->name()->name(), "Linear");
  EXPECT_EQ(exported.attr("bn").toModule().type()->name()->name(), "BatchNorm1d");
  // The module is back in training mode, every submodule too.
  EXPECT_TRUE(net->is_training());
  EXPECT_TRUE(net->drop->is_training());
  EXPECT_TRUE(net->bn->is_training());

  net->eval();
  torch::NoGradGuard no_grad;
  torch::jit::Module loaded = torch::jit::load(path);
  std::vector<std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>> cases;
  for (int64_t rows : {8, 1, 33}) {
    const at::Tensor x = torch::randn({rows, 2, 3});
    const at::Tensor want = net->forward(x);
    // The same kernels in the same order: the same bits, in the returned module and the file.
    EXPECT_TRUE(run(exported, {x})[0].equal(want)) << rows;
    EXPECT_TRUE(run(loaded, {x})[0].equal(want)) << rows;
    cases.push_back({{x}, {want}});
  }
  EXPECT_FALSE(loaded.is_training());

  // Copies: training the module further does not change an exported one.
  const at::Tensor x = cases[0].first[0];
  const at::Tensor before = run(loaded, {x})[0];
  net->fc1->weight.add_(1.0);
  EXPECT_FALSE(net->forward(x).equal(before));
  EXPECT_TRUE(run(exported, {x})[0].equal(before));
  net->fc1->weight.sub_(1.0);

  if (!volt_test::has_python_torch()) GTEST_SKIP() << "python3-torch not installed; no Python run";
  const auto j = python_run(path, dir / "cases.pt", cases);
  EXPECT_EQ(j["training"], false);
  std::vector<std::string> names;
  for (const auto& p : net->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(j["parameters"].get<std::vector<std::string>>(), names);
  std::vector<std::string> buffers;
  for (const auto& b : net->named_buffers()) buffers.push_back(b.key());
  EXPECT_EQ(j["buffers"].get<std::vector<std::string>>(), buffers);
  ASSERT_EQ(j["cases"].size(), cases.size());
  for (const auto& c : j["cases"]) EXPECT_TRUE(c["bit_equal"].get<bool>()) << j.dump();
}

TEST(TorchScript, SeveralInputsGiveArgumentsAndSeveralOutputsATuple) {
  volt_test::TempDir dir;
  auto net = trained_net();
  volt::ExportFunction fn = [net](const std::vector<at::Tensor>& in) {
    at::Tensor logits = net->forward(in[0]) + in[1];  // a per-row bias as a second input
    return std::vector<at::Tensor>{logits, logits.softmax(-1), logits.argmax(-1)};
  };
  const std::string path = dir / "two.pt";
  volt::to_torchscript(*net, fn, {torch::randn({4, 6}), torch::randn({4, 1})},
                       volt::TorchScriptOptions().file_path(path).method_name("scores"));
  torch::jit::Module loaded = torch::jit::load(path);
  EXPECT_FALSE(loaded.find_method("forward").has_value());
  const std::vector<at::Tensor> in = {torch::randn({5, 6}), torch::randn({5, 1})};
  net->eval();
  torch::NoGradGuard no_grad;
  const auto want = fn(in);
  const auto got = run(loaded, in, "scores");
  ASSERT_EQ(got.size(), 3u);
  for (size_t k = 0; k < 3; ++k) EXPECT_TRUE(got[k].equal(want[k])) << k;
  // The arguments keep their order and names.
  const auto& schema = loaded.get_method("scores").function().getSchema();
  ASSERT_EQ(schema.arguments().size(), 3u);  // self, input_0, input_1
  EXPECT_EQ(schema.arguments()[1].name(), "input_0");
  EXPECT_EQ(schema.arguments()[2].name(), "input_1");
}

// A head that reads its owner's embedding matrix (weight tying): one tensor in two places.
struct TiedHead : torch::nn::Module {
  explicit TiedHead(const at::Tensor& w) { weight = register_parameter("weight", w); }
  at::Tensor weight;
};
struct Tied : torch::nn::Module {
  Tied() {
    embed = register_parameter("embed", torch::randn({10, 4}));
    head = register_module("head", std::make_shared<TiedHead>(embed));
  }
  at::Tensor forward(const at::Tensor& tokens) {
    return at::matmul(embed.index_select(0, tokens.flatten()), head->weight.t());
  }
  at::Tensor embed;
  std::shared_ptr<TiedHead> head;
};

TEST(TorchScript, TiedWeightsStayOneTensor) {
  auto m = std::make_shared<Tied>();
  torch::jit::Module exported = volt::to_torchscript(
      *m,
      [m](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{m->forward(in[0])}; },
      {torch::tensor({1, 2, 3, 4})});
  const at::Tensor a = exported.attr("embed").toTensor();
  const at::Tensor b = exported.attr("head").toModule().attr("weight").toTensor();
  EXPECT_EQ(a.data_ptr(), b.data_ptr());
  EXPECT_NE(a.data_ptr(), m->embed.data_ptr());  // a copy, shared by both
  EXPECT_TRUE(a.equal(m->embed));
  // Changing the copy through one name changes what the other reads.
  torch::NoGradGuard no_grad;
  const at::Tensor tokens = torch::tensor({7, 0});
  a.mul_(2);
  m->embed.mul_(2);
  EXPECT_TRUE(run(exported, {tokens})[0].equal(m->forward(tokens)));
}

// A forward that reads the batch size into a C++ integer.
struct SizeReader : torch::nn::Module {
  explicit SizeReader(bool scale) : scale_(scale) {
    fc = register_module("fc", torch::nn::Linear(6, 2));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    if (scale_) return fc(x.flatten(1)) / static_cast<double>(x.size(0));  // a mean over the batch
    return fc(x.reshape({x.size(0), -1}));
  }
  bool scale_;
  torch::nn::Linear fc{nullptr};
};

TEST(TorchScript, ASizeReadIntoACppIntegerIsFoundAtAnotherBatchSize) {
  for (bool scale : {false, true}) {
    auto m = std::make_shared<SizeReader>(scale);
    auto fn = [m](const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{m->forward(in[0])};
    };
    const std::string err = error_of<volt::ValueError>([&] {
      volt::to_torchscript(*m, fn, {torch::randn({4, 2, 3})});
    });
    EXPECT_NE(err.find("at 5 rows (the example has 4)"), std::string::npos) << err;
    EXPECT_NE(err.find("x.flatten(1)"), std::string::npos) << err;
    EXPECT_NE(err.find("dynamic_batch(false)"), std::string::npos) << err;
    // A reshape to the traced size fails there (libtorch's reason quoted); a scale gives other
    // numbers.
    EXPECT_NE(err.find(scale ? "output 0 differs" : "is invalid for input of size 30"),
              std::string::npos)
        << err;
    // Meant for one batch size: exported, and right at that size.
    torch::jit::Module fixed = volt::to_torchscript(
        *m, fn, {torch::randn({4, 2, 3})}, volt::TorchScriptOptions().dynamic_batch(false));
    const at::Tensor x = torch::randn({4, 2, 3});
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(run(fixed, {x})[0].equal(m->forward(x)));
  }
}

TEST(TorchScript, AValueReadOnTheHostIsRefused) {
  auto net = trained_net();
  const std::string err = error_of<volt::ValueError>([&] {
    volt::to_torchscript(*net,
                         [net](const std::vector<at::Tensor>& in) {
                           at::Tensor y = net->forward(in[0]);
                           if (y.sum().item<float>() > 0) y = -y;  // decided once, kept forever
                           return std::vector<at::Tensor>{y};
                         },
                         {torch::randn({4, 6})});
  });
  EXPECT_NE(err.find("read a tensor's value on the host"), std::string::npos) << err;
  EXPECT_NE(err.find("item()"), std::string::npos) << err;
  EXPECT_NE(err.find("at::where"), std::string::npos) << err;
  EXPECT_TRUE(net->is_training());  // restored after a failure too
}

TEST(TorchScript, AFunctionThatIsNotPureFailsTheCheck) {
  auto net = trained_net();
  auto fn = [net](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{net->forward(in[0]) + torch::randn({3})};  // noise in eval
  };
  const std::string err = error_of<volt::ValueError>([&] {
    volt::to_torchscript(*net, fn, {torch::randn({4, 6})});
  });
  EXPECT_NE(err.find("on the example the exported module's output 0 differs"), std::string::npos)
      << err;
  EXPECT_NE(err.find("check(false)"), std::string::npos) << err;
  EXPECT_NO_THROW(volt::to_torchscript(*net, fn, {torch::randn({4, 6})},
                                       volt::TorchScriptOptions().check(false)));
}

TEST(TorchScript, BadArgumentsAreValueErrorsSayingWhatToPass) {
  auto net = trained_net();
  const auto fn = forward_of(net);
  const at::Tensor x = torch::randn({4, 6});
  auto expect = [](const std::function<void()>& call, const std::string& phrase) {
    const std::string err = error_of<volt::ValueError>(call);
    EXPECT_NE(err.find(phrase), std::string::npos) << "expected \"" << phrase << "\" in: " << err;
    EXPECT_EQ(err.rfind("[to_torchscript] ", 0), 0u) << err;
  };
  expect([&] { volt::to_torchscript(*net, fn, {}); }, "got no example inputs");
  expect([&] { volt::to_torchscript(*net, fn, {at::Tensor()}); },
         "example input 0 is an undefined");
  expect([&] { volt::to_torchscript(*net, volt::ExportFunction(), {x}); }, "got no function");
  expect(
      [&] {
        volt::to_torchscript(
            *net, [](const std::vector<at::Tensor>&) { return std::vector<at::Tensor>{}; }, {x});
      },
      "returned no tensors");
  expect(
      [&] {
        volt::to_torchscript(
            *net,
            [](const std::vector<at::Tensor>&) { return std::vector<at::Tensor>{at::Tensor()}; },
            {x});
      },
      "output 0 is an undefined tensor");
  expect(
      [&] { volt::to_torchscript(*net, fn, {x}, volt::TorchScriptOptions().method_name("1st")); },
      "is not an identifier");
  expect(
      [&] { volt::to_torchscript(*net, fn, {x}, volt::TorchScriptOptions().check_tolerance(-1)); },
      "check_tolerance -1 is negative");
  // libtorch's own error, quoted.
  expect(
      [&] {
        volt::to_torchscript(*net, fn, {torch::randn({4, 5})});
      },
      "could not trace the function: mat1 and mat2 shapes cannot be multiplied");
  // A tensor outside the module that needs a gradient cannot be a constant.
  const at::Tensor w = torch::randn({3}, torch::requires_grad());
  expect(
      [&] {
        volt::to_torchscript(*net,
                             [&](const std::vector<at::Tensor>& in) {
                               return std::vector<at::Tensor>{net->forward(in[0]) * w};
                             },
                             {x});
      },
      "Cannot insert a Tensor that requires grad as a constant");
}

TEST(TorchScript, AFailedExportOrWriteLeavesTheFileAsItWas) {
  volt_test::TempDir dir;
  auto m = std::make_shared<SizeReader>(false);
  const std::string path = dir / "model.pt";
  std::ofstream(path) << "the previous export";
  auto fn = [m](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{m->forward(in[0])};
  };
  EXPECT_THROW(volt::to_torchscript(*m, fn, {torch::randn({4, 2, 3})},
                                    volt::TorchScriptOptions().file_path(path)),
               volt::ValueError);
  EXPECT_EQ(volt_test::file_text(path), "the previous export");
  // A folder that cannot exist (its parent is a file): CheckpointError, nothing written.
  const std::string err = error_of<volt::CheckpointError>([&] {
    volt::to_torchscript(
        *m, fn, {torch::randn({4, 2, 3})},
        volt::TorchScriptOptions().file_path(path + "/inside.pt").dynamic_batch(false));
  });
  EXPECT_FALSE(err.empty());
  EXPECT_EQ(volt_test::file_text(path), "the previous export");
}

TEST(TorchScript, ATemplatedModulesClassIsNamedWithoutItsArguments) {
  auto net = std::make_shared<volt_examples::MlpNet>(std::vector<int64_t>{16});
  volt_examples::Classifier<volt_examples::MlpNet> model(net, 1e-3, 1);
  torch::jit::Module exported = volt::to_torchscript(model, torch::randn({4, 1, 28, 28}));
  EXPECT_EQ(exported.type()->name()->name(), "Classifier");
  EXPECT_EQ(exported.attr("net").toModule().type()->name()->name(), "MlpNet");
}

TEST(TorchScript, VoltsFusedKernelsExportAsLibtorchsOwnOps) {
  // The demo transformer's attention runs volt::fused_sdpa; traced, it runs its composition, so
  // the file holds only aten ops and loads where volt is not.
  torch::manual_seed(11);
  auto net = std::make_shared<volt_examples::TransformerNet>(32, 4, 1, /*fused=*/true);
  torch::jit::Module exported =
      volt::to_torchscript(*net,
                           [net](const std::vector<at::Tensor>& in) {
                             return std::vector<at::Tensor>{net->forward(in[0])};
                           },
                           {torch::randn({6, 1, 28, 28})});
  for (const torch::jit::Node* node : exported.get_method("forward").graph()->nodes()) {
    const auto kind = node->kind();
    EXPECT_TRUE(kind.is_aten() || kind.is_prim()) << kind.toQualString();
  }
  net->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor x = torch::randn({9, 1, 28, 28});
  const at::Tensor got = run(exported, {x})[0];
  const at::Tensor want = net->forward(x);  // the fused kernel, eagerly
  EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-5)) << (got - want).abs().max();
}

TEST(TorchScript, AVoltModulesPredictStep) {
  volt_test::TempDir dir;
  torch::manual_seed(5);
  volt_test::TinyClassifier model;
  const std::string path = dir / "tiny.pt";
  volt::to_torchscript(model, torch::randn({16, 8}), volt::TorchScriptOptions().file_path(path));
  torch::jit::Module loaded = torch::jit::load(path);
  model.eval();
  torch::NoGradGuard no_grad;
  const at::Tensor x = torch::randn({40, 8});
  volt::Batch batch;
  batch.input = x;
  const at::Tensor got = run(loaded, {x})[0];
  EXPECT_EQ(got.scalar_type(), at::kLong);
  EXPECT_TRUE(got.equal(model.predict_step(batch, 0)));
}

}  // namespace
