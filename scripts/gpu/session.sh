#!/usr/bin/env bash
# A whole GPU session in one command, ON the GPU machine from the project root with .gpu/
# carried (scripts/gpu/prepare.sh): builds volt (if libvolt fails in a part that only a CUDA
# libtorch compiles, it rebuilds with that part switched off, so the rest is still tested and
# the first build's errors are kept in build_first.log), then runs run_cuda_checks.sh; all
# before DEADLINE (epoch seconds; default 570 s from now). Logs go to $OUT.
#
#   bash scripts/gpu/session.sh        # the device tool: carry [".gpu"], timeout_s 590
#   EXPORT_HEADERS=1 bash scripts/gpu/session.sh   # also bring back the wheel's headers
set -u
export DEADLINE=${DEADLINE:-$(($(date +%s) + 570))}
out=${OUT:-/tmp/out}
mkdir -p "$out"
if [ -n "${EXPORT_HEADERS:-}" ]; then
  # The wheel's headers for scripts/gpu/check_syntax.sh here (README.md): one file in $OUT
  # (parts of 15 MiB if it grows), in the foreground, before the build takes the cores.
  bash scripts/gpu/export_headers.sh /tmp/h/hdr.tar.xz && split -b 15M /tmp/h/hdr.tar.xz "$out/hdr.part."
fi
NO_TESTS=1 bash .gpu/device_build.sh
if [ ! -f build-gpu/libvolt.a ]; then
  off=""
  grep -q "FAILED: .*cuda_graph.cpp.o" "$out/build.log" && off+=" -DVOLT_CUDA_GRAPHS=OFF"
  grep -q "FAILED: .*sdpa_cuda.cpp.o" "$out/build.log" && off+=" -DVOLT_CUDA_SDPA=OFF"
  grep -qE "FAILED: .*src/distributed/(process_group|gradient_reducer).cpp.o" "$out/build.log" &&
    off+=" -DVOLT_NCCL=OFF"
  cp "$out/build.log" "$out/build_first.log"
  if [ -n "$off" ]; then
    echo "== libvolt failed in CUDA-only code; rebuilding with$off"
    CMAKE_ARGS="$off" NO_TESTS=1 bash .gpu/device_build.sh
  fi
fi
bash scripts/gpu/run_cuda_checks.sh
