#pragma once
// Private: saving and restoring the default random generators of some devices (the CPU's and
// GPUs'), through the device-generic context API (no CUDA headers). Activation checkpointing
// replays a forward's random draws with them; the tuners' trials put the random state back.

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <mutex>
#include <vector>

namespace volt {
namespace detail {

struct RngState {
  c10::Device device;
  at::Tensor state;
};

/// The state of each device's default generator.
inline std::vector<RngState> get_rng_states(const std::vector<c10::Device>& devices) {
  std::vector<RngState> out;
  for (const auto& d : devices) {
    auto gen = at::globalContext().defaultGenerator(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    out.push_back({d, gen.get_state()});
  }
  return out;
}

/// Puts states from get_rng_states back.
inline void set_rng_states(const std::vector<RngState>& states) {
  for (const auto& s : states) {
    auto gen = at::globalContext().defaultGenerator(s.device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(s.state);
  }
}

}  // namespace detail
}  // namespace volt
