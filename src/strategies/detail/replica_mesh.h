#pragma once
// The 2-D process layouts of PipelineStrategy and ModelParallelStrategy (pipeline x data and
// tensor x data parallelism): consecutive ranks form an inner group (one pipeline, one
// tensor-parallel group) whose members hold different parts of one model, and the ranks at the
// same place of every inner group are replicas that read different shards of the data and
// average their gradients after backward. Also the loss-scaling step shared by every strategy
// whose ranks check only some of the gradients.

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "volt/core/types.h"

namespace volt {

class Module;
class Precision;
class ProcessGroup;

namespace detail {

struct ReplicaMesh {
  int64_t inner = 1;                            // processes per inner group
  int64_t replicas = 1;                         // inner groups: the data-parallel size
  int64_t replica = 0;                          // this rank's inner group: its data shard
  std::shared_ptr<ProcessGroup> inner_group;    // this rank's inner group (the world when one)
  std::shared_ptr<ProcessGroup> replica_group;  // this place in every inner group (none when one)
  /// The rank (in the world) of place `place` of inner group `replica`; all_gather's index.
  int64_t world_rank(int64_t replica, int64_t place) const { return replica * inner + place; }
};

/// Builds the mesh of `world` with `inner` processes per inner group (`world`'s size a multiple
/// of it: the caller checks, with its own words). Collective over `world`; the sub-groups are
/// tagged `inner_tag` and `replica_tag`.
ReplicaMesh make_replica_mesh(const std::shared_ptr<ProcessGroup>& world, int64_t inner,
                              const std::string& inner_tag, const std::string& replica_tag);

/// An all-reduce of one tensor over the processes that average: a process group's, or a
/// strategy's reduce (Fabric).
using AllReduce = std::function<at::Tensor(const at::Tensor&, Reduce)>;

/// Averages `module`'s gradients with `all_reduce`, in module order: every gradient some process
/// has, a process without it taking part with zeros (a parameter a data-dependent forward
/// skipped there, as DDP's unused ones); a gradient no process has stays undefined (another
/// stage's weights, a parameter no forward used: the optimizer skips it, as DDP leaves it). One
/// small all-reduce agrees on the list first, then one per bucket of a dtype (at most 4 Mi
/// elements, so the flat copies stay small).
void average_gradients(const Module& module, const AllReduce& all_reduce);

/// average_gradients over `replica_group` (a mesh's; nothing when null: one replica).
void average_over_replicas(ProcessGroup* replica_group, const Module& module);

/// Strategy::optimizer_step's first half when each rank checked only some of the gradients:
/// unscales them and makes every rank of `world` agree on inf/NaN (a rank that skipped a step
/// the others took would hold a part of another model, or break the next collective).
void unscale_agreeing_on_found_inf(Precision& precision, ProcessGroup& world,
                                   torch::optim::Optimizer& optimizer);

}  // namespace detail
}  // namespace volt
