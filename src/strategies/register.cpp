// Registers this folder's built-in names; called once from registry() (src/trainer/builtins.cpp).
#include "volt/core/registry.h"
#include "volt/strategies/ddp.h"
#include "volt/strategies/single_device.h"

namespace volt::detail {

void register_strategies(Registry& r) {
  r.strategies.add("single_device", "one process on one device",
                   [](const StrategyContext& c) -> std::shared_ptr<Strategy> {
                     return std::make_shared<SingleDeviceStrategy>(c.accelerator->device(0),
                                                                   c.accelerator, c.precision);
                   });
  const DdpStrategyOptions d;
  r.strategies.add(
      "ddp", "distributed data parallel: one process per device, gradients all-reduced (c10d)",
      Params()
          .add("bucket_cap_mb", d.bucket_cap_mb(), "gradient bucket size in MiB")
          .add("gradient_as_bucket_view", d.gradient_as_bucket_view(),
               "each .grad is a view into its bucket")
          .add("static_graph", d.static_graph(), "the used parameters never change")
          .add("find_unused_parameters", d.find_unused_parameters(),
               "find parameters without a gradient each step")
          .add("broadcast_buffers", d.broadcast_buffers(),
               "broadcast buffers from rank 0 before every training forward")
          .add("timeout_s", d.timeout_s(), "bound on rendezvous and every collective (seconds)")
          .add("max_restarts", d.max_restarts(),
               "relaunch the local workers after a failure, resuming from the last checkpoint")
          .choice("process_group_backend", d.process_group_backend(), {"auto", "gloo", "nccl"},
                  "collective backend; auto = gloo on cpu, nccl on cuda"),
      [](const Args& a, const StrategyContext& c) -> std::shared_ptr<Strategy> {
        return std::make_shared<DdpStrategy>(
            DdpStrategyOptions()
                .bucket_cap_mb(a.get<double>("bucket_cap_mb"))
                .gradient_as_bucket_view(a.get<bool>("gradient_as_bucket_view"))
                .static_graph(a.get<bool>("static_graph"))
                .find_unused_parameters(a.get<bool>("find_unused_parameters"))
                .broadcast_buffers(a.get<bool>("broadcast_buffers"))
                .timeout_s(a.get<double>("timeout_s"))
                .process_group_backend(a.get<std::string>("process_group_backend"))
                .max_restarts(a.get<int64_t>("max_restarts")),
            c.accelerator, c.precision, c.devices, c.num_nodes);
      });
}

}  // namespace volt::detail
