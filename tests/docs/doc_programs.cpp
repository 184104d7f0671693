// Runs the whole programs of the documentation (README's "A short example", ...) that
// generate_doc_snippets.cpp compiled, each in a fresh empty folder: `volt_doc_snippets` runs
// them all, `volt_doc_snippets README.md:65` one. Exit 0 when each returned 0 and created what
// its marker names; the fragments were checked when this binary compiled.

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

#include "doc_scope.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  const fs::path home = fs::current_path();
  int failed = 0, ran = 0;
  std::cout << volt_doc::compiled_blocks() << " documentation blocks compiled\n";
  for (const auto& p : volt_doc::programs()) {
    if (!only.empty() && p.where != only) continue;
    ++ran;
    std::string templ = (fs::temp_directory_path() / "volt_doc_program_XXXXXX").string();
    if (mkdtemp(templ.data()) == nullptr) {
      std::cerr << "cannot create a temporary folder\n";
      return 1;
    }
    const fs::path dir = templ;
    fs::current_path(dir);
    std::cout << "== " << p.where << " (in " << dir.string() << ")" << std::endl;
    int rc = 1;
    try {
      rc = p.run();
    } catch (const std::exception& e) {
      std::cerr << p.where << " threw: " << e.what() << "\n";
    }
    bool ok = rc == 0;
    if (rc != 0) std::cerr << p.where << " returned " << rc << "\n";
    if (ok && !p.creates.empty() && !fs::exists(dir / p.creates)) {
      std::cerr << p.where << " did not create " << p.creates << "\n";
      ok = false;
    }
    fs::current_path(home);
    // Not std::filesystem::remove_all: the torch 2.x wheels' libtorch.so exports its own copy,
    // which crashes (src/core/detail/remove_tree.h); the folder is mkdtemp's, no quoting needed.
    std::system(("rm -rf '" + dir.string() + "'").c_str());
    std::cout << "== " << p.where << (ok ? " passed" : " FAILED") << std::endl;
    if (!ok) ++failed;
  }
  if (!only.empty() && ran == 0) {
    std::cerr << "no documentation program at " << only << "\n";
    return 2;
  }
  return failed == 0 ? 0 : 1;
}
