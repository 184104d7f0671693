#include "volt/distributed/zero_engine.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <ostream>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/detail/aio.h"
#include "core/detail/numbers.h"
#include "core/detail/print.h"
#include "distributed/detail/async_collective.h"
#include "distributed/detail/intercept.h"
#include "kernels/detail/clip_coefficient.h"
#include "kernels/detail/state_tensors.h"
#include "volt/core/check.h"
#include "volt/core/log.h"

namespace volt {
namespace {

// The memory of `t` without autograd's view link, for the gradients the optimizer holds: its
// zero_grad() detaches each gradient in place (libtorch 1.13), which a view refuses ("Can't
// detach views in-place"), so a module calling optimizer.zero_grad() itself would fail.
at::Tensor same_memory(const at::Tensor& t) {
  return at::empty({0}, t.options()).set_(t.storage(), t.storage_offset(), t.sizes(), t.strides());
}

constexpr const char* kTag = "[ZeroEngine]";

bool low_precision(c10::ScalarType t) {
  return t == at::kBFloat16 || t == at::kHalf;
}

// Gives a storage `nbytes` of fresh memory / takes its memory away, keeping the StorageImpl
// (and so every tensor and view on it): how partitioned parameters and the swapped parameter
// shard come and go. The memory comes from the allocator that made the storage (a pinned,
// counting or device allocator stays the one behind the parameter), or from its device's
// default when the storage has none (a tensor over foreign memory).
void give_memory(c10::StorageImpl* s, size_t nbytes) {
  c10::Allocator* allocator = s->allocator();
  if (allocator == nullptr) allocator = c10::GetAllocator(s->device_type());
  // A device allocator (CUDA's caching one) allocates on the current device: make it the
  // storage's own.
  const c10::DeviceGuard on_its_device(s->device());
  s->set_data_ptr_noswap(allocator->allocate(nbytes));
  s->set_nbytes(nbytes);
}
void take_memory(c10::StorageImpl* s, c10::Device device) {
  s->set_data_ptr_noswap(c10::DataPtr(nullptr, device));
  s->set_nbytes(0);
}

// All-gathers `t` (the same shape and dtype on every rank by construction: the engine's layout
// is checked at its start), bf16 as its bits.
std::vector<at::Tensor> all_gather_any(const std::shared_ptr<ProcessGroup>& group,
                                       const at::Tensor& t) {
  return detail::start_all_gather(group, t).wait();
}

// ------------------------------------------------------------------ stage 3: gathering on read
// Partitioned parameters keep their TensorImpl (the module's typed members and autograd hold it)
// but their storage is emptied; an op receiving one (or a view of it: same storage) gathers its
// module's parameters first. The op is seen by the shared interceptor (detail/intercept.h).
constexpr c10::DispatchKey kGatherKey = detail::kInterceptKey;

struct Owner {
  ZeroEngine* engine;
  size_t unit;
};

// Lives as long as the process (the interceptor may run during static destruction).
detail::StorageMap<Owner>& owners() {
  static auto* m = new detail::StorageMap<Owner>();
  return *m;
}

bool gather_interceptor(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                        torch::jit::Stack* stack);

void install_gather_fallback() {
  detail::add_interceptor(&gather_interceptor);
}

}  // namespace

// Calls into the engine from the fallback (a friend: on_access is private).
struct ZeroGather {
  static void pin(const Owner& o, uint64_t serial) { o.engine->units_[o.unit].pinned = serial; }
  static void access(const Owner& o, bool writes, const char* op) {
    o.engine->on_access(o.unit, writes, op);
  }
};

namespace {

// Stage 1's whole gradient of `parameter`, dense and contiguous for the reduced chunk to be
// written into it: zeros for a parameter the forward did not use (DeepSpeed's
// ignore_unused_parameters counts it as a zero gradient).
at::Tensor& dense_grad(const at::Tensor& parameter) {
  at::Tensor& g = parameter.mutable_grad();
  if (!g.defined()) {
    g = torch::zeros_like(parameter);
  } else if (!g.is_contiguous()) {
    g = g.contiguous();
  }
  return g;
}

bool gather_interceptor(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                        torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t n = args.size();
  const size_t base = stack->size() - n;
  // First every partitioned parameter this op takes, so that gathering one never evicts another
  // the same op needs (a live bound smaller than two modules).
  struct Use {
    Owner owner;
    bool writes;
  };
  std::vector<Use> uses;
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = (*stack)[base + i];
    const bool writes = args[i].alias_info() != nullptr && args[i].alias_info()->isWrite();
    auto visit = [&](const at::Tensor& t) {
      if (auto o = owners().find(t)) uses.push_back({*o, writes});
    };
    if (v.isTensor()) {
      visit(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) visit(t);
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor()) visit(e.toTensor());
      }
    }
  }
  if (!uses.empty()) {
    static uint64_t serial = 0;
    ++serial;
    for (const Use& u : uses) ZeroGather::pin(u.owner, serial);
    for (const Use& u : uses) ZeroGather::access(u.owner, u.writes, op.schema().name().c_str());
  }
  return false;  // the op itself runs below the key
}

}  // namespace

struct ZeroEngine::Comm {
  // Gradient buckets whose reduction is in flight, oldest first.
  struct Reduction {
    size_t bucket;
    detail::PendingCollective work;
  };
  std::deque<Reduction> reductions;
  // Chunks whose gradient came again after their bucket's reduction had started (this backward).
  std::vector<size_t> late;
  // Stage 3: per unit, a prefetch in flight, and their elements together.
  std::vector<detail::PendingCollective> gathers;
  int64_t prefetch_elements = 0;
  // param_swap_file: prefetches whose chunks are being read from the file (submitted, not
  // waited for), in submission order; their gathers start at the next read of any unit.
  std::vector<std::pair<size_t, at::Tensor>> reading;
  // The learned access order: (the unit read before, the unit read) -> the unit read next. Two
  // units of context tell forward (..., 1, 2 -> 3) from backward (..., 3, 2 -> 1).
  std::map<std::pair<int64_t, int64_t>, size_t> next;
  int64_t before_last = -1;  // in the open scope: the distinct unit read before `last`
  int64_t last = -1;         // the unit read last
  // Stage 1, a backward after a synced one in the same window: per chunk index, this rank's
  // chunk as that reduction left it (averaged), added to the next reduction's.
  std::map<size_t, at::Tensor> carried;
  // Per chunk: its parameter got a gradient in this accumulation window (any backward of it).
  std::vector<bool> used;
  // The backward under way closes its window (the Trainer's last micro-batch): the unused
  // check runs then, when the window's gradients are all in.
  bool sync = true;
};

struct ZeroEngine::Swap {
  std::unique_ptr<detail::AioFile> file;
  int64_t bytes = 0;     // of param_shard_
  bool out = false;      // param_shard_'s storage is released; the file holds the chunks
  bool written = false;  // the file holds param_shard_ as it is (the first write, at set-up)
  // The optimizer step sub-group by sub-group (the shard stays out): per chunk index, its
  // buffer, being read, held (the chunk's view points into it) or being written back.
  std::vector<std::pair<size_t, at::Tensor>> reading;
  std::map<size_t, at::Tensor> held;
  std::vector<at::Tensor> writing;
  int64_t elements = 0;  // in those buffers now
  ~Swap() {
    if (!file) return;
    const std::string path = file->path();
    file.reset();
    ::unlink(path.c_str());
  }
};

struct ZeroEngine::Hooks {
  // The gradient accumulators must stay alive for their hooks to fire (a parameter holds its
  // accumulator weakly); the keys remove the hooks again.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::vector<uintptr_t> keys;
};

ZeroEngine::ZeroEngine(torch::optim::Optimizer& optimizer, std::shared_ptr<ProcessGroup> group,
                       ZeroEngineOptions options,
                       const std::map<const c10::TensorImpl*, std::string>& names)
    : optimizer_(&optimizer),
      group_(std::move(group)),
      options_(options),
      comm_(std::make_unique<Comm>()) {
  VOLT_CHECK(optimizer.state().empty(), ConfigError, kTag,
             " the optimizer has already stepped; partition it before its first step.");
  std::vector<std::vector<at::Tensor>> groups;
  for (auto& pg : optimizer.param_groups()) groups.push_back(pg.params());
  partition(groups, names);
}

ZeroEngine::ZeroEngine(const std::vector<at::Tensor>& parameters,
                       std::shared_ptr<ProcessGroup> group, ZeroEngineOptions options,
                       const std::map<const c10::TensorImpl*, std::string>& names)
    : optimizer_(nullptr),
      group_(std::move(group)),
      options_(options),
      comm_(std::make_unique<Comm>()) {
  VOLT_CHECK(options_.stage() == 3, ConfigError, kTag, " stage=", options_.stage(),
             " without an optimizer partitions nothing that a forward reads; ZeRO-Inference "
             "needs stage 3 (or pass the optimizer to partition its state).");
  // Nothing is stepped: no master copies to keep.
  options_.master_weights(false).offload_optimizer(false);
  partition({parameters}, names);
}

void ZeroEngine::partition(const std::vector<std::vector<at::Tensor>>& param_groups,
                           const std::map<const c10::TensorImpl*, std::string>& names) {
  VOLT_CHECK(group_ != nullptr, ConfigError, kTag, " needs a process group.");
  VOLT_CHECK(options_.stage() >= 1 && options_.stage() <= 3, ConfigError, kTag,
             " stage=", options_.stage(), " is not a ZeRO stage; use 1, 2 or 3.");
  VOLT_CHECK(options_.param_persistence_threshold() >= 0 && options_.max_live_parameters() >= 0,
             ConfigError, kTag,
             " param_persistence_threshold=", options_.param_persistence_threshold(),
             " and max_live_parameters=", options_.max_live_parameters(), " must be >= 0.");
  VOLT_CHECK(options_.prefetch_bucket_size() >= 0, ConfigError, kTag,
             " prefetch_bucket_size=", options_.prefetch_bucket_size(),
             " must be >= 0 (elements; 0 turns prefetching off).");
  VOLT_CHECK(options_.reduce_bucket_size() > 0 && options_.allgather_bucket_size() > 0, ConfigError,
             kTag, " reduce_bucket_size=", options_.reduce_bucket_size(),
             " and allgather_bucket_size=", options_.allgather_bucket_size(),
             " must be > 0 (elements).");
  const int64_t world = group_->world_size();
  const int64_t rank = group_->rank();
  std::unordered_set<const c10::TensorImpl*> seen;
  c10::optional<c10::ScalarType> dtype;
  int64_t group_index = 0;
  for (const auto& params : param_groups) {
    for (const auto& p : params) {
      if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;  // tied: one owner
      auto it = names.find(p.unsafeGetTensorImpl());
      VOLT_CHECK(it != names.end(), ConfigError, kTag, " an optimizer parameter (shape ", p.sizes(),
                 ") is not a parameter of the module; optimize module parameters.");
      // A frozen parameter the optimizer holds (Adam(module.parameters()) beside a frozen
      // backbone) stays whole on every rank and leaves the optimizer, which would never step
      // it: DeepSpeed keeps only the trainable ones (it was a ConfigError).
      if (trains() && !p.requires_grad()) continue;
      VOLT_CHECK(!trains() || p.is_leaf(), ConfigError, kTag, " parameter '", it->second,
                 "' is not a leaf tensor; optimize the module's own parameters.");
      VOLT_CHECK(p.is_floating_point() && p.is_contiguous() && !p.is_sparse(), ConfigError, kTag,
                 " parameter '", it->second, "' is ", p.scalar_type(),
                 p.is_contiguous() ? "" : " and not contiguous",
                 "; ZeRO partitions dense contiguous floating-point parameters.");
      VOLT_CHECK(!dtype || *dtype == p.scalar_type(), ConfigError, kTag, " parameter '", it->second,
                 "' is ", p.scalar_type(), " but others are ", *dtype,
                 "; give every parameter one dtype (the precision converts them).");
      VOLT_CHECK(chunks_.empty() || chunks_.front().parameter.device() == p.device(), ConfigError,
                 kTag, " parameter '", it->second, "' is on ", p.device(), " but others are on ",
                 chunks_.front().parameter.device(),
                 "; move the whole module to one device (the strategy does).");
      dtype = p.scalar_type();
      ZeroChunk c;
      c.name = it->second;
      c.group = group_index;
      c.parameter = p;
      c.numel = p.numel();
      c.chunk = (c.numel + world - 1) / world;
      c.start = rank * c.chunk;
      c.length = std::max<int64_t>(0, std::min(c.chunk, c.numel - c.start));
      if (c.length > 0) c.view = p.detach().view({-1}).narrow(0, c.start, c.length);
      chunks_.push_back(std::move(c));
    }
    ++group_index;
  }
  VOLT_CHECK(!chunks_.empty(), ConfigError, kTag,
             trains() ? " the optimizer has no parameters." : " the module has no parameters.");
  const c10::Device device = chunks_.front().parameter.device();
  VOLT_CHECK(!options_.offload_parameters() || device.is_cpu() || options_.offload_optimizer() ||
                 !trains(),
             ConfigError, kTag, " offload_parameters with parameters on ", device,
             " needs offload_optimizer too (the optimizer steps the host chunks); set "
             "offload_optimizer=true.");
  device_ = device;

  // Every rank must partition the same parameters in the same order, or the collectives below
  // would pair different tensors.
  auto layout = detail::c_stream<std::ostringstream>();
  for (const auto& c : chunks_) layout << c.name << ':' << c.numel << ';';
  const int64_t digest =
      static_cast<int64_t>(std::hash<std::string>()(layout.str()) & 0x7fffffffffffffffULL);
  const auto all = group_->all_gather(torch::tensor({digest}, torch::kLong));  // checks shapes
  for (size_t r = 0; r < all.size(); ++r) {
    VOLT_CHECK(all[r].item<int64_t>() == digest, ConfigError, kTag, " rank ", r,
               " partitions other parameters than rank ", rank,
               "; every rank must build the same model and optimizer.");
  }

  // Buckets from the last parameter backwards: gradients become ready roughly in that order.
  bucket_of_.assign(chunks_.size(), 0);
  size_t last = chunks_.size();
  int64_t size = 0;
  for (size_t i = chunks_.size(); i-- > 0;) {
    const int64_t add = chunks_[i].chunk * world;
    if (size > 0 && size + add > options_.reduce_bucket_size()) {
      buckets_.emplace_back(i + 1, last);
      last = i + 1;
      size = 0;
    }
    size += add;
  }
  buckets_.emplace_back(0, last);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (size_t i = buckets_[b].first; i < buckets_[b].second; ++i) bucket_of_[i] = b;
  }
  pending_.assign(buckets_.size(), 0);
  ready_.assign(chunks_.size(), false);

  if (options_.stage() >= 2 && trains()) {
    int64_t total = 0;
    for (const auto& c : chunks_) total += c.length;
    grad_shard_ = torch::zeros({total}, chunks_.front().parameter.options().requires_grad(false));
    int64_t off = 0;
    for (const auto& c : chunks_) {
      grad_views_.push_back(grad_shard_.narrow(0, off, c.length));
      off += c.length;
    }
  }

  // What may fail (the masters' host memory, the swap file's first write) runs before stage 3
  // releases the parameters' memory, and the gradient hooks (which point at this engine) come
  // last: a constructor that throws leaves the parameters whole and nothing pointing at it.
  const bool fp32_masters = options_.master_weights() && low_precision(*dtype);
  if (fp32_masters || options_.offload_optimizer()) {
    // DeepSpeed's BF16Optimizer: fp32 masters of this rank's chunks, sharded like the state;
    // ZeRO-Offload: the same copies in host memory (fp32 for 16-bit parameters). One tensor
    // each (its own storage), so that an NVMe optimizer swapper can swap them with their
    // state, sub-group by sub-group.
    masters_ = true;
    master_options_ = chunks_.front().parameter.options().requires_grad(false);
    if (low_precision(*dtype)) master_options_ = master_options_.dtype(torch::kFloat);
    if (options_.offload_optimizer()) {
      // Accelerator parameters: page-locked host memory, so that the copies each way
      // (prepare_step, gather_parameters) run as asynchronous DMA, queued without a sync each.
      pinned_masters_ = !master_options_.device().is_cpu();
      master_options_ = master_options_.device(torch::kCPU).pinned_memory(pinned_masters_);
    }
    for (auto& c : chunks_) {
      if (c.length > 0) c.master = torch::empty({c.length}, master_options_);
    }
  }
  if (options_.stage() == 3) partition_parameters();
  if (masters_) reset_master_weights();
  swap_out_shard();       // param_swap_file: the chunks live in the file from now on
  if (!trains()) return;  // an inference engine has no gradients to reduce
  hooks_ = std::make_unique<Hooks>();
  for (size_t i = 0; i < chunks_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(chunks_[i].parameter);
    VOLT_ASSERT(acc != nullptr, "a leaf parameter has no gradient accumulator");
    hooks_->keys.push_back(
        acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [this, i](const torch::autograd::variable_list& outputs,
                      const torch::autograd::variable_list&) {
              on_gradient(i);
              return outputs;
            })));
    hooks_->accumulators.push_back(std::move(acc));
  }

  // The optimizer steps this rank's chunks (or their masters) from now on.
  auto& groups = optimizer_->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<at::Tensor> views;
    for (const auto& c : chunks_) {
      if (c.group == static_cast<int64_t>(g) && c.length > 0) views.push_back(c.stepped());
    }
    groups[g].params() = views;
  }
}

void ZeroEngine::reset_master_weights() {
  Resident resident(*this);
  torch::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard no_intercept(kGatherKey);
  for (auto& c : chunks_) {
    if (c.master.defined()) c.master.copy_(c.view);
  }
}

void ZeroEngine::partition_parameters() {
  torch::NoGradGuard no_grad;
  shard_offset_.assign(chunks_.size(), -1);
  int64_t total = 0;
  for (size_t i = 0; i < chunks_.size(); ++i) {
    auto& c = chunks_[i];
    const at::Tensor& p = c.parameter;
    // Any device: the gather writes through copy_ and memory comes from the storage's own
    // allocator (give_memory). CUDA parameters ran on an H200 (NcclCuda tests, 2026-11-27).
    // Only a parameter that owns its whole storage can give it up.
    const bool own = p.storage_offset() == 0 &&
                     p.storage().nbytes() == static_cast<size_t>(c.numel) * p.element_size();
    c.partitioned = c.numel > options_.param_persistence_threshold() && own;
    if (!c.partitioned) continue;
    shard_offset_[i] = total;
    total += c.chunk;
  }
  if (total == 0) return;  // everything is small enough to stay whole
  install_gather_fallback();
  at::TensorOptions shard_options = chunks_.front().parameter.options().requires_grad(false);
  if (options_.offload_parameters() && !shard_options.device().is_cpu()) {
    // ZeRO-Offload's offload_param: the shard in pinned host memory, copied to the device piece
    // by piece when gathered.
    shard_options = shard_options.device(torch::kCPU).pinned_memory(true);
  }
  param_shard_ = torch::zeros({total}, shard_options);
  // Units: consecutive partitioned parameters of one module (the name without its last part),
  // gathered by one all-gather.
  std::string unit_prefix;
  for (size_t i = 0; i < chunks_.size(); ++i) {
    auto& c = chunks_[i];
    if (!c.partitioned) continue;
    const auto dot = c.name.rfind('.');
    const std::string prefix = dot == std::string::npos ? "" : c.name.substr(0, dot);
    const bool joins =
        !units_.empty() && units_.back().chunks.back() + 1 == i && prefix == unit_prefix;
    if (!joins) {
      units_.emplace_back();
      units_.back().offset = shard_offset_[i];
      unit_prefix = prefix;
    }
    Unit& u = units_.back();
    u.chunks.push_back(i);
    u.width += c.chunk;
    u.numel += c.numel;
    c.unit = static_cast<int64_t>(units_.size()) - 1;
    if (c.length > 0) {
      param_shard_.narrow(0, shard_offset_[i], c.length)
          .copy_(c.parameter.detach().view({-1}).narrow(0, c.start, c.length));
      c.view = param_shard_.narrow(0, shard_offset_[i], c.length);
    }
  }
  if (!options_.param_swap_file().empty()) {
    // Created and written before anything points at this engine or memory is released: a full
    // disk fails here with the parameters as they were.
    swap_ = std::make_unique<Swap>();
    swap_->bytes = param_shard_.numel() * static_cast<int64_t>(param_shard_.element_size());
    swap_->file = std::make_unique<detail::AioFile>(options_.param_swap_file(),
                                                    detail::AioOptions()
                                                        .block_size(options_.aio_block_size())
                                                        .queue_depth(options_.aio_queue_depth())
                                                        .use_uring(options_.aio_use_uring()),
                                                    /*create=*/true);
    swap_->file->submit_write(param_shard_.data_ptr(), swap_->bytes, 0);
    swap_->file->wait();
    swap_->written = true;
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    for (size_t i : units_[u].chunks) {
      owners().set(detail::storage_of(chunks_[i].parameter), Owner{this, u});
    }
  }
  comm_->gathers.resize(units_.size());
  c10::impl::tls_set_dispatch_key_included(kGatherKey, true);
  partitioning_ = true;
  for (size_t u = 0; u < units_.size(); ++u) {
    units_[u].live = true;
    live_elements_ += units_[u].numel;
    release(u);
  }
}

ZeroEngine::Scope::Scope(ZeroEngine& engine) : engine_(engine), outer_(engine.scope_depth_ == 0) {
  ++engine_.scope_depth_;
  if (outer_) engine_.comm_->before_last = engine_.comm_->last = -1;
}

ZeroEngine::Scope::~Scope() {
  --engine_.scope_depth_;
  if (outer_ && engine_.partitioning_) {
    engine_.release_all();
    engine_.drop_prefetches();
  }
}

// ------------------------------------------------------------------ param_swap_file
bool ZeroEngine::parameters_resident() const {
  return !swap_ || !swap_->out;
}

bool ZeroEngine::swap_in_shard() {
  if (parameters_resident()) return false;
  c10::StorageImpl* s = param_shard_.storage().unsafeGetStorageImpl();
  give_memory(s, swap_->bytes);
  swap_->file->submit_read(s->data_ptr().get(), swap_->bytes, 0);
  swap_->file->wait();
  swap_->out = false;
  return true;
}

void ZeroEngine::swap_out_shard() {
  if (!swap_ || swap_->out) return;
  c10::StorageImpl* s = param_shard_.storage().unsafeGetStorageImpl();
  // Written in full before the memory goes: a failed write leaves the shard in memory. The
  // set-up's write needs no second one.
  if (!swap_->written) {
    swap_->file->submit_write(s->data_ptr().get(), swap_->bytes, 0);
    swap_->file->wait();
  }
  swap_->written = false;  // the shard changes once it is back in memory
  take_memory(s, param_shard_.device());
  swap_->out = true;
}

at::Tensor ZeroEngine::submit_shard_read(int64_t offset, int64_t width) {
  at::Tensor t = torch::empty({width}, param_shard_.options());
  const auto esize = static_cast<int64_t>(param_shard_.element_size());
  swap_->file->submit_read(t.data_ptr(), width * esize, offset * esize);
  return t;
}

at::Tensor ZeroEngine::read_shard_range(int64_t offset, int64_t width) {
  if (parameters_resident()) return param_shard_.narrow(0, offset, width);
  at::Tensor t = submit_shard_read(offset, width);
  swap_->file->wait();
  return t;
}

ZeroEngine::Resident::Resident(ZeroEngine& engine)
    : engine_(engine), swapped_in_(engine.swap_in_shard()) {}

ZeroEngine::Resident::~Resident() {
  if (!swapped_in_) return;
  try {
    engine_.swap_out_shard();
  } catch (const std::exception& e) {
    log_error("ZeroEngine", std::string("could not write the parameter chunks back to '") +
                                engine_.options_.param_swap_file() +
                                "'; they stay in memory: " + e.what());
  }
}

// The optimizer step sub-group by sub-group: only the chunks of the sub-groups in flight are in
// memory. A chunk's view (what the optimizer, or round_masters, writes) is pointed at its buffer
// while held and back at the released shard storage afterwards; its TensorImpl, grad and
// optimizer state key stay the same.
std::vector<size_t> ZeroEngine::swapped_chunks_of(const std::vector<at::Tensor>& stepped) const {
  std::vector<size_t> out;
  if (parameters_resident()) return out;
  std::unordered_set<const c10::TensorImpl*> mine;
  for (const auto& t : stepped) mine.insert(t.unsafeGetTensorImpl());
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const ZeroChunk& c = chunks_[i];
    if (c.partitioned && c.length > 0 && mine.count(c.stepped().unsafeGetTensorImpl()) != 0) {
      out.push_back(i);
    }
  }
  return out;
}

void ZeroEngine::read_step_chunks(const std::vector<at::Tensor>& stepped) {
  if (parameters_resident()) return;
  for (size_t i : swapped_chunks_of(stepped)) {
    if (swap_->held.count(i) != 0) continue;
    swap_->reading.emplace_back(i, submit_shard_read(shard_offset_[i], chunks_[i].length));
    swap_->elements += chunks_[i].length;
  }
  stats_.step_chunk_peak = std::max(stats_.step_chunk_peak, swap_->elements);
}

void ZeroEngine::hold_step_chunks() {
  if (!swap_) return;
  swap_->file->wait();  // the reads, and the writes submitted before them
  for (const auto& w : swap_->writing) swap_->elements -= w.numel();
  swap_->writing.clear();
  for (auto& [i, buffer] : swap_->reading) {
    c10::TensorImpl* view = chunks_[i].view.unsafeGetTensorImpl();
    view->set_storage_keep_dtype(buffer.storage());
    view->set_storage_offset(0);
    swap_->held.emplace(i, std::move(buffer));
  }
  swap_->reading.clear();
}

void ZeroEngine::write_step_chunks(const std::vector<at::Tensor>& stepped) {
  if (parameters_resident()) return;
  const auto esize = static_cast<int64_t>(param_shard_.element_size());
  for (size_t i : swapped_chunks_of(stepped)) {
    auto it = swap_->held.find(i);
    if (it == swap_->held.end()) continue;
    swap_->file->submit_write(it->second.data_ptr(), chunks_[i].length * esize,
                              shard_offset_[i] * esize);
    c10::TensorImpl* view = chunks_[i].view.unsafeGetTensorImpl();
    view->set_storage_keep_dtype(param_shard_.storage());
    view->set_storage_offset(shard_offset_[i]);
    swap_->writing.push_back(std::move(it->second));
    swap_->held.erase(it);
  }
}

void ZeroEngine::finish_step_chunks() {
  if (!swap_) return;
  hold_step_chunks();  // reads in flight complete (a step that failed between read and hold)
  std::vector<at::Tensor> all;
  for (const auto& kv : swap_->held) all.push_back(chunks_[kv.first].stepped());
  write_step_chunks(all);
  swap_->file->wait();
  swap_->writing.clear();
  swap_->elements = 0;
}

void ZeroEngine::start_read_prefetches() {
  if (comm_->reading.empty()) return;
  swap_->file->wait();  // every read submitted so far
  auto reading = std::move(comm_->reading);
  comm_->reading.clear();
  c10::impl::ExcludeDispatchKeyGuard no_intercept(kGatherKey);
  for (auto& [v, buffer] : reading) {
    comm_->gathers[v] = detail::start_all_gather(group_, for_gather(buffer, /*fresh=*/false));
  }
}

void ZeroEngine::drop_prefetches() {
  if (!comm_->reading.empty()) {
    // The buffers must outlive their reads.
    try {
      swap_->file->wait();
    } catch (...) {
    }
    stats_.prefetch_discarded += static_cast<int64_t>(comm_->reading.size());
    comm_->reading.clear();
  }
  // Not waited for: Gloo finishes them (every rank started the same ones) and frees their
  // buffers; the parameters may change before the next read, so they would be stale.
  for (auto& g : comm_->gathers) {
    if (!g.pending()) continue;
    g = detail::PendingCollective();
    ++stats_.prefetch_discarded;
  }
  comm_->prefetch_elements = 0;
}

void ZeroEngine::record_access(size_t u) {
  const auto unit = static_cast<int64_t>(u);
  if (unit == comm_->last) return;
  if (comm_->last >= 0) comm_->next[{comm_->before_last, comm_->last}] = u;
  comm_->before_last = comm_->last;
  comm_->last = unit;
}

void ZeroEngine::prefetch_after(size_t u) {
  if (options_.prefetch_bucket_size() == 0 || group_ == nullptr) return;
  // Follow the learned order from (the unit before, u) while the budget lasts. Every rank reads
  // the same units in the same order, so every rank starts the same gathers in the same order.
  int64_t before = comm_->before_last;
  auto at = static_cast<int64_t>(u);
  for (size_t hops = 0; hops < units_.size(); ++hops) {
    auto it = comm_->next.find({before, at});
    if (it == comm_->next.end()) return;
    const size_t v = it->second;
    Unit& unit = units_[v];
    const bool reading =
        std::any_of(comm_->reading.begin(), comm_->reading.end(),
                    [v](const std::pair<size_t, at::Tensor>& r) { return r.first == v; });
    if (!unit.live && !comm_->gathers[v].pending() && !reading) {
      if (comm_->prefetch_elements + unit.numel > options_.prefetch_bucket_size() ||
          live_elements_ + comm_->prefetch_elements + unit.numel > options_.max_live_parameters()) {
        return;
      }
      c10::impl::ExcludeDispatchKeyGuard no_intercept(kGatherKey);
      comm_->prefetch_elements += unit.numel;
      if (!parameters_resident()) {
        // The chunks come from the file: submit the read now and start the gather at the next
        // read of any unit (the same point on every rank), so the read overlaps this op.
        comm_->reading.emplace_back(v, submit_shard_read(unit.offset, unit.width));
        ++stats_.prefetch_reads;
      } else {
        // A copy: a dropped prefetch may still be read by Gloo after the shard changed.
        comm_->gathers[v] = detail::start_all_gather(
            group_, for_gather(param_shard_.narrow(0, unit.offset, unit.width), /*fresh=*/true));
      }
    }
    before = at;
    at = static_cast<int64_t>(v);
  }
}

void ZeroEngine::on_access(size_t u, bool writes, const char* op) {
  Unit& unit = units_[u];
  const std::string& name = chunks_[unit.chunks.front()].name;
  VOLT_CHECK(!writes, ValueError, kTag, " ", op, " writes to parameter '", name,
             "' in place, but ZeRO stage 3 keeps only each rank's chunk of it, so the write "
             "would be lost; change parameters through the optimizer, or use stage 2.");
  record_access(u);
  start_read_prefetches();  // reads submitted at the previous access: their gathers go now
  if (unit.live) {
    unit.last_use = ++clock_;
    prefetch_after(u);
    return;
  }
  VOLT_CHECK(scope_depth_ > 0, ValueError, kTag, " ", op, " reads parameter '", name,
             "' outside a training, validation, test or predict step; ZeRO stage 3 gathers "
             "partitioned parameters only inside steps, where every rank takes part. Read it in "
             "a step, or after the Trainer's entry point returns (the parameters are whole "
             "again then); in a Fabric loop, inside fabric.forward_context(module).");
  gather(u);
  prefetch_after(u);
}

void ZeroEngine::gather(size_t u) {
  // Our own ops must not come back through the fallback.
  c10::impl::ExcludeDispatchKeyGuard no_intercept(kGatherKey);
  torch::NoGradGuard no_grad;
  VOLT_CHECK(group_ != nullptr, DistributedError, kTag,
             " cannot gather a partitioned parameter: the process group is gone.");
  Unit& unit = units_[u];
  while (live_elements_ + unit.numel > options_.max_live_parameters()) {
    // The least recently used gathered unit goes first (it is gathered again if read again).
    size_t oldest = units_.size();
    for (size_t v = 0; v < units_.size(); ++v) {
      if (v != u && units_[v].live && units_[v].pinned != unit.pinned &&
          (oldest == units_.size() || units_[v].last_use < units_[oldest].last_use)) {
        oldest = v;
      }
    }
    if (oldest == units_.size()) break;
    release(oldest);
  }
  std::vector<at::Tensor> all;
  detail::PendingCollective& prefetched = comm_->gathers[u];
  if (prefetched.pending()) {
    comm_->prefetch_elements -= unit.numel;
    all = prefetched.wait();
    ++stats_.prefetched;
  } else {
    all = all_gather_any(group_,
                         for_gather(read_shard_range(unit.offset, unit.width), /*fresh=*/false));
  }
  ++stats_.gathers;
  const int64_t world = group_->world_size();
  for (size_t i : unit.chunks) {
    const auto& c = chunks_[i];
    c10::StorageImpl* s = c.parameter.storage().unsafeGetStorageImpl();
    give_memory(s, static_cast<size_t>(c.numel) * c.parameter.element_size());
    // Written through a fresh tensor on the parameter's storage: it has a version counter of
    // its own, so autograd's check of the parameter's saved uses sees no write (as a raw copy),
    // and copy_ works on any device (a memcpy only on the CPU).
    at::Tensor whole = at::empty({0}, c.parameter.options().requires_grad(false));
    whole.set_(c.parameter.storage(), 0, {c.numel}, {1});
    const int64_t from = shard_offset_[i] - unit.offset;
    for (int64_t j = 0; j < world; ++j) {
      const int64_t len = std::max<int64_t>(0, std::min(c.chunk, c.numel - j * c.chunk));
      if (len == 0) continue;
      whole.narrow(0, j * c.chunk, len).copy_(all[j].narrow(0, from, len));
    }
  }
  unit.live = true;
  unit.last_use = ++clock_;
  live_elements_ += unit.numel;
}

void ZeroEngine::release(size_t u) {
  Unit& unit = units_[u];
  if (!unit.live) return;
  for (size_t i : unit.chunks) {
    c10::StorageImpl* s = chunks_[i].parameter.storage().unsafeGetStorageImpl();
    take_memory(s, chunks_[i].parameter.device());
  }
  unit.live = false;
  live_elements_ -= unit.numel;
}

void ZeroEngine::release_all() {
  for (size_t u = 0; u < units_.size(); ++u) release(u);
}

void ZeroEngine::restore_parameters() {
  if (!partitioning_) return;
  drop_prefetches();
  // Every unit stays: no live bound from here on.
  options_.max_live_parameters(std::numeric_limits<int64_t>::max());
  try {
    for (size_t u = 0; u < units_.size(); ++u) {
      if (!units_[u].live) gather(u);
    }
  } catch (...) {
    // A broken group cannot gather: give every released parameter NaN memory rather than none.
    torch::NoGradGuard no_grad;
    for (size_t u = 0; u < units_.size(); ++u) {
      if (units_[u].live) continue;
      for (size_t i : units_[u].chunks) {
        const auto& c = chunks_[i];
        c10::StorageImpl* s = c.parameter.storage().unsafeGetStorageImpl();
        const size_t nbytes = static_cast<size_t>(c.numel) * c.parameter.element_size();
        give_memory(s, nbytes);
        c10::impl::ExcludeDispatchKeyGuard no_intercept(kGatherKey);
        c.parameter.detach().fill_(std::numeric_limits<double>::quiet_NaN());
      }
      units_[u].live = true;
    }
    partitioning_ = false;
    unregister();
    try {
      swap_in_shard();  // a local read: the chunks stay readable
    } catch (...) {
    }
    throw;
  }
  partitioning_ = false;
  unregister();
  // The chunk views stay in memory from here on; the file goes.
  swap_in_shard();
  swap_.reset();
}

void ZeroEngine::unregister() {
  const bool others = owners().erase_if([this](const Owner& o) { return o.engine == this; }) > 0;
  if (!others) c10::impl::tls_set_dispatch_key_included(kGatherKey, false);
}

ZeroEngine::~ZeroEngine() {
  comm_->reductions.clear();  // abandoned: Gloo finishes or times them out
  if (partitioning_) {
    try {
      // No collectives here: the parameters cannot be gathered, so they must not stay empty.
      group_.reset();
      restore_parameters();
    } catch (...) {
    }
  }
  if (!hooks_) return;
  for (size_t i = 0; i < hooks_->accumulators.size(); ++i) {
    hooks_->accumulators[i]->del_post_hook(hooks_->keys[i]);
  }
}

at::Tensor ZeroEngine::gradient_chunk(size_t i) const {
  return i < grad_views_.size() ? grad_views_[i] : at::Tensor();
}

int64_t ZeroEngine::rank() const {
  return group_->rank();
}
int64_t ZeroEngine::world_size() const {
  return group_->world_size();
}

void ZeroEngine::backward(const std::function<void()>& run_backward, bool sync) {
  VOLT_CHECK(trains(), ValueError, kTag,
             " backward() through a ZeRO-Inference engine (set up without an optimizer): it "
             "reduces no gradients; set the module up with its optimizer to train it.");
  if (window_ended_) zero_grad();  // a new window whose zero_grad() did not reach the engine
  comm_->used.resize(chunks_.size(), false);
  comm_->sync = sync;
  if (options_.stage() == 1 && have_grads_) {
    // Another backward after a synced one (manual_backward, Fabric's backward outside
    // no_backward_sync): each full gradient holds the average in this rank's chunk and this
    // rank's own gradient elsewhere, and reduce-scattering the sum of that mix again gave a
    // wrong chunk. The averaged chunks are set aside and the gradients start again from zero;
    // the next synced backward reduces the new gradients alone and adds them.
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < chunks_.size(); ++i) {
      auto& c = chunks_[i];
      if (c.length == 0 || !c.parameter.grad().defined()) continue;
      const at::Tensor mine = c.parameter.grad().view({-1}).narrow(0, c.start, c.length);
      auto it = comm_->carried.find(i);
      if (it == comm_->carried.end()) {
        comm_->carried.emplace(i, mine.clone());
      } else {
        it->second.add_(mine);
      }
    }
    for (auto& c : chunks_) {
      if (c.parameter.grad().defined()) c.parameter.mutable_grad().zero_();
    }
    have_grads_ = false;
  }
  if (options_.stage() == 1 && !sync) {
    // Accumulate full gradients locally; the synced backward reduces their sum.
    run_backward();
    for (size_t i = 0; i < chunks_.size(); ++i) {
      if (chunks_[i].parameter.grad().defined()) comm_->used[i] = true;
    }
    return;
  }
  std::fill(ready_.begin(), ready_.end(), false);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    pending_[b] = buckets_[b].second - buckets_[b].first;
  }
  for (auto& u : units_) u.pending = u.chunks.size();
  comm_->reductions.clear();  // left by a backward that threw: that step is abandoned
  comm_->late.clear();
  Scope scope(*this);  // stage 3: backward regathers what its saved tensors point at
  next_bucket_ = 0;
  armed_ = true;
  try {
    run_backward();
  } catch (...) {
    armed_ = false;
    throw;
  }
  armed_ = false;
  finish_backward();
}

void ZeroEngine::on_gradient(size_t index) {
  if (!armed_) return;
  if (ready_[index]) {
    // A second gradient in one backward (reentrant activation checkpointing backpropagates a
    // recomputed segment apart, so a parameter used there and elsewhere gets two): harmless
    // while its bucket waits (the gradient sums first), lost once the bucket was reduced.
    if (bucket_of_[index] < next_bucket_) comm_->late.push_back(index);
    return;
  }
  ready_[index] = true;
  comm_->used[index] = true;
  const int64_t unit = chunks_[index].unit;
  if (unit >= 0 && --units_[unit].pending == 0) {
    // Every gradient of this module's parameters is in: backward needs them no more.
    release(static_cast<size_t>(unit));
  }
  const size_t b = bucket_of_[index];
  if (--pending_[b] != 0) return;
  // Buckets are reduced in index order on every rank, whatever order they complete in.
  while (next_bucket_ < buckets_.size() && pending_[next_bucket_] == 0) {
    launch_bucket(next_bucket_++);
  }
}

void ZeroEngine::finish_backward() {
  // Parameters the forward did not use never fire their hook: they count as zero gradients.
  while (next_bucket_ < buckets_.size()) launch_bucket(next_bucket_++);
  while (!comm_->reductions.empty()) complete_bucket();
  if (!comm_->late.empty()) {
    // Decided on this rank alone: agreeing would cost a collective in every backward for a
    // misuse. Where the checkpointing is the same on every rank, each finds the same parameters;
    // where it depends on the data, the ranks without one fail at their next collective on the
    // lost peer (this process ends with the error), naming this rank.
    std::string names = "'" + chunks_[comm_->late.front()].name + "'";
    for (size_t i = 1; i < comm_->late.size() && i < 4; ++i) {
      names += ", '" + chunks_[comm_->late[i]].name + "'";
    }
    if (comm_->late.size() > 4) names += " and " + std::to_string(comm_->late.size() - 4) + " more";
    VOLT_CHECK(false, ValueError, kTag, " rank ", rank(), ": ", names,
               " got a second gradient in one backward after its bucket was reduced (a parameter "
               "used inside volt::checkpoint and also outside it, or in two checkpointed "
               "segments, is backpropagated once per use); ZeRO reduces each gradient once: use "
               "the parameter in one checkpointed segment only, or leave it out of the "
               "checkpoint.");
  }
  if (!options_.ignore_unused_parameters() && comm_->sync) {
    // After the reductions, and agreed: a forward that skipped a parameter on some ranks only
    // (a data-dependent branch) stops every rank at the same point with this error, instead of
    // the others going on into collectives the stopped ones never join.
    std::vector<std::string> unused;
    for (size_t i = 0; i < chunks_.size(); ++i) {
      // Unused in the whole window, checked at its synced backward (every rank agrees on which
      // that is, so the reduction below stays matched): a parameter another micro-batch used
      // has a gradient (before session 98, stage 2 refused one that any micro-batch skipped).
      if (!ready_[i] && !comm_->used[i] && chunks_[i].numel > 0 &&
          chunks_[i].parameter.requires_grad()) {
        unused.push_back("'" + chunks_[i].name + "'");
      }
    }
    const bool any_rank =
        group_->world_size() == 1
            ? !unused.empty()
            : group_->all_reduce(torch::tensor({unused.empty() ? 0 : 1}, torch::kLong),
                                 Reduce::kMax)
                      .item<int64_t>() != 0;
    VOLT_CHECK(!any_rank || !unused.empty(), ValueError, kTag, " rank ", rank(),
               ": another rank's forward left parameters without a gradient in this backward "
               "(its error names them); make every parameter contribute to the loss on every "
               "rank, or set ignore_unused_parameters=true.");
    if (!unused.empty()) {
      std::string names = unused[0];
      for (size_t i = 1; i < unused.size() && i < 4; ++i) names += ", " + unused[i];
      if (unused.size() > 4) names += " and " + std::to_string(unused.size() - 4) + " more";
      VOLT_CHECK(false, ValueError, kTag, " rank ", rank(), ": parameter",
                 unused.size() > 1 ? "s " : " ", names,
                 " got no gradient in this backward nor earlier in its accumulation window (the "
                 "forward did not use ",
                 unused.size() > 1 ? "them" : "it",
                 "); make every parameter contribute to the loss, or set "
                 "ignore_unused_parameters=true (DeepSpeed's default: an unused parameter counts "
                 "as a zero gradient).");
    }
  }
  for (size_t i = 0; i < chunks_.size(); ++i) {
    auto& c = chunks_[i];
    if (c.length == 0) continue;
    c.view.mutable_grad() = same_memory(
        options_.stage() >= 2 ? grad_views_[i]
                              : c.parameter.grad().view({-1}).narrow(0, c.start, c.length));
  }
  if (!comm_->carried.empty()) {  // stage 1: the reductions before this one in the window
    torch::NoGradGuard no_grad;
    for (const auto& [i, held] : comm_->carried) chunks_[i].view.mutable_grad().add_(held);
    comm_->carried.clear();
  }
  have_grads_ = true;
}

void ZeroEngine::launch_bucket(size_t b) {
  torch::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard no_intercept(kGatherKey);  // gradients are never partitioned
  const int64_t world = group_->world_size();
  const auto [first, last] = buckets_[b];
  const bool overlapped = options_.overlap_comm() && armed_;
  ++stats_.reductions;
  if (overlapped) ++stats_.overlapped;
  if (world == 1) {
    reduce_alone(first, last);
    return;
  }
  int64_t width = 0;
  for (size_t i = first; i < last; ++i) width += chunks_[i].chunk;
  // Rank-major: row j holds chunk j of every gradient in the bucket, so a reduce-scatter leaves
  // each rank the sum of exactly its chunks.
  // 16-bit gradients travel as 16 bits (the all-to-all only copies) and are summed in fp32 by
  // the receiving rank, which is more exact than a 16-bit sum (and Gloo has no bf16 sum).
  at::Tensor buffer =
      torch::zeros({world, width}, chunks_[first].parameter.options().requires_grad(false));
  int64_t off = 0;
  for (size_t i = first; i < last; ++i) {
    auto& c = chunks_[i];
    const at::Tensor& g = c.parameter.grad();
    if (g.defined() && c.numel > 0) {
      at::Tensor flat = g.reshape({-1});
      if (c.chunk * world > c.numel)
        flat = at::constant_pad_nd(flat, {0, c.chunk * world - c.numel});
      buffer.narrow(1, off, c.chunk).copy_(flat.view({world, c.chunk}));
    }
    // Stages 2 and 3 keep no full gradient: free it before the collective's own copies.
    if (options_.stage() >= 2) c.parameter.mutable_grad().reset();
    off += c.chunk;
  }
  comm_->reductions.push_back({b, detail::start_reduce_scatter(group_, buffer, Reduce::kSum)});
  // Double buffering: at most two reductions in flight while backward goes on.
  const size_t in_flight = overlapped ? 2 : 0;
  while (comm_->reductions.size() > in_flight) complete_bucket();
}

// One rank: the sum over the group is the gradient itself, so each chunk (the whole parameter)
// takes it where complete_bucket would put the reduced piece, without the bucket, the collective
// and the copies around them. Bit for bit the same: a sum of one addend and a division by 1 are
// exact, and the only other difference, adding a zero for an unused parameter, is skipped.
void ZeroEngine::reduce_alone(size_t first, size_t last) {
  for (size_t i = first; i < last; ++i) {
    auto& c = chunks_[i];
    at::Tensor& g = c.parameter.mutable_grad();
    if (options_.stage() >= 2) {
      if (g.defined() && c.length > 0) {
        grad_views_[i].add_(g.reshape({-1}).narrow(0, c.start, c.length));
      }
      g.reset();
    } else if (c.length > 0) {
      dense_grad(c.parameter);  // the reduced gradient is the gradient itself
    }
  }
}

void ZeroEngine::complete_bucket() {
  torch::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard no_intercept(kGatherKey);
  const int64_t world = group_->world_size();
  Comm::Reduction r = std::move(comm_->reductions.front());
  comm_->reductions.pop_front();
  const auto [first, last] = buckets_[r.bucket];
  at::Tensor mine = r.work.wait()[0];
  mine.div_(static_cast<double>(world));
  int64_t off = 0;
  for (size_t i = first; i < last; ++i) {
    auto& c = chunks_[i];
    if (c.length > 0) {
      const at::Tensor piece = mine.narrow(0, off, c.length);
      if (options_.stage() >= 2) {
        grad_views_[i].add_(piece);
      } else {
        dense_grad(c.parameter).view({-1}).narrow(0, c.start, c.length).copy_(piece);
      }
    }
    off += c.chunk;
  }
}

void ZeroEngine::prepare_step(bool by_sub_group) {
  if (swap_) stats_.step_chunk_peak = 0;
  // The optimizer steps the chunks (or reads them through the masters): all of them now, or
  // each sub-group's through read_step_chunks / hold_step_chunks.
  if (!by_sub_group && swap_in_shard()) stats_.step_chunk_peak = param_shard_.numel();
  if (!has_master_weights() || !have_grads_) return;
  torch::NoGradGuard no_grad;
  for (auto& c : chunks_) {
    if (c.master.defined() && c.view.grad().defined()) {
      // fp32 (16-bit parameters), to the host (offload). Into pinned memory the copies are
      // queued on the device's stream and waited for once, below.
      at::Tensor g = torch::empty({c.length}, master_options_);
      g.copy_(c.view.grad().view({-1}), /*non_blocking=*/pinned_masters_);
      c.master.mutable_grad() = g;
    }
  }
  // The optimizer steps on the host next: every gradient must have arrived.
  if (pinned_masters_) wait_for_device();
}

at::Tensor ZeroEngine::for_gather(const at::Tensor& piece, bool fresh) const {
  if (piece.device() == device_) return fresh ? piece.clone() : piece;
  // From pinned memory the copy is queued on the device's stream, which the collective (or the
  // copies out of its result) follows.
  return piece.to(device_, /*non_blocking=*/piece.is_pinned(), /*copy=*/true);
}

void ZeroEngine::wait_for_device() const {
  const c10::impl::VirtualGuardImpl impl(device_.type());
  impl.getStream(device_).synchronize();
}

void ZeroEngine::gather_parameters() {
  finish_step_chunks();
  if (partitioning_) {
    // Gathered copies (and prefetches) of partitioned parameters predate the step.
    release_all();
    drop_prefetches();
  }
  if (has_master_weights()) {
    torch::NoGradGuard no_grad;
    c10::impl::ExcludeDispatchKeyGuard no_intercept(kGatherKey);
    for (auto& c : chunks_) {
      if (!c.master.defined()) continue;
      // Rounded to the params' dtype. A step by sub-group rounded its masters already
      // (round_masters) while their chunks were in memory: a master swapped out to NVMe holds
      // no elements, and the chunks of a shard in its swap file are not in memory now.
      const bool chunk_in_memory = !c.partitioned || parameters_resident();
      if (c.master.numel() == c.length && chunk_in_memory) {
        c.view.copy_(c.master, /*non_blocking=*/pinned_masters_);
      }
      c.master.mutable_grad().reset();
    }
    // Pinned masters: the host may write them again (a checkpoint load, the next step) only
    // after their copies to the device are done.
    if (pinned_masters_) wait_for_device();
  }
  all_gather_into_parameters([](const ZeroChunk& c) { return c.view; },
                             chunks_.front().parameter.options(), false);
  swap_out_shard();
}

void ZeroEngine::round_masters(const std::vector<at::Tensor>& stepped) {
  if (!has_master_weights()) return;
  std::unordered_set<const c10::TensorImpl*> mine;
  for (const auto& t : stepped) mine.insert(t.unsafeGetTensorImpl());
  torch::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard no_intercept(kGatherKey);
  for (auto& c : chunks_) {
    if (c.master.defined() && mine.count(c.master.unsafeGetTensorImpl()) != 0) {
      c.view.copy_(c.master);
    }
  }
}

void ZeroEngine::write_master_weights() {
  if (!has_master_weights()) return;
  VOLT_CHECK(!partitioning_, ValueError, kTag,
             " write_master_weights needs whole parameters; call restore_parameters() first.");
  all_gather_into_parameters([](const ZeroChunk& c) { return c.master; }, master_options_, true);
}

void ZeroEngine::all_gather_into_parameters(
    const std::function<at::Tensor(const ZeroChunk&)>& source, const at::TensorOptions& wire,
    bool partitioned_too) {
  torch::NoGradGuard no_grad;
  const int64_t world = group_->world_size();
  auto skip = [&](const ZeroChunk& c) { return c.partitioned && !partitioned_too; };
  if (world == 1) {
    // One rank holds every chunk whole: copy each source into its parameter (rounded to the
    // parameter's dtype as the wire copy would be), and nothing where the source is the
    // parameter's own memory (`view` of a parameter that is not partitioned).
    for (const auto& c : chunks_) {
      if (skip(c) || c.length == 0) continue;
      const at::Tensor src = source(c);
      at::Tensor dst = c.parameter.detach().view({-1}).narrow(0, c.start, c.length);
      if (src.data_ptr() == dst.data_ptr() && src.scalar_type() == dst.scalar_type()) continue;
      if (wire.dtype() != src.dtype() && wire.dtype() != dst.dtype()) {
        dst.copy_(src.to(wire.dtype()));  // the wire's rounding, as the collective path
      } else {
        dst.copy_(src);
      }
    }
    return;
  }
  size_t first = 0;
  while (first < chunks_.size()) {
    size_t last = first;
    int64_t width = 0;
    while (last < chunks_.size() && (width == 0 || (width + chunks_[last].chunk) * world <=
                                                       options_.allgather_bucket_size())) {
      // Stage 3's partitioned parameters are read from their chunks when next gathered.
      if (!skip(chunks_[last])) width += chunks_[last].chunk;
      ++last;
    }
    if (width == 0) {
      first = last;
      continue;
    }
    // One dtype and size on every rank, whatever this rank owns of the bucket: a rank without
    // an element in it must not send the parameters' dtype while the others send the masters'.
    at::Tensor send = torch::zeros({width}, wire.requires_grad(false));
    int64_t off = 0;
    for (size_t i = first; i < last; ++i) {
      if (skip(chunks_[i])) continue;
      if (chunks_[i].length > 0) send.narrow(0, off, chunks_[i].length).copy_(source(chunks_[i]));
      off += chunks_[i].chunk;
    }
    const std::vector<at::Tensor> all = all_gather_any(group_, send);
    for (int64_t j = 0; j < world; ++j) {
      off = 0;
      for (size_t i = first; i < last; ++i) {
        const auto& c = chunks_[i];
        if (skip(c)) continue;
        const int64_t start = j * c.chunk;
        const int64_t len = std::max<int64_t>(0, std::min(c.chunk, c.numel - start));
        if (len > 0) {
          c.parameter.detach().view({-1}).narrow(0, start, len).copy_(all[j].narrow(0, off, len));
        }
        off += c.chunk;
      }
    }
    first = last;
  }
}

double ZeroEngine::clip_grad_norm(double max_norm, double norm_type) {
  torch::NoGradGuard no_grad;
  const bool inf = std::isinf(norm_type);
  double local = 0.0;
  bool nan = false;  // the infinity norm's NaN, which std::max and a max reduction would drop
  for (const auto& c : chunks_) {
    if (c.length == 0 || !c.stepped().grad().defined()) continue;
    const at::Tensor g = c.stepped().grad().to(torch::kDouble);
    if (inf) {
      const double m = g.abs().max().item<double>();
      nan = nan || std::isnan(m);
      if (!std::isnan(m)) local = std::max(local, m);
    } else {
      local += g.abs().pow(norm_type).sum().item<double>();
    }
  }
  double total = 0;
  if (inf) {
    const at::Tensor both =
        group_->all_reduce(torch::tensor({local, nan ? 1.0 : 0.0}, torch::kDouble), Reduce::kMax);
    total = both[1].item<double>() != 0 ? std::nan("") : both[0].item<double>();
  } else {
    total = std::pow(
        group_->all_reduce(torch::tensor({local}, torch::kDouble), Reduce::kSum).item<double>(),
        1.0 / norm_type);
  }
  // A NaN norm makes every gradient NaN, as in one process (it was left unclipped).
  const double coef = detail::clip_coefficient(max_norm, total);
  if (coef != 1.0) {
    for (auto& c : chunks_) {
      if (c.length > 0 && c.stepped().grad().defined()) c.stepped().mutable_grad().mul_(coef);
    }
  }
  return total;
}

void ZeroEngine::zero_grad() {
  have_grads_ = false;
  window_ended_ = false;
  comm_->carried.clear();
  comm_->used.assign(chunks_.size(), false);
  for (auto& c : chunks_) {
    if (c.view.defined()) c.view.mutable_grad().reset();
    if (c.master.defined()) c.master.mutable_grad().reset();
    c.parameter.mutable_grad().reset();
  }
  if (grad_shard_.defined()) grad_shard_.zero_();
}

ZeroMemory ZeroEngine::memory() const {
  ZeroMemory m;
  std::vector<at::Tensor> params, grads, state;
  for (const auto& c : chunks_) {
    params.push_back(c.parameter);
    if (options_.stage() == 1) grads.push_back(c.parameter.grad());
  }
  if (grad_shard_.defined()) grads.push_back(grad_shard_);
  for (const auto& c : chunks_) {
    if (c.master.defined()) grads.push_back(c.master.grad());  // only between prepare and step
  }
  if (param_shard_.defined()) params.push_back(param_shard_);
  if (optimizer_ != nullptr) {
    for (const auto& kv : optimizer_->state()) {
      for (auto& t : detail::state_tensors(*kv.second)) state.push_back(t);
    }
  }
  m.parameters = detail::storage_bytes(params);
  m.gradients = detail::storage_bytes(grads);
  m.optimizer_state = detail::storage_bytes(state);
  std::vector<at::Tensor> masters;
  for (const auto& c : chunks_) {
    if (c.master.defined()) masters.push_back(c.master);
  }
  m.master_weights = detail::storage_bytes(masters);
  if (swap_ && swap_->out) m.parameters_in_files = swap_->bytes;
  return m;
}

std::ostream& operator<<(std::ostream& os, const ZeroEngineOptions& o) {
  return os << "ZeroEngineOptions(stage=" << o.stage()
            << ", reduce_bucket_size=" << o.reduce_bucket_size()
            << ", allgather_bucket_size=" << o.allgather_bucket_size()
            << ", overlap_comm=" << o.overlap_comm()
            << ", prefetch_bucket_size=" << o.prefetch_bucket_size()
            << ", param_swap_file=" << detail::quoted(o.param_swap_file())
            << ", aio_block_size=" << o.aio_block_size()
            << ", aio_queue_depth=" << o.aio_queue_depth()
            << ", aio_use_uring=" << o.aio_use_uring()
            << ", param_persistence_threshold=" << o.param_persistence_threshold()
            << ", max_live_parameters=" << o.max_live_parameters()
            << ", master_weights=" << o.master_weights()
            << ", offload_optimizer=" << o.offload_optimizer()
            << ", offload_parameters=" << o.offload_parameters()
            << ", ignore_unused_parameters=" << o.ignore_unused_parameters() << ")";
}

}  // namespace volt
