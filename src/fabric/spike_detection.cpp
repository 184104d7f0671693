#include "volt/fabric/spike_detection.h"

#include <filesystem>
#include <string>

namespace volt {

FabricSpikeDetection::FabricSpikeDetection(SpikeDetectionOptions options)
    : detector_(std::move(options)) {}

void FabricSpikeDetection::on_train_batch_end(Fabric& fabric, const at::Tensor& loss,
                                              int64_t batch_idx) {
  SpikeSite site;
  site.batch_idx = batch_idx;
  site.root = std::filesystem::current_path().string();  // Lightning Fabric's default
  site.writes = fabric.is_global_zero();
  if (fabric.world_size() > 1) {
    site.any_rank = [&fabric](bool spike_here) {
      return fabric.strategy().reduce_boolean_decision(spike_here, /*all=*/false);
    };
  }
  detector_.judge(loss, site);
}

}  // namespace volt
