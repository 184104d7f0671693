#!/usr/bin/env bash
# Step 3 of a GPU run, ON the GPU machine after `NO_TESTS=1 bash .gpu/device_build.sh`
# (build-gpu/ exists): the CUDA-specific tests, the CUDA benchmarks side by side (volt, a hand
# libtorch loop, plain PyTorch and PyTorch Lightning; CUDA graphs; ops per step), the graphed
# training example, then the whole ctest suite for the time that is left. Each stage has a
# time limit, cut to what is left before DEADLINE (epoch seconds; default: 600 s from now), so
# one slow stage cannot eat the others. Logs go to $OUT (default /tmp/out): cuda_tests.log,
# bench.log, ctest.log.
#
#   export DEADLINE=$(( $(date +%s) + 570 ))
#   NO_TESTS=1 bash .gpu/device_build.sh; bash scripts/gpu/run_cuda_checks.sh
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
b=build-gpu
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
# The C++ benchmarks raise glibc's mmap and trim thresholds for every contender
# (benchmarks/host_memory.h); the Python contenders get the same through their environment
# (${py[@]}), and nothing else does (the tests check what volt does with the defaults).
py=(env MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=536870912 python3)
deadline=${DEADLINE:-$(($(date +%s) + 600))}

# stage LIMIT LOG COMMAND...: runs COMMAND for at most LIMIT s (less if less is left), appending
# its output to $out/LOG.
stage() {
  local limit=$1 log=$2 left
  shift 2
  left=$((deadline - $(date +%s) - 5))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 5 ]; then
    echo "skipped, no time left: $*" | tee -a "$out/$log"
    return
  fi
  echo "---- $* (limit ${limit} s)" >> "$out/$log"
  timeout "$limit" "$@" >> "$out/$log" 2>&1
  echo "rc=$? for $*" | tee -a "$out/$log"
}

# The graph tests (the graphed Trainer step, CUDA attention), then the older CUDA-specific tests
# and those that failed on the first GPU run.
graphs='CudaGraph*:GraphedCallable*:GraphedModule*:WrapInGraph*:DynamicModels*:GraphKey.*'
graphs+=':GraphCache.*:GraphTrainingStep*:FusedSdpaCuda.*:FusedLinearCrossEntropy*'
older='FusedOptimCuda.*:ExactResume.*:HostAllocator.*:FusedBiasActivation.*:AutocastOps.*'
older+=':PerfScan.*:Fp8InferenceCli.*:FusedClipNorm.*:FusedAdamW.Trainer*'
# The CPU bf16 fused-optimizer tests, which failed against 2.11 until its rounding was modelled.
older+=':BFloat16VsTorch.*:*bf16*:FusedAdamW.CheckpointsMoveToAndFromTorchAdamW:Gpt2.*'
echo "== CUDA and graph tests"
# New first: what session 48 fixed on the CPU after its GPU run found it failing there (a pty
# race in the progress bar, the 16-mixed test's device expectation) and the device prefetch
# after its host-tensor change (2026-11-29). The rest of session 48's fixes (one-process
# DeepSpeed parts without Gloo, doc_programs, torchrun.sh) run in the ctest stage.
# NEW_TESTS overrides that filter; NEW_TESTS= (empty) skips the stage.
new=${NEW_TESTS-'ProgressBar.*:MixedPrecisionCuda.*:DevicePrefetch*'}
[ -n "$new" ] && stage 150 cuda_tests.log $b/tests/volt_tests --gtest_filter="$new"
# NEW_ONLY=1 leaves the older CUDA tests to the ctest stage at the end (each test its own
# process there), and skips the benchmarks measured before.
if [ -z "${NEW_ONLY:-}" ]; then
# Alone first: it checks that torch prints no "AccumulateGrad" stream warning, which torch
# prints once per process.
stage 30 cuda_tests.log $b/tests/volt_tests \
  --gtest_filter='GraphTrainingStepCuda.ManualOptimizationCapturedByTheModuleEqualsEagerFit'
stage 60 cuda_tests.log $b/tests/volt_tests --gtest_filter="$graphs"
stage 50 cuda_tests.log $b/tests/volt_tests --gtest_filter="$older"
fi
# Two bf16 FusedSGD tests failed at 2 threads (2026-11-27): libtorch's reference moved with its
# thread count; since then it steps with one thread. Checked here against 2.11 at 2 threads.
OMP_NUM_THREADS=2 stage 30 cuda_tests.log $b/tests/volt_tests \
  --gtest_filter='FusedSGD/SgdVsTorch.EveryStepMatches/*bf16'
grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests? ran|Failure|max diff|Expected|Which is" \
  "$out/cuda_tests.log" | head -80

echo "== benchmarks"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/bench.log"
# What the last run left open comes first; the stages cut what runs past the deadline, and
# ctest keeps RESERVE_FOR_CTEST seconds. On the H200 (2026-11-26) the build took 167-192 s.
RESERVE_FOR_CTEST=${RESERVE_FOR_CTEST:-90}
deadline_saved=$deadline
deadline=$((deadline - RESERVE_FOR_CTEST))
# valid_seq_len through FlashAttention's variable-length kernel against masked SDPA at 50%
# padding on average (#14's goal: >= 1.5x; 2026-11-27: 1.71-1.83x at L=2048, 1.21-1.34x at
# L=1024, where the packing's element-wise gathers and scatters took 48% of the GPU time; since
# session 48 they move 8-byte words). The trace records three calls at L=1024.
# NEW_ONLY=1: the benchmarks measured in earlier sessions are skipped (their figures are in
# docs/PERFORMANCE.md; session 48 measured the two below), leaving the device time to ctest.
if [ -z "${NEW_ONLY:-}" ]; then
stage 60 bench.log $b/benchmarks/volt_bench_fused_sdpa_cuda --varlen --reps 5 --max-seq 8192 \
  --trace "$out/varlen.json"
stage 20 bench.log python3 tools/kernel_table.py "$out/varlen.json" --names varlen --top 25
# The next batch copied on a side stream while the step runs (prefetch_to_device, #14), against
# pageable and pinned batches copied in their turn (session 48).
stage 60 bench.log $b/benchmarks/volt_bench_prefetch_cuda --rounds 3 --steps 60
# ZeRO on one GPU (#12): stages 1-3 over NCCL and ZeRO-Offload against the single-device fit and
# DDP, fp32 and bf16-mixed: ms/step, the GPU's peak allocated bytes, the engine's bytes by kind.
stage 150 bench.log $b/benchmarks/volt_bench_zero_cuda --threads 8
# GPT-2 124M, bf16-mixed, batch 16 x 1024: volt fit, the fit with the fused output layer and
# loss (its vocabulary padded to 50,304 inside it on CUDA, and unpadded) and a hand loop (#14's
# goal: >= 1.1x Lightning; 1.00x on 2026-11-27, both running the same 935 kernels per step,
# 43% of the GPU time in the unaligned vocabulary GEMMs). The trace is the hand loop's.
stage 110 bench.log $b/benchmarks/volt_bench_gpt2 --trace "$out/gpt2_cpp.json"
# Plain PyTorch and Lightning on the same GPT-2 (2026-11-27: 226,349 and 226,080 tokens/s, volt
# fit 226,379). Each writes a kineto trace of 3 steps of its plain loop; tools/kernel_table.py
# sets the two side by side, kernel by kernel.
stage 120 bench.log "${py[@]}" benchmarks/gpt2.py --trace "$out/gpt2_py.json"
stage 20 bench.log python3 tools/kernel_table.py "$out/gpt2_cpp.json" "$out/gpt2_py.json" \
  --names cpp python --top 40
gzip -f "$out"/gpt2_*.json 2>/dev/null
# The CNN with cuDNN autotuning on every side (#14's goal, >= 2x Lightning: 2.54x with volt's
# fused Adam on 2026-11-27, 1.82x with torch::optim::Adam). Every side also runs a fused Adam
# (volt::FusedAdamW in Adam mode; torch.optim.Adam(fused=True)): Python's default Adam on CUDA
# is multi-tensor (foreach), C++'s torch::optim::Adam launches per parameter.
stage 50 bench.log $b/benchmarks/volt_bench_cuda_loop --rounds 2 --cnn-steps 500 --only cnn --cudnn-benchmark
stage 90 bench.log "${py[@]}" benchmarks/cuda_loop.py --rounds 2 --cnn-steps 500 --only cnn --cudnn-benchmark
# The graphed example (torch 2.11's "AccumulateGrad node's stream does not match" warning, gone
# since 2026-11-26, is grepped below).
stage 30 bench.log $b/examples/volt_graphed_training /usr/share/datasets/fashion-mnist 2
# Measured before (H200, 2026-11-26), rerun for the same-run comparison while time is left: the
# side by side with a hand loop, plain PyTorch and Lightning (same data, Adam), the graphs, ops
# per step, attention.
stage 80 bench.log $b/benchmarks/volt_bench_cuda_loop --rounds 2 --mlp-steps 1000 --cnn-steps 500
stage 120 bench.log "${py[@]}" benchmarks/cuda_loop.py --rounds 2 --mlp-steps 1000 --cnn-steps 500
stage 70 bench.log $b/benchmarks/volt_bench_cuda_graphs --rounds 3 --steps 1000
stage 40 bench.log $b/benchmarks/volt_bench_step_ops --accelerator cuda --steps 300
stage 40 bench.log $b/benchmarks/volt_bench_fused_sdpa_cuda --reps 10
fi
deadline=$deadline_saved
gzip -f "$out"/varlen.json 2>/dev/null
cat "$out/bench.log"
echo "== torch warnings about AccumulateGrad streams (none expected)"
grep -h "AccumulateGrad" "$out/bench.log" "$out/cuda_tests.log" | head -5

echo "== the whole suite (ctest, until the deadline)"
limit=$((deadline - $(date +%s) - 5))
if [ "$limit" -gt 10 ]; then
  (cd $b && OMP_NUM_THREADS=2 timeout "$limit" ctest -j16 --timeout 120 \
    --output-on-failure > "$out/ctest.log" 2>&1)
  echo "ctest rc=$?"
  grep -E "tests passed|\*\*\*Failed|\*\*\*Timeout|Not Run|\*\*\*Exception" "$out/ctest.log" | head -60
else
  echo "ctest skipped: no time left"
fi
