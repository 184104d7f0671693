#pragma once
/// load_weights: a trained model's weights from a checkpoint, without a Trainer (Lightning's
/// LightningModule.load_from_checkpoint, where the C++ program builds the module itself):
///
///   auto model = std::make_shared<MyModel>(/* the arguments it was trained with */);
///   volt::load_weights(*model, "runs/checkpoints/best.ckpt");
///   model->eval();  // then model->forward(...), or volt::to_torchscript (volt/io/torchscript.h)

#include <memory>
#include <string>

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace volt {

class CheckpointIO;

/// Loads the weights (parameters and buffers, by name, converted to each one's dtype and device)
/// of the checkpoint at `path` into `module`:
/// - a checkpoint file the Trainer wrote (ModelCheckpoint, Trainer::save_checkpoint,
///   OnExceptionCheckpoint), by any strategy and world size, read with `io` (default: volt's
///   TorchCheckpointIO; pass the one the run used if it had another);
/// - a ZeRO checkpoint folder (DeepSpeedStrategy's, every rank's shard), consolidated on the way;
/// - a `.safetensors` file (save_safetensors, SafetensorsPredictionWriter's weights, Python's
///   safetensors).
/// For a volt::Module its `on_load_checkpoint` then reads what its `on_save_checkpoint` wrote
/// (checkpoint files and folders). strict: every name must match both ways with equal shapes,
/// else CheckpointError listing every mismatch; false loads the names that match. A missing or
/// unreadable path, or a file volt's Trainer did not write, is a CheckpointError.
void load_weights(torch::nn::Module& module, const std::string& path, bool strict = true,
                  std::shared_ptr<CheckpointIO> io = nullptr);

}  // namespace volt
