#!/usr/bin/env bash
# The documentation-snippet generator (generate_doc_snippets.cpp): each marker mode lands where it
# should, and each malformed block or marker is refused with its file and line (exit 1).
set -euo pipefail
gen=$(realpath "$1")
work=$(mktemp -d /tmp/volt_doc_gen_XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "FAIL: $*"; exit 1; }

# Every mode, and a block of another language that is left alone.
cat > good.md <<'MD'
Text.

```cpp
int n = 1;
```

<!-- doc-test: body returns int -->
```cpp
#include <vector>
return 2;
```

<!-- doc-test: member -->
```c++
int three() { return 3; }
```

<!-- doc-test: file -->
```cpp
int four() { return 4; }
```

<!-- doc-test: program creates out.txt -->
```cpp
int main() { return 0; }
```

<!-- doc-test: skip needs a GPU -->
```cpp
this is not C++
```

```bash
echo not C++
```
MD
"$gen" "$work" out.cpp good.md > log.txt || fail "good.md refused: $(cat log.txt)"
grep -q "5 blocks compiled, 1 skipped" log.txt || fail "counts: $(cat log.txt)"
grep -q '^#include <vector>$' out.cpp || fail "the include was not hoisted"
grep -q '^namespace doc_good_md_3 {$' out.cpp || fail "no namespace for the body block"
grep -q '^void Fragment::run() {$' out.cpp || fail "the default mode is not a void body"
grep -q '^int Fragment::run() {$' out.cpp || fail "body returns int"
grep -q '^#line 4 "good.md"$' out.cpp || fail "no #line to the Markdown"
grep -q '^using namespace volt_doc;$' out.cpp || fail "file mode does not see doc_scope.h"
grep -q '{"good.md:24", "out.txt", \[\] { return volt_doc::call_main(&doc_good_md_24::main); }}' \
  out.cpp || fail "the program is not in the table: $(grep -n call_main out.cpp)"
grep -q "this is not C++" out.cpp && fail "a skipped block was compiled"
grep -q "echo not C++" out.cpp && fail "a bash block was compiled"
grep -q "// good.md:29 skipped: needs a GPU" out.cpp || fail "the skip reason is not recorded"
grep -q "compiled_blocks() { return 5; }" out.cpp || fail "compiled_blocks"

# Unchanged input: the output is not rewritten (nothing recompiles).
before=$(stat -c %Y.%y out.cpp)
sleep 1
"$gen" "$work" out.cpp good.md > /dev/null
[ "$before" = "$(stat -c %Y.%y out.cpp)" ] || fail "an unchanged output was rewritten"

# Malformed input: exit 1 and "FILE:LINE: what".
refused() {  # name, expected message, Markdown
  printf '%s\n' "$3" > "$1.md"
  if "$gen" "$work" "$1.out" "$1.md" > /dev/null 2> err.txt; then fail "$1.md accepted"; fi
  grep -qF "$2" err.txt || fail "$1.md: expected '$2', got '$(cat err.txt)'"
}
refused unknown 'unknown.md:1: unknown doc-test mode "bdy"; use body, member, file, program' \
  $'<!-- doc-test: bdy -->\n```cpp\nint x;\n```'
refused unclosed 'unclosed.md:2: this ```cpp block is never closed' $'Text.\n```cpp\nint x;'
refused noreason 'noreason.md:1: "skip" needs a reason' $'<!-- doc-test: skip -->\n```cpp\n```'
refused bodyarg 'bodyarg.md:1: "body" takes only "returns TYPE", got "int"' \
  $'<!-- doc-test: body int -->\n```cpp\n```'
refused progarg 'progarg.md:1: "program" takes only "creates PATH"' \
  $'<!-- doc-test: program makes x -->\n```cpp\n```'
refused filearg 'filearg.md:1: "file" takes no argument' $'<!-- doc-test: file x -->\n```cpp\n```'
refused twolines 'twolines.md:1: a doc-test marker is one line' \
  $'<!-- doc-test: body\n-->\n```cpp\n```'
refused astray 'astray.md:1: a doc-test marker belongs on the line before a ```cpp fence' \
  $'<!-- doc-test: file -->\nText.\n```cpp\n```'
if "$gen" "$work" x.cpp missing.md > /dev/null 2> err.txt; then fail "a missing file accepted"; fi
grep -qF "missing.md: cannot be read" err.txt || fail "missing file: $(cat err.txt)"
echo "generator ok"
