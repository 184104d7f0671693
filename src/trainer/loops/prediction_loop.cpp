// The prediction loop: predict_step over a loader, outputs collected in order.
#include <torch/torch.h>

#include "trainer/detail/run.h"

namespace volt {
namespace detail {

std::vector<at::Tensor> prediction_loop(Run& r, DataLoader& loader, int64_t limit) {
  Module& m = *r.module;
  std::vector<at::Tensor> out;
  torch::NoGradGuard no_grad;
  m.eval();
  r.eval_pass = "predict";
  r.eval_batch = -1;
  r.callback_hook("on_predict_start", [&](Callback& c) { c.on_predict_start(r, m); });
  BatchStream stream = loader.stream(0, 0, limit);
  Batch raw;
  int64_t idx = 0;
  for (r.eval_batch = 0; r.next_batch(stream, raw, "get_predict_batch"); r.eval_batch = idx) {
    Batch batch = r.strategy().batch_to_device(raw);
    Run::Part part(r, "predict_step");
    ProfileScope p(r.prof, "predict_step");
    out.push_back(r.strategy().predict_step(m, batch, idx++));
    r.check_stop_in_evaluation(/*pass_done=*/false);
  }
  r.eval_batch = -1;
  r.check_stop_in_evaluation(/*pass_done=*/true);
  r.callback_hook("on_predict_end", [&](Callback& c) { c.on_predict_end(r, m); });
  r.eval_pass = nullptr;
  return out;
}

}  // namespace detail
}  // namespace volt
