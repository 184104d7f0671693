#pragma once
// Facts about this machine that volt's on-disk caches are keyed and placed by (the bf16 probe,
// the JIT's kernel cache). No torch includes.

#include <string>

namespace volt {
namespace detail {

/// Folder of volt's per-machine caches: $VOLT_CACHE_DIR, else $XDG_CACHE_HOME/volt, else
/// ~/.cache/volt; "" when none of those variables is set.
std::string volt_cache_dir();

/// The CPU's "model name" from /proc/cpuinfo, or "unknown cpu".
std::string cpu_model_name();

/// 64-bit FNV-1a of `s` as 16 hex digits: a file name that stays the same across builds and
/// runs (std::hash need not).
std::string stable_hash_hex(const std::string& s);

}  // namespace detail
}  // namespace volt
