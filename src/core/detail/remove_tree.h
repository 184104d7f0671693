#pragma once
// Private: removing a folder tree without std::filesystem::remove_all.

#include <string>

namespace volt {
namespace detail {

/// Removes `path` and everything under it (symbolic links themselves, never their targets);
/// true when nothing is left at `path`. volt does not call std::filesystem::remove_all: the torch
/// 2.x wheels' libtorch.so exports its own copy of it, calls bind to that copy, and it jumps to
/// a null address (seen on the H200 machine, 2026-11-26, torch 2.11.0+cu130).
bool remove_tree(const std::string& path);

}  // namespace detail
}  // namespace volt
