#pragma once
/// Thread settings: torch's intra-op thread count for the duration of a Trainer entry point.

#include <cstdint>

namespace volt {

/// The intra-op thread count volt uses for fp32 work when TrainerOptions::num_threads is 0, or 0
/// for "leave libtorch's setting alone". Measured (docs/PERFORMANCE.md): on 2 CPUs with OpenBLAS
/// doing its own GEMM threading, one intra-op thread is fastest for fp32; on other machines
/// nothing was measured, so libtorch's default stays. The Trainer does not apply it under
/// bf16/fp16 precisions, whose GEMMs do not run in OpenBLAS.
int64_t default_num_threads();

/// Sets torch's intra-op threads for this scope and restores the previous count when it ends.
/// `requested` > 0 sets that count; 0 applies default_num_threads().
class IntraOpThreads {
 public:
  explicit IntraOpThreads(int64_t requested);
  ~IntraOpThreads();
  IntraOpThreads(const IntraOpThreads&) = delete;
  IntraOpThreads& operator=(const IntraOpThreads&) = delete;
  /// The count in effect inside the scope.
  int64_t count() const { return count_; }

 private:
  int previous_;
  int64_t count_;
};

/// Process-wide form for programs that want volt's choice outside a Trainer (benchmarks): sets
/// the count IntraOpThreads would and returns it. Not restored.
int64_t configure_threads(int64_t requested);

/// True when libtorch's BLAS is the slow reference implementation (no OpenBLAS/MKL loaded).
bool reference_blas_active();

}  // namespace volt
