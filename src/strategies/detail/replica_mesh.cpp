#include "strategies/detail/replica_mesh.h"

#include <vector>

#include <torch/torch.h>

#include "distributed/detail/dtype_buckets.h"
#include "volt/core/module.h"
#include "volt/distributed/process_group.h"
#include "volt/precision/precision.h"

namespace volt {
namespace detail {

ReplicaMesh make_replica_mesh(const std::shared_ptr<ProcessGroup>& world, int64_t inner,
                              const std::string& inner_tag, const std::string& replica_tag) {
  ReplicaMesh mesh;
  const int64_t rank = world->rank();
  mesh.inner = inner;
  mesh.replicas = world->world_size() / inner;
  mesh.replica = rank / inner;
  if (mesh.replicas == 1) {
    mesh.inner_group = world;
    return mesh;
  }
  // Consecutive ranks: an inner group stays on one node when the processes per node are a
  // multiple of its size (its traffic runs every layer or micro-batch; the replicas' once a step).
  std::vector<int64_t> mine, replicas;
  for (int64_t p = 0; p < inner; ++p) mine.push_back(mesh.world_rank(mesh.replica, p));
  for (int64_t d = 0; d < mesh.replicas; ++d) replicas.push_back(mesh.world_rank(d, rank % inner));
  mesh.inner_group = world->new_group(mine, inner_tag);
  mesh.replica_group = world->new_group(replicas, replica_tag);
  return mesh;
}

void average_gradients(const Module& module, const AllReduce& all_reduce) {
  // The processes first agree on which gradients exist, or they would all-reduce different
  // lists (a mismatched collective).
  std::vector<at::Tensor> params = module.parameters(true);
  if (params.empty()) return;
  at::Tensor defined = at::zeros({static_cast<int64_t>(params.size())}, at::kFloat);
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].grad().defined()) defined[static_cast<int64_t>(i)] = 1.0f;
  }
  defined = all_reduce(defined, Reduce::kMax);
  const auto anywhere = defined.accessor<float, 1>();
  std::vector<at::Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    if (anywhere[static_cast<int64_t>(i)] == 0.0f) continue;
    at::Tensor& p = params[i];
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    grads.push_back(p.grad());
  }
  constexpr int64_t kBucket = int64_t{1} << 22;
  at::NoGradGuard no_grad;
  for (const auto& bucket : dtype_buckets(grads, kBucket)) {
    std::vector<at::Tensor> flat;
    for (size_t k : bucket) flat.push_back(grads[k].reshape(-1));
    const at::Tensor mean = all_reduce(at::cat(flat), Reduce::kMean);
    int64_t offset = 0;
    for (size_t k : bucket) {
      const int64_t n = grads[k].numel();
      grads[k].copy_(mean.narrow(0, offset, n).view(grads[k].sizes()));
      offset += n;
    }
  }
}

void average_over_replicas(ProcessGroup* replica_group, const Module& module) {
  if (replica_group == nullptr) return;
  average_gradients(module, [replica_group](const at::Tensor& t, Reduce op) {
    return replica_group->all_reduce(t, op);
  });
}

void unscale_agreeing_on_found_inf(Precision& precision, ProcessGroup& world,
                                   torch::optim::Optimizer& optimizer) {
  precision.unscale_gradients(optimizer);
  precision.agree_on_found_inf(
      [&world](bool found) { return world.world_size() > 1 ? world.any_of(found) : found; });
}

}  // namespace detail
}  // namespace volt
