#pragma once
// OptimizerSwapper: ZeRO-Infinity's optimizer-state offload to NVMe (arXiv 2104.07857; issue
// #12). Between steps the per-parameter state tensors of one optimizer live in one file; a step
// runs sub-group by sub-group with the next sub-group's read and the previous one's write in
// flight while the current one steps (DeepSpeed's pipelined swapping). It works only from the
// optimizer's param_groups() and state(), whatever those parameters are (ZeRO chunks, fp32
// master copies).

#include <c10/core/Storage.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/detail/aio.h"
#include "core/detail/state_key.h"
#include "strategies/detail/sub_groups.h"

namespace volt {
namespace detail {

class OptimizerSwapper {
 public:
  /// Keeps `optimizer`'s state in `file` (created; removed by the destructor). Sub-groups hold
  /// parameters of about `sub_group_size` elements together (at least one parameter each).
  /// `swap_parameters`: the parameters themselves swap too (ZeRO's fp32 master weights, which
  /// only the optimizer reads: DeepSpeed swaps them with their state); a parameter is in memory
  /// only while its sub-group steps (and after swap_in_all()), and holds no elements otherwise.
  OptimizerSwapper(torch::optim::Optimizer& optimizer, std::string file, AioOptions aio,
                   int64_t sub_group_size, bool swap_parameters = false);
  ~OptimizerSwapper();
  OptimizerSwapper(const OptimizerSwapper&) = delete;
  OptimizerSwapper& operator=(const OptimizerSwapper&) = delete;

  /// What a step does around each sub-group besides swapping its state (sub_groups.h).
  using SubGroupHooks = detail::SubGroupHooks;
  /// Runs `step` (which calls optimizer.step()) once per sub-group with the param groups
  /// narrowed to that sub-group and its state swapped in, with `hooks` around it; afterwards
  /// all state is in the file and none in memory. Returns whether every call returned true.
  bool step(const std::function<bool()>& step, const SubGroupHooks& hooks = {});
  /// Reads every swapped-out state tensor back into memory (before a checkpoint is saved, at
  /// the end of a run).
  void swap_in_all();
  /// Writes all state present in memory to the file and frees it (after a save, or after a
  /// load replaced the state objects: the file layout is rebuilt from scratch).
  void swap_out_all(bool relayout = false);
  /// Bytes of optimizer state (and swapped parameters) the file holds now (0 while swapped in).
  int64_t file_bytes() const;
  /// Sub-groups of the last step.
  int64_t sub_groups() const { return last_sub_groups_; }
  const std::string& file() const { return file_->path(); }

 private:
  static constexpr size_t kParameter = static_cast<size_t>(-1);  // Piece::index of the param
  struct Piece {
    size_t index;  // into the state's tensor list, or kParameter
    std::vector<int64_t> sizes;
    at::ScalarType dtype;
    int64_t bytes;
    int64_t offset;
  };
  struct Record {
    std::vector<Piece> pieces;
    bool resident = true;
  };
  struct Pending {
    at::Tensor target;  // the state's tensor, installed on completion
    at::Tensor buffer;
  };
  int64_t elements(const at::Tensor& param) const;  // swapped out or not
  void submit_reads(const std::vector<at::Tensor>& params, std::vector<Pending>& out);
  void install(std::vector<Pending>& pending);
  void write_out(const std::vector<at::Tensor>& params, bool relayout);
  void finish_io();

  torch::optim::Optimizer& optimizer_;
  std::unique_ptr<AioFile> file_;
  int64_t sub_group_size_;
  bool swap_parameters_;
  std::map<OptimizerStateKey, Record> records_;
  int64_t end_ = 0;                    // file bytes allocated
  std::vector<c10::Storage> writing_;  // storages of writes in flight (kept alive)
  int64_t last_sub_groups_ = 0;
  int64_t kill_after_writes_ = -1;  // fault injection for the tests (see the .cpp)
  int64_t writes_ = 0;
};

}  // namespace detail
}  // namespace volt
