// Registers this folder's built-in names; called once from registry() (src/trainer/builtins.cpp).
#include "volt/core/registry.h"
#include "volt/io/async_checkpoint_io.h"
#include "volt/io/checkpoint_io.h"

namespace volt::detail {

void register_checkpoint_ios(Registry& r) {
  r.checkpoint_ios.add(
      "TorchCheckpointIO",
      "volt's checkpoint files (CRC-checked), written atomically before save "
      "returns",
      []() -> std::shared_ptr<CheckpointIO> { return std::make_shared<TorchCheckpointIO>(); });
  const AsyncCheckpointIOOptions a;
  r.checkpoint_ios.add(
      "AsyncCheckpointIO",
      "TorchCheckpointIO's files, serialised at save and written + fsync'ed in the background",
      Params()
          .add("max_pending", a.max_pending(),
               "checkpoints written in the background at once; a save beyond waits")
          .add("reuse_buffer", a.reuse_buffer(),
               "serialise each save into the last written checkpoint's memory (kept between "
               "saves)"),
      [](const Args& args) -> std::shared_ptr<CheckpointIO> {
        return std::make_shared<AsyncCheckpointIO>(
            AsyncCheckpointIOOptions()
                .max_pending(args.get<int64_t>("max_pending"))
                .reuse_buffer(args.get<bool>("reuse_buffer")));
      });
}

}  // namespace volt::detail
