#pragma once
/// FabricSpikeDetection: SpikeDetection for a loop written with Fabric (Lightning's
/// lightning.fabric.utilities.spike.SpikeDetection, reached through fabric.call).

#include <ATen/Tensor.h>

#include <cstdint>

#include "volt/callbacks/spike_detection.h"
#include "volt/fabric/fabric.h"

namespace volt {

/// A Fabric callback ending the program's loop with TrainingSpikeError on every rank when a
/// rank's training loss spikes (SpikeDetector's judging, the Trainer callback's), after writing
/// the batch and the one before it to the JSON list (by default skip_batches.json in the
/// working directory, as Lightning Fabric's). Give it to FabricOptions::callbacks and call it
/// after each training batch, on every rank:
///
///   auto spikes = std::make_shared<volt::FabricSpikeDetection>();
///   volt::Fabric fabric(volt::FabricOptions().callbacks({spikes}));
///   ...
///   fabric.backward(loss);
///   fabric.call(&volt::FabricSpikeDetection::on_train_batch_end, fabric, loss, batch_idx);
///
/// With several processes every call makes one small all-reduce (the ranks agree on the
/// verdict), so every rank must make it for every batch. Its state is not part of a
/// FabricState (as Lightning Fabric's): a loop resumed from a save judges from scratch, warm-up
/// again.
class FabricSpikeDetection : public FabricCallback {
 public:
  explicit FabricSpikeDetection(SpikeDetectionOptions options = SpikeDetectionOptions());
  /// Judges `loss` (the batch's training loss, a one-element tensor; read on the host) of the
  /// batch `batch_idx` (its index within the epoch: what the list holds). Lightning's hook also
  /// takes the batch, which its judging never reads; this one does not.
  void on_train_batch_end(Fabric& fabric, const at::Tensor& loss, int64_t batch_idx);

  const SpikeDetector& detector() const { return detector_; }

 private:
  SpikeDetector detector_;
};

}  // namespace volt
