#pragma once
/// The shared vocabulary: small enums and aliases that every layer of volt uses. This header
/// sits at the bottom of the include graph (it includes nothing of volt), so components can
/// name stages, statuses and metrics without depending on the Trainer.

#include <cstdint>
#include <map>
#include <string>

namespace volt {

/// What the Trainer is doing.
enum class Stage { kNone, kFit, kValidate, kTest, kPredict, kSanityCheck };
/// How the current or last run ended.
enum class RunStatus { kInitializing, kRunning, kFinished, kInterrupted, kFailed };

const char* to_string(Stage s);
const char* to_string(RunStatus s);

/// Metrics visible to callbacks (monitor keys) and returned by validate()/test().
using Metrics = std::map<std::string, double>;

/// How a logged value is aggregated across an epoch (and across ranks with sync_dist).
enum class Reduce { kMean, kSum, kMax, kMin };

/// Gradient clipping algorithms (Lightning's "norm" and "value").
enum class ClipAlgorithm { kNorm, kValue };
/// "norm" or "value".
const char* to_string(ClipAlgorithm a);

/// When a scheduler steps: after every `frequency` optimizer steps, or every `frequency` epochs.
enum class Interval { kStep, kEpoch };

}  // namespace volt
