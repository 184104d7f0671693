#!/usr/bin/env bash
# A GPU session short of device time, ON the GPU machine from the project root with .gpu/
# carried: builds the library and a volt_tests made of the test files that hold CUDA tests only
# (VOLT_TEST_SOURCES_REGEX; no benchmarks, examples or other test files), runs the CUDA and
# graph tests first, then the rest of that binary, until DEADLINE (epoch seconds; default 300 s
# from now). Logs go to $OUT: build.log, subset.log.
#
#   bash scripts/gpu/cuda_subset.sh      # the device tool: carry [".gpu"], timeout_s DEADLINE+10
set -u
export DEADLINE=${DEADLINE:-$(($(date +%s) + 300))}
out=${OUT:-/tmp/out}
mkdir -p "$out"
files='(callbacks/(device_stats_monitor|model_pruning|prediction_writer|tuner_callbacks)|cli/cli'
files+='|distributed/nccl|graphs/|kernels/(fused_linear_cross_entropy|fused_optim_cuda|fused_sdpa_cuda)'
files+='|precision/(mixed_precision|autocast)|trainer/(device_prefetch|graph_training_step|hooks|resume)'
files+='|data/data_loader)[a-z_]*_test[.]cpp$'
TARGETS=volt_tests NO_TESTS=1 CMAKE_ARGS="-DVOLT_TEST_SOURCES_REGEX=$files" bash .gpu/device_build.sh
[ -x build-gpu/tests/volt_tests ] || { echo "volt_tests not built"; tail -30 "$out/build.log"; exit 1; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
cuda='*Cuda*:CudaGraph*:Graph*:WrapInGraph*:DynamicModels*:ExactResume.*:Nccl*'
run() {
  local left=$((DEADLINE - $(date +%s) - 3))
  [ "$left" -le 5 ] && { echo "no time left for $1" | tee -a "$out/subset.log"; return; }
  echo "---- $1 (limit $left s)" >> "$out/subset.log"
  timeout "$left" build-gpu/tests/volt_tests --gtest_filter="$1" >> "$out/subset.log" 2>&1
  echo "rc=$? for $1" | tee -a "$out/subset.log"
}
run "$cuda"
run "-$cuda"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests? ran|Failure|Expected|Which is" "$out/subset.log" |
  grep -v "^\[  SKIPPED \]" | head -60
