#!/usr/bin/env bash
# Fails when the repository's C++ code calls what volt has replaced, each for a reason:
# - std::filesystem::remove_all (everywhere): the torch 2.x wheels' libtorch.so exports its own
#   copy of it, calls bind to that copy, and it crashes (seen on the H200 machine twice: volt's
#   checkpoint cleanup in session 18, the doc_programs runner in session 48). Use
#   volt::detail::remove_tree (src/core/detail/remove_tree.h), or rm -rf in tests.
# - <cctype>'s classes and case folding (std::isalpha, std::tolower, ...; in src/ and include/):
#   they follow the process's locale (a Turkish one folds i and I otherwise, an 8-bit one counts
#   bytes above 0x7f as letters) and are undefined for a negative char. Use
#   src/core/detail/ascii.h (ascii_lower, ascii_alnum, ...).
# - strtod and its kin (std::stod, atof, ...; in src/ and include/): they read LC_NUMERIC, so
#   under a program's de_DE locale "0.5" stops at the '.'. Use detail::c_strtod
#   (src/core/detail/numbers.h, the one place that calls strtod), or std::from_chars.
# - std's string and file streams made directly (std::ostringstream os; std::ifstream(p); in
#   src/): a stream takes the C++ global locale when it is made, so after the program's
#   std::locale::global(std::locale("")) one writes 1000 as "1.000" and 0.5 as "0,5" under de_DE.
#   Make them with detail::c_stream<std::ostringstream>() (numbers.h): the "C" locale.
#   src/core/detail/state_key.h keeps std::ostringstream on purpose: it must make the same text as
#   libtorch's own optimizer-state keys, which follow the global locale.
# Lines that are comments are skipped.
# Usage: banned_calls.sh <repository root>  |  banned_calls.sh --self-test
set -uo pipefail

# A call: at a line's start, after std:: or ::, or after a character that cannot end a name or
# a member access.
call='(^|std::|[^[:alnum:]_]::|[^[:alnum:]_:.>])'
rule_names=(remove_all cctype strtod streams)
rule_patterns=(
  'remove_all[[:space:]]*\('
  "${call}(is(alpha|alnum|digit|xdigit|space|upper|lower|punct|print|graph|cntrl|blank)|to(lower|upper))[[:space:]]*\\("
  "${call}(strto(d|f|ld)|atof|sto(d|f|ld))[[:space:]]*\\("
  'std::(o|i)?(stringstream|fstream)([[:space:]]*[({]|[[:space:]]+[[:alpha:]_])'
)
rule_dirs=("src include tests benchmarks examples tools" "src include" "src include" "src")
# The files each rule lets call it (relative to the root, space-separated; "" for none).
rule_home=("" "" "src/core/detail/numbers.h" "src/core/detail/state_key.h")
rule_advice=(
  "std::filesystem::remove_all called (use volt::detail::remove_tree or rm -rf)"
  "<cctype> call in the library (use src/core/detail/ascii.h: locale-free, defined for every char)"
  "strtod-family call in the library (use detail::c_strtod of src/core/detail/numbers.h: the C locale)"
  "std string or file stream made in the library (make it with detail::c_stream<std::...>(...) of src/core/detail/numbers.h: the C locale)"
)

check() {
  local root=$1 failed=0 i d h dirs hits
  for i in "${!rule_names[@]}"; do
    dirs=()
    for d in ${rule_dirs[$i]}; do [ -d "$root/$d" ] && dirs+=("$root/$d"); done
    [ ${#dirs[@]} -eq 0 ] && continue
    hits=$(grep -rnE "${rule_patterns[$i]}" --include='*.cpp' --include='*.h' "${dirs[@]}" |
      grep -vE '^[^:]+:[0-9]+:[[:space:]]*//')
    for h in ${rule_home[$i]}; do hits=$(grep -vF "$root/$h:" <<<"$hits"); done
    if [ -n "$hits" ]; then
      echo "${rule_advice[$i]}:"
      echo "$hits"
      failed=1
    else
      echo "no ${rule_names[$i]} calls"
    fi
  done
  return $failed
}

if [ "${1:-}" = "--self-test" ]; then
  # Each rule catches a planted call, and neither a comment nor a member named alike trips it.
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/src"
  printf '// std::tolower(c) in a comment\nbool f(Node* n) { return n->isalpha(1) || is_space(2); }\n' \
    > "$tmp/src/ok.cpp"
  check "$tmp" > /dev/null || { echo "self-test: a comment or a member was flagged"; exit 1; }
  printf 'double c_strtod(const char* t) { return std::strtod(t, nullptr); }\n' \
    > "$tmp/src/home.cpp"
  printf 'std::ostringstream os;\n' > "$tmp/src/home2.cpp"
  printf 'auto os = detail::c_stream<std::ostringstream>();\nvoid f(std::ostringstream& os);\n' \
    > "$tmp/src/made.cpp"
  rule_home[2]=src/home.cpp  # a rule's own files may call it
  rule_home[3]="src/other.cpp src/home2.cpp"
  check "$tmp" > /dev/null || { echo "self-test: a rule's own file was flagged"; exit 1; }
  for planted in 'std::filesystem::remove_all(p);' 'c = std::tolower(c);' \
    'if (isdigit(c)) {}' 'x = ::toupper(c);' 'd = std::strtod(s, &e);' 'd = std::stod(s);' \
    'x = atof(s);' 'std::ostringstream os;' 'std::ifstream in(p);' 'std::ofstream(p) << 1;' \
    'std::stringstream{} << 1;'; do
    printf 'void g() { %s }\n' "$planted" > "$tmp/src/bad.cpp"
    if check "$tmp" > /dev/null; then
      echo "self-test: '$planted' was not caught"
      exit 1
    fi
  done
  echo "self-test passed"
  exit 0
fi

root=${1:?usage: banned_calls.sh <repository root> | --self-test}
check "$root"
