# Runtime options for volt's sanitized builds. Source it: `source scripts/sanitizers/env.sh
# address` (ASan+UBSan, build-asan/) or `... thread` (TSan, build-tsan/). scripts/build.sh and
# scripts/test.sh --sanitize=... do. Every report is fatal, so a test that triggers one fails.
# docs/HARDENING.md explains each choice and every suppression.
_volt_san_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "${1:-}" in
  address)
    # detect_leaks: LeakSanitizer at exit (suppressions in lsan.supp). The other two make
    # use-after-return and static-initialisation-order bugs visible too.
    export ASAN_OPTIONS="detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1:abort_on_error=0:halt_on_error=1"
    export LSAN_OPTIONS="suppressions=$_volt_san_dir/lsan.supp:print_suppressions=0"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$_volt_san_dir/ubsan.supp"
    ;;
  thread)
    # libtorch, libgomp (OpenMP) and OpenBLAS are not built with TSan: without
    # ignore_noninstrumented_modules their internal synchronisation (futexes, atomics in
    # uninstrumented code) looks like races on every parallel op. The cost is that races
    # *inside* those libraries, including inside OpenMP regions of volt's kernels whose
    # fork/join TSan cannot see, are not reported (docs/HARDENING.md).
    # allocator_may_return_null: a request beyond what TSan's allocator serves (the tests' 1 PiB
    # tensors) returns null, so libtorch throws as it does without TSan, instead of a fatal
    # allocation-size-too-big report.
    export TSAN_OPTIONS="ignore_noninstrumented_modules=1:halt_on_error=1:second_deadlock_stack=1:allocator_may_return_null=1:suppressions=$_volt_san_dir/tsan.supp"
    ;;
  *)
    echo "scripts/sanitizers/env.sh: give address (ASan+UBSan) or thread (TSan)." >&2
    return 2 2>/dev/null || exit 2
    ;;
esac
unset _volt_san_dir
