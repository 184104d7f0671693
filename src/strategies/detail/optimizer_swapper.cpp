#include "strategies/detail/optimizer_swapper.h"

#include <signal.h>
#include <unistd.h>

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/detail/state_tensors.h"
#include "volt/core/check.h"
#include "volt/core/env.h"
#include "volt/core/log.h"

namespace volt {
namespace detail {
OptimizerSwapper::OptimizerSwapper(torch::optim::Optimizer& optimizer, std::string file,
                                   AioOptions aio, int64_t sub_group_size, bool swap_parameters)
    : optimizer_(optimizer),
      file_(std::make_unique<AioFile>(std::move(file), aio, /*create=*/true)),
      sub_group_size_(sub_group_size),
      swap_parameters_(swap_parameters) {
  // Fault injection for tests/strategies/deepspeed_nvme_test.cpp: "R:N" SIGKILLs local rank R
  // right after it submits its N-th write request (the write in flight), as a crash would.
  if (const auto k = env_value("VOLT_TEST_KILL_AFTER_NVME_WRITES")) {
    const std::string spec = *k, local = env_value("LOCAL_RANK").value_or("0");
    const size_t colon = spec.find(':');
    if (colon != std::string::npos &&
        std::atoll(spec.substr(0, colon).c_str()) == std::atoll(local.c_str())) {
      kill_after_writes_ = std::atoll(spec.c_str() + colon + 1);
    }
  }
}

OptimizerSwapper::~OptimizerSwapper() {
  try {
    file_->wait();
  } catch (...) {
  }
  writing_.clear();
  std::remove(file_->path().c_str());
}

int64_t OptimizerSwapper::elements(const at::Tensor& p) const {
  // A parameter swapped out with its state holds no elements now: count its recorded shape.
  auto rec = records_.find(state_key_for(p));
  if (rec != records_.end() && !rec->second.resident) {
    for (const Piece& piece : rec->second.pieces) {
      if (piece.index != kParameter) continue;
      int64_t n = 1;
      for (int64_t d : piece.sizes) n *= d;
      return n;
    }
  }
  return p.numel();
}

void OptimizerSwapper::submit_reads(const std::vector<at::Tensor>& params,
                                    std::vector<Pending>& out) {
  auto& state = optimizer_.state();
  for (const auto& p : params) {
    const auto key = state_key_for(p);
    auto rec = records_.find(key);
    if (rec == records_.end() || rec->second.resident) continue;
    auto st = state.find(key);
    VOLT_ASSERT(st != state.end(), "swapped-out optimizer state has no state object");
    const std::vector<at::Tensor> tensors = state_tensors(*st->second);
    for (const Piece& piece : rec->second.pieces) {
      at::Tensor buffer = at::empty(piece.sizes, at::TensorOptions().dtype(piece.dtype));
      file_->submit_read(buffer.data_ptr(), piece.bytes, piece.offset);
      out.push_back(Pending{piece.index == kParameter ? p : tensors.at(piece.index), buffer});
    }
    rec->second.resident = true;
  }
}

void OptimizerSwapper::install(std::vector<Pending>& pending) {
  at::NoGradGuard no_grad;
  for (auto& p : pending) p.target.set_(p.buffer);
  pending.clear();
}

void OptimizerSwapper::write_out(const std::vector<at::Tensor>& params, bool relayout) {
  at::NoGradGuard no_grad;
  auto& state = optimizer_.state();
  for (const auto& p : params) {
    const auto key = state_key_for(p);
    auto st = state.find(key);
    if (st == state.end()) continue;  // not stepped yet (no gradient)
    auto rec = records_.find(key);
    if (rec != records_.end() && !rec->second.resident) continue;
    const std::vector<at::Tensor> tensors = state_tensors(*st->second);
    std::vector<Piece> pieces;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const at::Tensor& t = tensors[i];
      if (!t.defined() || t.numel() == 0) continue;
      VOLT_ASSERT(t.is_contiguous() && t.device().is_cpu(),
                  "optimizer state to swap is not a contiguous CPU tensor");
      pieces.push_back(Piece{i, t.sizes().vec(), t.scalar_type(),
                             static_cast<int64_t>(t.numel() * t.element_size()), -1});
    }
    if (pieces.empty()) {
      if (tensors.empty()) {
        warn_once("nvme_unknown_state", "DeepSpeedStrategy",
                  "offload_optimizer to nvme: this optimizer's state type is unknown to volt; "
                  "its state stays in memory.");
      }
      continue;
    }
    if (swap_parameters_ && p.numel() > 0) {
      VOLT_ASSERT(p.is_contiguous() && p.device().is_cpu() && p.storage_offset() == 0,
                  "a parameter to swap is not a contiguous CPU tensor owning its storage");
      pieces.push_back(Piece{kParameter, p.sizes().vec(), p.scalar_type(),
                             static_cast<int64_t>(p.numel() * p.element_size()), -1});
    }
    // Same shapes as before: the same file range; otherwise (first step, after a load) new space.
    bool same = !relayout && rec != records_.end() && rec->second.pieces.size() == pieces.size();
    for (size_t i = 0; same && i < pieces.size(); ++i) {
      same = rec->second.pieces[i].index == pieces[i].index &&
             rec->second.pieces[i].bytes == pieces[i].bytes;
    }
    // The tensors emptied so far, with what they held: a write the file refuses puts them
    // back, so the state stays whole in memory and its record (resident) stays true.
    struct Emptied {
      at::Tensor handle;
      c10::Storage storage;
      std::vector<int64_t> sizes, strides;
    };
    std::vector<Emptied> emptied;
    try {
      for (size_t i = 0; i < pieces.size(); ++i) {
        if (same) {
          pieces[i].offset = rec->second.pieces[i].offset;
        } else {
          pieces[i].offset = end_;
          end_ += (pieces[i].bytes + 4095) / 4096 * 4096;  // page-aligned ranges
        }
        const at::Tensor& t = pieces[i].index == kParameter ? p : tensors[pieces[i].index];
        writing_.push_back(t.storage());  // alive until the write completes
        file_->submit_write(t.data_ptr(), pieces[i].bytes, pieces[i].offset);
        if (kill_after_writes_ >= 0 && ++writes_ >= kill_after_writes_) {
          std::fprintf(stdout, "nvme: killed with a write in flight\n");
          std::fflush(stdout);
          ::raise(SIGKILL);
        }
        // The state object (the optimizer, for a parameter) keeps its tensor (shape gone,
        // storage released once written).
        emptied.push_back({t, t.storage(), t.sizes().vec(), t.strides().vec()});
        at::Tensor handle = t;
        handle.set_();
      }
    } catch (...) {
      for (auto& e : emptied) e.handle.set_(e.storage, 0, e.sizes, e.strides);
      throw;
    }
    Record& r = records_[key];
    r.pieces = std::move(pieces);
    r.resident = false;
  }
}

void OptimizerSwapper::finish_io() {
  file_->wait();
  writing_.clear();
}

bool OptimizerSwapper::step(const std::function<bool()>& step, const SubGroupHooks& hooks) {
  const auto groups = make_sub_groups(optimizer_, sub_group_size_,
                                      [this](const at::Tensor& p) { return elements(p); });
  last_sub_groups_ = static_cast<int64_t>(groups.size());
  const auto call = [&](const std::function<void(const std::vector<at::Tensor>&)>& hook, size_t i) {
    if (hook) hook(groups[i]);
  };
  bool ok = true;
  {
    NarrowedParams guard(optimizer_);
    std::vector<Pending> next;
    // A step that throws (the optimizer's, or a hook's) must not leave reads submitted and not
    // installed: their records already say "resident", so the state would stay empty for good
    // (and be saved so by the next checkpoint). Finish them; the step's error is the one raised.
    struct InstallPending {
      OptimizerSwapper& self;
      std::vector<Pending>& next;
      ~InstallPending() {
        if (next.empty()) return;
        try {
          self.finish_io();
          self.install(next);
        } catch (const std::exception& e) {
          log_error("OptimizerSwapper",
                    std::string("after a failed step, reading optimizer state back failed "
                                "too: ") +
                        e.what());
        }
      }
    } install_pending{*this, next};
    if (!groups.empty()) {
      submit_reads(groups[0], next);
      call(hooks.read, 0);
    }
    finish_io();
    install(next);
    for (size_t i = 0; i < groups.size(); ++i) {
      call(hooks.ready, i);
      // In flight while sub-group i steps: the reads of i + 1 and the write of i - 1.
      if (i + 1 < groups.size()) {
        submit_reads(groups[i + 1], next);
        call(hooks.read, i + 1);
      }
      guard.narrow(groups[i]);
      ok = step() && ok;
      call(hooks.after, i);
      finish_io();
      install(next);
      write_out(groups[i], false);
    }
    // Fused optimizers keep their flat state buffers for the last params they stepped: a step
    // over empty param lists (a no-op for every optimizer) lets them go.
    guard.narrow({});
    optimizer_.step();
  }
  finish_io();
  return ok;
}

void OptimizerSwapper::swap_in_all() {
  std::vector<at::Tensor> all;
  for (const auto& g : optimizer_.param_groups()) {
    for (const auto& p : g.params()) all.push_back(p);
  }
  std::vector<Pending> pending;
  submit_reads(all, pending);
  finish_io();
  install(pending);
}

void OptimizerSwapper::swap_out_all(bool relayout) {
  if (relayout) {
    finish_io();
    records_.clear();
    end_ = 0;
  }
  std::vector<at::Tensor> all;
  for (const auto& g : optimizer_.param_groups()) {
    for (const auto& p : g.params()) all.push_back(p);
  }
  write_out(all, relayout);
  finish_io();
}

int64_t OptimizerSwapper::file_bytes() const {
  int64_t n = 0;
  for (const auto& kv : records_) {
    if (kv.second.resident) continue;
    for (const auto& p : kv.second.pieces) n += p.bytes;
  }
  return n;
}

}  // namespace detail
}  // namespace volt
