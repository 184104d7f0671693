#pragma once
/// Fp32Precision: full fp32 training ("32-true", also "32").

#include "volt/precision/precision.h"

namespace volt {

/// Full fp32 training ("32-true", also "32").
class Fp32Precision : public Precision {
 public:
  std::string name() const override { return "32-true"; }
};

}  // namespace volt
