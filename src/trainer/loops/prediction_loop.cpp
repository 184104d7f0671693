// The prediction loop: predict_step over a loader, outputs collected in order unless
// return_predictions is off (a PredictionWriter then writes them as they come).
#include <torch/torch.h>

#include "trainer/detail/run.h"

namespace volt {
namespace detail {

std::vector<at::Tensor> prediction_loop(Run& r, DataLoader& loader, int64_t limit) {
  Module& m = *r.module;
  std::vector<at::Tensor> out;
  const Run::NoAutograd no_autograd(r.opts.inference_mode());
  r.eval_pass = "predict";
  r.eval_batch = -1;
  struct ClearIndices {
    Run& r;
    ~ClearIndices() { r.predict_indices.clear(); }
  } clear_indices{r};
  m.save_training_modes();
  r.module_hook("on_predict_model_eval", [&](Module& mm) { mm.on_predict_model_eval(); });
  r.hook(
      "on_predict_start", [&](Module& mm) { mm.on_predict_start(); },
      [&](Callback& c) { c.on_predict_start(r, m); });
  r.hook(
      "on_predict_epoch_start", [&](Module& mm) { mm.on_predict_epoch_start(); },
      [&](Callback& c) { c.on_predict_epoch_start(r, m); });
  BatchStream stream = loader.stream(0, 0, limit);
  Batch raw;
  int64_t idx = 0;
  const bool keep = r.opts.return_predictions();
  for (r.eval_batch = 0; r.next_batch(stream, raw, "get_predict_batch"); r.eval_batch = idx) {
    r.predict_indices = stream.last_indices();
    Batch batch = r.transfer(std::move(raw));
    r.hook(
        "on_predict_batch_start", [&](Module& mm) { mm.on_predict_batch_start(batch, idx); },
        [&](Callback& c) { c.on_predict_batch_start(r, m, batch, idx); });
    at::Tensor prediction;
    {
      Run::Part part(r, "predict_step");
      ProfileScope p(r.prof, "predict_step");
      prediction = r.strategy().predict_step(m, batch, idx);
    }
    r.hook(
        "on_predict_batch_end",
        [&](Module& mm) { mm.on_predict_batch_end(prediction, batch, idx); },
        [&](Callback& c) { c.on_predict_batch_end(r, m, prediction, batch, idx); });
    if (keep) out.push_back(std::move(prediction));
    ++idx;
    r.check_stop_in_evaluation(/*pass_done=*/false);
  }
  r.eval_batch = -1;
  r.predict_indices.clear();
  r.check_stop_in_evaluation(/*pass_done=*/true);
  r.hook(
      "on_predict_epoch_end", [&](Module& mm) { mm.on_predict_epoch_end(); },
      [&](Callback& c) { c.on_predict_epoch_end(r, m); });
  r.hook(
      "on_predict_end", [&](Module& mm) { mm.on_predict_end(); },
      [&](Callback& c) { c.on_predict_end(r, m); });
  m.restore_training_modes();  // as Lightning's prediction loop, which has no hook for it
  r.eval_pass = nullptr;
  return out;
}

}  // namespace detail
}  // namespace volt
