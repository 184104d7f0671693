// Capture and replay training (the reference's HPUGraphsModel, on CUDA graphs): the whole
// training step of a Fashion-MNIST MLP (forward, backward, SGD step) is captured once, after
// warm-up steps on a side stream, and replayed for every later batch; the test set is then
// scored through graphed inference (volt::wrap_in_graph). Needs a GPU; elsewhere it says why
// and exits 0.
//
//   build/examples/volt_graphed_training [data_root] [epochs]
#include <torch/torch.h>
#include <volt/volt.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "models.h"

int main(int argc, char** argv) {
  const std::string root = argc > 1 ? argv[1] : volt::kFashionMnistDefaultRoot;
  const int64_t epochs = argc > 2 ? std::atoll(argv[2]) : 2;
  if (!volt::CudaGraph::available()) {
    std::printf("graphed_training needs CUDA graphs: %s\n",
                volt::CudaGraph::unavailable_reason().c_str());
    return 0;
  }
  const torch::Device cuda(torch::kCUDA, 0);
  volt::seed_everything(42);
  const volt::FashionMnist train(root, volt::FashionMnist::Split::kTrain);
  const volt::FashionMnist test(root, volt::FashionMnist::Split::kTest);
  const torch::Tensor x = train.inputs().to(cuda), y = train.targets().to(cuda);

  auto net = std::make_shared<volt_examples::MlpNet>(std::vector<int64_t>{256, 128});
  net->to(cuda);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const int64_t batch = 128, n = x.size(0) / batch;  // full batches only: one static shape

  // Static inputs: each batch is copied into them before a replay.
  torch::Tensor sx = x.slice(0, 0, batch).clone(), sy = y.slice(0, 0, batch).clone(), loss;
  auto step = [&] {
    loss = torch::cross_entropy_loss(net->forward(sx), sy);
    loss.backward();
    opt.step();
  };
  auto clear_grads = [&] {
    for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
  };
  volt::CudaGraph graph("train_step");
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    const torch::Tensor order = torch::randperm(x.size(0), torch::TensorOptions().device(cuda));
    torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(cuda));
    for (int64_t b = 0; b < n; ++b) {
      const torch::Tensor idx = order.slice(0, b * batch, (b + 1) * batch);
      sx.copy_(x.index_select(0, idx));
      sy.copy_(y.index_select(0, idx));
      if (graph.captured()) {
        graph.replay();
      } else if (epoch == 0 && b < 3) {
        clear_grads();
        volt::run_on_side_stream(step);  // warm-up: real steps, lazy state made outside graphs
      } else {
        clear_grads();  // the graph allocates the gradients in its own pool
        graph.capture(step);
        graph.replay();  // capture records; the replay runs this batch's step
      }
      loss_sum += loss.detach();
    }
    std::printf("epoch %lld: mean train loss %.4f (%lld graph replays)\n",
                static_cast<long long>(epoch), loss_sum.item<double>() / n,
                static_cast<long long>(graph.replays()));
  }

  net->eval();
  volt::GraphedModule infer = volt::wrap_in_graph(
      *net, [&](const volt::TensorList& in) { return volt::TensorList{net->forward(in[0])}; });
  const torch::Tensor tx = test.inputs().to(cuda), ty = test.targets().to(cuda);
  int64_t correct = 0;
  for (int64_t b = 0; b + 1000 <= tx.size(0); b += 1000) {
    const torch::Tensor logits = infer({tx.slice(0, b, b + 1000)})[0];
    correct += logits.argmax(1).eq(ty.slice(0, b, b + 1000)).sum().item<int64_t>();
  }
  std::printf("test accuracy %.4f (graphed inference: %lld capture, %lld replays)\n",
              static_cast<double>(correct) / tx.size(0),
              static_cast<long long>(infer.stats().misses),
              static_cast<long long>(infer.stats().hits));
  return 0;
}
