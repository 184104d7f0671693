#include "strategies/detail/replica_mesh.h"

#include <vector>

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

void average_over_replicas(ProcessGroup* replica_group, const Module& module) {
  if (replica_group == nullptr) return;
  std::vector<at::Tensor> grads;
  for (const auto& p : module.parameters(true)) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  replica_group->all_reduce_(grads, Reduce::kMean);
}

void unscale_agreeing_on_found_inf(Precision& precision, ProcessGroup& world,
                                   torch::optim::Optimizer& optimizer) {
  precision.unscale_gradients(optimizer);
  precision.agree_on_found_inf(
      [&world](bool found) { return world.world_size() > 1 ? world.any_of(found) : found; });
}

}  // namespace detail
}  // namespace volt
