#!/usr/bin/env bash
# Compiler launcher: every compile goes through ccache, and each precompiled header gets a content
# checksum beside it so that the TUs using it hit the cache in a fresh clone.
#
# Why: GCC writes a different .gch every time it builds one (same sources, same flags: the bytes
# differ even in the same folder), and ccache hashes the .gch into the key of every TU that
# includes it. So a fresh clone (CI) rebuilt the PCH and then missed the cache for every TU that
# uses it, though nothing had changed. With ccache's `pch_external_checksum` option, ccache
# hashes `<pch>.gch.sum` instead of the .gch; this script writes there a digest of what the .gch is
# made of: the compile command with the source and build folders taken out, and the name and
# contents of every file the compile read (from its -MF dependency file).
#
# Usage (CMake sets it): compiler_launcher.sh CCACHE SOURCE_DIR BINARY_DIR COMPILER ARGS...
set -uo pipefail
ccache=$1 source_dir=$2 binary_dir=$3
shift 3
sloppiness="pch_defines,time_macros,include_file_mtime,include_file_ctime"
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:+$CCACHE_SLOPPINESS,}$sloppiness"
export CCACHE_PCH_EXTSUM=true
# Paths relative to the source folder hash the same in every clone.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$source_dir}"

header=0 out="" dep=""
prev=""
for a in "$@"; do
  case "$prev" in
    -x) [ "$a" = c++-header ] && header=1 ;;
    -o) out=$a ;;
    -MF) dep=$a ;;
  esac
  prev=$a
done
if [ "$header" = 0 ] || [ -z "$out" ] || [ -z "$dep" ]; then
  exec "$ccache" "$@"
fi

# A precompiled header: ccache does not cache these anyway, so run the compiler itself.
rm -f "$out.sum"
"$@" || exit $?
normalise() { sed -e "s|$binary_dir|<build>|g" -e "s|$source_dir|<source>|g"; }
# The dependency file: "target: dep dep \" lines; paths have no spaces here (system and volt
# headers); if one had, the digest would only be over-specific (a cache miss, never a wrong hit).
deps=$(sed -e 's/\\$//' -e 's/^[^:]*://' "$dep" | tr -s ' \t' '\n\n' | sed '/^$/d') || exit 0
{
  printf '%s\n' "$@" | normalise
  printf '%s\n' "$deps" | normalise
  # shellcheck disable=SC2086 # one path per word
  cat $deps
} | sha256sum >"$out.sum.tmp" && mv "$out.sum.tmp" "$out.sum"
exit 0
