#!/usr/bin/env bash
# Every C++ file git tracks (*.cpp, *.h) is as clang-format formats it with the repository's
# .clang-format (Debian bookworm's clang-format 14, which scripts/setup.sh installs). Run by
# ctest (source_is_clang_formatted). To fix what it lists:
#
#   git clang-format --binary clang-format <base>    # only the lines a change touched
#   clang-format -i FILE...                          # whole files
#
#   bash scripts/check_format.sh               # exit 0 when clean, 1 listing the files otherwise
#   bash scripts/check_format.sh --self-test   # the check catches a misformatted file
# Exit 77 (ctest: skipped) without clang-format or outside a git checkout.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cf=${CLANG_FORMAT:-clang-format}
if ! command -v "$cf" > /dev/null; then
  echo "skipped: $cf is not installed (bash scripts/setup.sh installs it)"
  exit 77
fi

if [ "${1:-}" = "--self-test" ]; then
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
  cp "$root/.clang-format" "$dir/"
  printf 'int f(int a) {\n  return a;\n}\n' > "$dir/good.cpp"
  printf 'int  f( int a ){ return a ; }\n' > "$dir/bad.cpp"
  "$cf" --dry-run --Werror "$dir/good.cpp" || { echo "self-test: a formatted file was refused"; exit 1; }
  if "$cf" --dry-run --Werror "$dir/bad.cpp" 2> /dev/null; then
    echo "self-test: a misformatted file passed"
    exit 1
  fi
  echo "self-test: ok"
  exit 0
fi

if ! files=$(cd "$root" && git ls-files '*.cpp' '*.h' 2> /dev/null) || [ -z "$files" ]; then
  echo "skipped: $root is not a git checkout with C++ files"
  exit 77
fi
n=$(wc -l <<< "$files")
# One clang-format over every file; each misformatted line is an error naming its file.
log=$(cd "$root" && xargs "$cf" --dry-run --Werror 2>&1 <<< "$files")
rc=$?
if [ $rc -ne 0 ]; then
  bad=$(grep -oE '^[^:]+:[0-9]+:[0-9]+: error' <<< "$log" | cut -d: -f1 | sort -u)
  [ -n "$bad" ] || { echo "$log" | head -20; exit 1; }
  sed 's/^/not formatted: /' <<< "$bad"
  echo "$(wc -l <<< "$bad") of $n files differ from clang-format; fix: clang-format -i FILE" \
    "(or git clang-format)"
  exit 1
fi
echo "all $n C++ files are clang-formatted"
