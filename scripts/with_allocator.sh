#!/usr/bin/env bash
# Runs a command with the chosen host memory allocator (the process's malloc), preloaded with
# LD_PRELOAD as the reference's "Switch Host Memory Allocator" describes. volt logs the allocator
# it finds once at the start of a run ("[volt] info: [Trainer] host allocator: ...").
# Usage: scripts/with_allocator.sh default|jemalloc|tcmalloc COMMAND [ARGS...]
#   default   the C library's malloc (jemalloc or tcmalloc already in LD_PRELOAD are removed)
#   jemalloc  libjemalloc.so.2 (Debian libjemalloc2)
#   tcmalloc  libtcmalloc_minimal.so.4 (Debian libtcmalloc-minimal4)
# scripts/setup.sh installs both libraries. Exit 2: unknown name, library missing, no command.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: scripts/with_allocator.sh default|jemalloc|tcmalloc COMMAND [ARGS...]" >&2
  exit 2
fi
allocator="$1"
shift
case "$allocator" in
  default) lib="" ;;
  jemalloc) lib="libjemalloc.so.2" ;;
  tcmalloc) lib="libtcmalloc_minimal.so.4" ;;
  *)
    echo "scripts/with_allocator.sh: unknown allocator '$allocator'; use default, jemalloc or" \
      "tcmalloc." >&2
    exit 2
    ;;
esac

# Whatever allocator LD_PRELOAD already names goes, so exactly one is in force.
preload=""
for entry in ${LD_PRELOAD:-}; do
  case "$entry" in
    *jemalloc* | *tcmalloc*) ;;
    *) preload="${preload:+$preload }$entry" ;;
  esac
done

if [ -n "$lib" ]; then
  path=$( (/sbin/ldconfig -p 2>/dev/null || true) | awk -v l="$lib" '$1 == l {print $NF; exit}')
  if [ -z "$path" ]; then
    for dir in /usr/lib/*-linux-gnu /lib/*-linux-gnu /usr/lib /lib; do
      if [ -e "$dir/$lib" ]; then
        path="$dir/$lib"
        break
      fi
    done
  fi
  if [ -z "$path" ]; then
    echo "scripts/with_allocator.sh: $allocator ($lib) is not installed; run scripts/setup.sh" \
      "(installs libjemalloc2 and libtcmalloc-minimal4)." >&2
    exit 2
  fi
  preload="$path${preload:+ $preload}"
fi

if [ -n "$preload" ]; then
  exec env LD_PRELOAD="$preload" "$@"
fi
exec env -u LD_PRELOAD "$@"
