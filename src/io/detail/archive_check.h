#pragma once
// Checks a torch::serialize archive (the payload of a volt checkpoint) before libtorch parses it.
//
// libtorch 1.13's reader trusts the archive: a CRC-valid but forged payload can make its
// unpickler allocate whatever a length field claims (up to 4 GiB for a string, a vector of
// 2^33 IValues for a memo index) and make its TorchScript importer dereference null while
// reporting a parse error in the archive's code section (docs/HARDENING.md, found by
// fuzz/envelope_fuzzer.cpp). This check accepts exactly what torch::serialize::OutputArchive
// writes and refuses the rest with a CheckpointError, so libtorch only sees archives of that
// shape:
//   - the ZIP container: one root folder, stored or deflated records inside the payload, no
//     duplicate names, declared sizes equal to the real ones (deflated records are inflated
//     here, so no record claims more memory than its bytes make);
//   - every pickle (*.pkl, *.debug_pkl): known opcodes whose lengths fit the record, memo
//     indices assigned in order, ending in STOP;
//   - every code file (code/**.py): only the lines the archive writer prints, a class header
//     `class Module(Module):` followed by `__parameters__ = [...]`, `__buffers__ = [...]`,
//     `name : Type`, `__annotations__ = []` and `__annotations__["name"] = Type`, with types
//     built from TorchScript's builtin names and the archive's own classes.

#include <cstddef>
#include <string>

namespace volt {
namespace detail {

/// Throws CheckpointError naming `path` and the first problem found; returns when the `size`
/// bytes at `data` have the shape described above.
void check_torch_archive(const char* data, size_t size, const std::string& path);

/// Whether `name` is a word TorchScript's lexer reserves (if, in, class, None, ...): as the name
/// of a nested archive or an attribute it makes an archive libtorch cannot read back, so names
/// a program chooses are refused before they are written.
bool is_torchscript_keyword(const std::string& name);

}  // namespace detail
}  // namespace volt
