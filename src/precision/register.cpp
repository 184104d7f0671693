// Registers this folder's built-in names; called once from registry() (src/trainer/builtins.cpp).
#include "volt/core/registry.h"
#include "volt/precision/fp32.h"

namespace volt::detail {

void register_precisions(Registry& r) {
  r.precisions.add("32-true", "fp32 weights and compute",
                   [] { return std::make_shared<Fp32Precision>(); });
  r.precisions.add("32", "same as 32-true", [] { return std::make_shared<Fp32Precision>(); });
}

}  // namespace volt::detail
