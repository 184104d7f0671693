#!/usr/bin/env bash
# Compiles volt sources here, on the development machine, against the headers of the GPU
# machine's torch 2.x + CUDA (-fsyntax-only: types and signatures are checked, nothing links or
# runs), so CUDA-only code and 1.13/2.x API differences fail here instead of in a GPU session's
# build. The headers come from that machine: scripts/gpu/export_headers.sh packs them; unpack
# the archive into a folder and name it in VOLT_GPU_HEADERS (default
# /root/gpu-headers/torch-2.11-cu130, unpacked there on 2026-11-26).
#
#   bash scripts/gpu/check_syntax.sh                      # every src/**/*.cpp, 2 at a time
#   bash scripts/gpu/check_syntax.sh src/graphs/cuda_graph.cpp tests/graphs/cuda_graph_test.cpp
#   bash scripts/gpu/check_syntax.sh --host [files]     # against this machine's libtorch (1.13)
#   GLOO=0 bash scripts/gpu/check_syntax.sh src/distributed/*.cpp   # NCCL only, as the GPU build
#
# Without the precompiled header, so a file that uses what it does not include fails (the
# build's PCH hides that; -DVOLT_USE_PCH=OFF builds then break).
#
# Flags are those of the GPU build (its compile_commands.json, 2026-11-26) less the precompiled
# header; the Gloo branch of src/distributed is checked too when Debian's gloo headers are here
# (the wheel has none, so that branch never compiles on the GPU machine).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
common=(-std=c++17 -fsyntax-only -O2 -Wall -Wextra -Wno-unused-parameter
  -DVOLT_BENCH_DIR='"benchmarks"' -DVOLT_SOURCE_DIR='"."' -DVOLT_RESUME_WORKER='"w"'
  -DVOLT_CLI_BINARY='"w"' -DVOLT_DIST_WORKER='"w"' -DVOLT_DDP_WORKER='"w"' -DVOLT_TP_WORKER='"w"')
if [ "${1:-}" = "--host" ]; then
  shift
  what="this machine's libtorch (/usr/include)"
  flags=("${common[@]}" -DUSE_C10D_GLOO -DUSE_DISTRIBUTED -isystem /usr/include/torch/csrc/api/include)
  # Debian's package omits this c10d header; the build's shim stands in (CMakeLists.txt).
  [ -f /usr/include/torch/csrc/distributed/autograd/context/context.h ] ||
    flags+=(-I"$root/src/distributed/shim")
else
  h=${VOLT_GPU_HEADERS:-/root/gpu-headers/torch-2.11-cu130}
  [ -f "$h/tmp/h/VERSION" ] || {
    echo "[check_syntax] no exported headers in $h; run scripts/gpu/export_headers.sh on the" \
      "GPU machine and unpack its archive there (or set VOLT_GPU_HEADERS)." >&2
    exit 2
  }
  what="torch $(sed -n 1p "$h/tmp/h/VERSION")"
  t=$h$(sed -n 2p "$h/tmp/h/VERSION")/include
  flags=("${common[@]}" -DUSE_C10D_GLOO -DUSE_C10D_NCCL -DUSE_DISTRIBUTED -DUSE_RPC
    -DUSE_TENSORPIPE -DVOLT_CUDA -isystem "$t" -isystem "$t/torch/csrc/api/include"
    -isystem "$h/usr/local/cuda/include")
  # nccl.h as CMake finds it there (the wheel's nvidia/nccl package): the NCCL process group.
  nccl=$(find "$h" -path '*nvidia/nccl/include/nccl.h' 2>/dev/null | head -1)
  [ -n "$nccl" ] && flags+=(-DVOLT_HAVE_NCCL_HEADERS -isystem "$(dirname "$nccl")")
fi
flags+=(-I"$root/include" -I"$root/src" -I"$root/tests/support" -I"$root/tests" -I"$root/benchmarks"
  -I"$root/examples")
# GLOO=0 leaves the Gloo branch out, as on the GPU machine (NCCL alone).
[ -f /usr/include/gloo/config.h ] && [ "${GLOO:-1}" != 0 ] && flags+=(-DVOLT_HAVE_GLOO_HEADERS)
if [ $# -eq 0 ]; then
  mapfile -t files < <(cd "$root" && find src -name '*.cpp' | sort)
else
  files=("$@")
fi
echo "[check_syntax] $what, ${#files[@]} file(s)"
export root
printf '%s\n' "${files[@]}" | (cd "$root" && xargs -P "${JOBS:-2}" -I{} sh -c \
  'g++ "$@" {} 2> /tmp/check_syntax.$$.log && echo "ok   {}" || { echo "FAIL {}"; grep -E "error" /tmp/check_syntax.$$.log | head -20; }; rm -f /tmp/check_syntax.$$.log' \
  sh "${flags[@]}") | tee /tmp/check_syntax.out
! grep -q '^FAIL' /tmp/check_syntax.out
