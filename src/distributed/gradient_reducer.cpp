#include "volt/distributed/gradient_reducer.h"

#include <torch/torch.h>

#include <algorithm>
#include <ostream>
#include <unordered_map>
#include <unordered_set>

#include "core/detail/numbers.h"
#include "detail/bucket_cap.h"
#include "detail/c10d.h"
#include "detail/link_failure.h"
#include "volt/core/check.h"

#if VOLT_DIST
#include <torch/csrc/distributed/c10d/logger.hpp>  // includes reducer.hpp; no include guard
#endif

namespace volt {
namespace {

constexpr const char* kTag = "[GradientReducer]";

}  // namespace

#if !VOLT_DIST

struct GradientReducer::Impl {};

GradientReducer::GradientReducer(const std::vector<at::Tensor>&, std::shared_ptr<ProcessGroup>,
                                 GradientReducerOptions options, const std::vector<std::string>&)
    : options_(options) {
  VOLT_CHECK(false, NotAvailable, kTag,
             " needs a process group, and this build has none (no gloo headers, and no NCCL: a "
             "libtorch >= 2.0 with USE_C10D_NCCL and nccl.h).");
}
GradientReducer::~GradientReducer() = default;
void GradientReducer::backward(const at::Tensor&, const std::function<void()>&) {}
std::vector<at::Tensor> GradientReducer::bucket_buffers() const {
  return {};
}

#else

namespace {

// Drops tensors that need no gradient and repeats of one tensor (tied weights): the Reducer
// registers one hook per gradient accumulator and rejects duplicates.
void dedupe(const std::vector<at::Tensor>& in, const std::vector<std::string>& names,
            std::vector<at::Tensor>& out, std::vector<std::string>& out_names) {
  std::unordered_set<const void*> seen;
  for (size_t i = 0; i < in.size(); ++i) {
    VOLT_CHECK(in[i].defined(), ValueError, kTag, " parameter ", i, " is undefined.");
    if (!in[i].requires_grad()) continue;
    if (!seen.insert(in[i].unsafeGetTensorImpl()).second) continue;
    out.push_back(in[i]);
    out_names.push_back(names.empty() ? "parameter " + std::to_string(i) : names[i]);
  }
}

// Gloo has no bf16 reduction in libtorch 1.13 (and DDP's bf16 compress hook is NCCL's): a
// bucket of bf16 gradients is reduced in fp32 instead, as ZeroEngine reduces 16-bit gradients:
// cast up, divide by the world size, sum over the ranks, round back into the bucket. With a
// hook registered the Reducer leaves the division to it, so fp32 buckets of such a model are
// divided here too.
// (CommHookInterface itself: Debian's libtorch does not export CppCommHookInterface's parser.)
class Fp32ReduceHook : public c10d::CommHookInterface {
 public:
  explicit Fp32ReduceHook(c10::intrusive_ptr<c10d::ProcessGroup> group)
      : state_(std::move(group)) {}
  at::Tensor parseHookResult(const c10::IValue& result) override { return result.toTensor(); }
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    at::Tensor buffer = bucket.getBufferRef();
    const bool narrow = buffer.scalar_type() == at::kBFloat16;
    at::Tensor wide = narrow ? buffer.to(at::kFloat) : buffer;
    wide.div_(state_->getSize());
    std::vector<at::Tensor> tensors{wide};
    auto reduced = state_->allreduce(tensors)->getFuture();
    return reduced->then(
        [buffer, wide, narrow](c10::ivalue::Future&) {  // 2.x calls it as const
          if (narrow) buffer.copy_(wide);
          return c10::IValue(buffer);
        },
        c10::TensorType::get());
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> state_;
};

}  // namespace

struct GradientReducer::Impl {
  std::shared_ptr<c10d::Reducer> reducer;
  // The 1.13 Reducer dereferences its logger without checking it (find_unused_parameters'
  // graph search logs whether the graph stayed static), so it needs one, as DDP gives it.
  std::shared_ptr<c10d::Logger> logger;
  int64_t synced_steps = 0;
  std::string broken;
};

GradientReducer::GradientReducer(const std::vector<at::Tensor>& parameters,
                                 std::shared_ptr<ProcessGroup> group,
                                 GradientReducerOptions options,
                                 const std::vector<std::string>& names)
    : group_(std::move(group)), options_(options), impl_(std::make_unique<Impl>()) {
  VOLT_CHECK(group_ != nullptr, ValueError, kTag, " needs a process group, got null.");
  VOLT_CHECK(names.empty() || names.size() == parameters.size(), ValueError, kTag, " got ",
             names.size(), " names for ", parameters.size(), " parameters.");
  detail::check_bucket_cap_mb(options_.bucket_cap_mb(), kTag);
  std::vector<std::string> kept_names;
  dedupe(parameters, names, params_, kept_names);
  VOLT_CHECK(!params_.empty(), ValueError, kTag,
             " no parameter requires a gradient; nothing to reduce.");
  for (size_t i = 0; i < params_.size(); ++i) {
    VOLT_CHECK(params_[i].layout() == at::kStrided, ValueError, kTag, " ", kept_names[i],
               " is not a dense tensor; sparse gradients are not supported.");
    VOLT_CHECK(params_[i].device() == params_[0].device(), ValueError, kTag, " ", kept_names[i],
               " is on ", params_[i].device(), " but ", kept_names[0], " is on ",
               params_[0].device(), "; keep the model on one device.");
  }
  auto pg = group_->impl().group;
  // As DDP does at construction: every rank must hold the same parameter shapes and dtypes.
  // c10d checks each rank against rank 0 and throws only where they differ; one decision over
  // the group makes every rank fail alike.
  std::string mismatch;
  try {
    c10d::verify_params_across_processes(pg, params_, c10::nullopt);
  } catch (const std::exception& e) {
    std::string why = e.what();
    if (auto* c = dynamic_cast<const c10::Error*>(&e)) why = c->what_without_backtrace();
    why = why.substr(0, why.find('\n'));
    if (detail::link_failure(why)) detail::throw_collective_error(*group_, "parameter check", e);
    mismatch = why;
  }
  auto flags = group_->all_gather(at::full({1}, mismatch.empty() ? 0 : 1, at::kInt));
  std::vector<int64_t> differ;
  for (size_t r = 0; r < flags.size(); ++r) {
    if (flags[r].item<int>() != 0) differ.push_back(static_cast<int64_t>(r));
  }
  if (!differ.empty()) {
    auto os = detail::c_stream<std::ostringstream>();
    for (size_t i = 0; i < differ.size(); ++i) os << (i ? ", " : "") << differ[i];
    VOLT_CHECK(false, ConfigError, kTag, " the model differs across ranks (parameters of rank(s) ",
               os.str(), " do not match rank 0's", mismatch.empty() ? "" : ": " + mismatch,
               "); build the same model, with the same parameter order, on every rank.");
  }
  const auto cap = static_cast<int64_t>(options_.bucket_cap_mb() * 1024 * 1024);
  // DDP: a small first bucket (1 MiB) so that the last layers' gradients, ready first in
  // backward, start their all-reduce early; then buckets of bucket_cap_mb.
  const int64_t first_cap = std::min<int64_t>(c10d::kDefaultFirstBucketBytes, cap);
  std::vector<bool> sparse(params_.size(), false);
  auto assignment = c10d::compute_bucket_assignment_by_size(
      params_, {static_cast<size_t>(first_cap), static_cast<size_t>(cap)}, sparse);
  auto buckets = std::get<0>(assignment);
  auto limits = std::get<1>(assignment);
  // DDP reverses the list: gradients arrive in roughly reverse parameter order.
  std::reverse(buckets.begin(), buckets.end());
  std::reverse(limits.begin(), limits.end());
  std::unordered_map<size_t, std::string> name_map;
  for (size_t i = 0; i < kept_names.size(); ++i) name_map[i] = kept_names[i];
#if VOLT_TORCH_AT_LEAST(2, 11)
  // 2.11 (compiled against its headers, scripts/gpu/check_syntax.sh; not run: its wheel has no
  // Gloo): skip_all_reduce_unused_params, use_python_reducer, per-bucket caps (empty: the two
  // caps above).
  impl_->reducer = std::make_shared<c10d::Reducer>(
      params_, buckets, pg, sparse, cap, options_.find_unused_parameters(),
      options_.gradient_as_bucket_view(), name_map, first_cap,
      /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false,
      std::vector<int64_t>{});
#elif VOLT_TORCH_AT_LEAST(2, 0)
  // [S] 2.x dropped per_bucket_size_limits (read from sources, not compiled).
  impl_->reducer = std::make_shared<c10d::Reducer>(
      params_, buckets, pg, sparse, cap, options_.find_unused_parameters(),
      options_.gradient_as_bucket_view(), name_map, first_cap);
#else
  impl_->reducer = std::make_shared<c10d::Reducer>(
      params_, buckets, limits, pg, sparse, cap, options_.find_unused_parameters(),
      options_.gradient_as_bucket_view(), name_map, first_cap);
#endif
  impl_->logger = std::make_shared<c10d::Logger>(impl_->reducer);
  impl_->reducer->set_logger(impl_->logger);
  if (options_.static_graph()) impl_->reducer->set_static_graph();
  const bool bf16 = std::any_of(params_.begin(), params_.end(), [](const at::Tensor& p) {
    return p.scalar_type() == at::kBFloat16;
  });
  if (bf16) impl_->reducer->register_comm_hook(std::make_unique<Fp32ReduceHook>(pg));
}

GradientReducer::~GradientReducer() {
  // ~Logger and ~Reducer are noexcept(false) (the Reducer asserts its hooks are still
  // registered). Never let that escape a destructor. The logger goes first, as in DDP.
  try {
    impl_->logger.reset();
  } catch (...) {
  }
  try {
    impl_->reducer.reset();
  } catch (...) {
  }
}

void GradientReducer::backward(const at::Tensor& loss, const std::function<void()>& run_backward) {
  VOLT_CHECK(impl_->broken.empty(), DistributedError, kTag, " backward after an earlier failure (",
             impl_->broken, "); restart the run.");
  auto& r = *impl_->reducer;
  const bool sync = sync_;
  try {
    // What DDP's forward does, moved to just before backward (equivalent: nothing in between
    // touches gradients). rebuild_buckets acts once, after the first synced step: it re-buckets
    // parameters in the order their gradients arrived and broadcasts rank 0's choice, so every
    // rank must reach it, synced or not.
    r.rebuild_buckets();
    if (sync) {
      r.prepare_for_forward();
      // With sync off the Reducer's autograd hooks return at once: gradients just accumulate.
      std::vector<at::Tensor> outputs;
      if (options_.find_unused_parameters() && !options_.static_graph()) outputs.push_back(loss);
      r.prepare_for_backward(outputs);
    }
    if (run_backward) {
      run_backward();
    } else {
      loss.backward();
    }
    if (sync && options_.static_graph() && impl_->synced_steps == 0) {
      // The first static-graph step only counts gradient hooks; DDP queues delay_all_reduce as
      // an autograd callback (_DDPSink) to reduce everything once backward is done.
      r.delay_all_reduce();
    }
    if (sync) ++impl_->synced_steps;
  } catch (const volt::Error& e) {
    // The Reducer may be mid-step (hooks armed, buckets pending): it cannot be reused.
    impl_->broken = e.what();
    throw;
  } catch (const std::exception& e) {
    std::string why = e.what();
    if (auto* c = dynamic_cast<const c10::Error*>(&e)) why = c->what_without_backtrace();
    why = why.substr(0, why.find('\n'));
    if (detail::link_failure(why)) {
      try {
        detail::throw_collective_error(*group_, "gradient all-reduce", e);
      } catch (const DistributedError& d) {
        impl_->broken = d.what();
        throw;
      }
    }
    impl_->broken = why;
    const bool unused = why.find("Expected to have finished reduction") != std::string::npos;
    VOLT_CHECK(!unused, ValueError, kTag,
               " some parameters got no gradient in the previous synced step, so its reduction "
               "never finished; set find_unused_parameters(true) or make every parameter "
               "contribute to the loss.");
    // A parameter used inside volt::checkpoint gets its gradient in the recomputation, after
    // find_unused_parameters' search (which cannot see through the checkpoint) marked it unused.
    const bool twice = why.find("mark a variable ready only once") != std::string::npos;
    VOLT_CHECK(!(twice && options_.find_unused_parameters()), ValueError, kTag,
               " a parameter got a gradient after find_unused_parameters had marked it unused: "
               "with activation checkpointing (volt::checkpoint) the search cannot see the "
               "recomputed layers; use static_graph(true) instead (it also covers parameters "
               "the forward skips), or turn find_unused_parameters off.");
    VOLT_CHECK(false, ValueError, kTag, " backward failed: ", why);
  }
}

std::vector<at::Tensor> GradientReducer::bucket_buffers() const {
  std::vector<at::Tensor> out;
  for (auto& b : impl_->reducer->get_grad_buckets(/*return_zero_tensors=*/false)) {
    out.push_back(b.getBuffer());
  }
  return out;
}

#endif  // VOLT_DIST

std::ostream& operator<<(std::ostream& os, const GradientReducerOptions& o) {
  return os << "GradientReducerOptions(bucket_cap_mb=" << o.bucket_cap_mb()
            << ", gradient_as_bucket_view=" << o.gradient_as_bucket_view()
            << ", find_unused_parameters=" << o.find_unused_parameters()
            << ", static_graph=" << o.static_graph() << ")";
}

}  // namespace volt
