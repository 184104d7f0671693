#pragma once
// Private: the batch hooks in Lightning's order and selection (its _DataHookSelector), shared by
// the Trainer's Run (every batch) and `volt export` (its example batch).

#include <c10/core/Device.h>
#include <c10/util/Optional.h>

#include <functional>

#include "volt/core/batch.h"

namespace volt {

class DataModule;
class Module;

namespace detail {

/// Runs one hook: `name` is the hook's ("on_before_batch_transfer", or
/// "DataModule.on_before_batch_transfer" for the DataModule's), `fn` the call. The Run times the
/// call and names it in errors; export runs it plainly.
using BatchHookCall = std::function<void(const char* name, const std::function<void()>& fn)>;

/// `raw` through on_before_batch_transfer, transfer_batch_to_device(`device`) and
/// on_after_batch_transfer: each the DataModule's (`data`, may be null) when it overrides it,
/// else the module's. A DataModule default marks that it ran and returns the batch as it came;
/// an override that calls the default and then changes the batch still counts (its batch
/// differs), one that changes nothing lets the module's hook run. Without a `device` (no run:
/// export) the transfer is skipped and the batch stays where the loader made it.
Batch run_batch_hooks(DataModule* data, Module& module, Batch raw,
                      c10::optional<c10::Device> device, const BatchHookCall& call_data,
                      const BatchHookCall& call_module);

}  // namespace detail
}  // namespace volt
