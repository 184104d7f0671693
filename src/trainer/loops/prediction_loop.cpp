// The prediction loop: predict_step over a loader, outputs collected in order unless
// return_predictions is off (a PredictionWriter then writes them as they come).
#include <torch/torch.h>

#include "trainer/detail/run.h"

namespace volt {
namespace detail {

std::vector<std::vector<at::Tensor>> prediction_loop(Run& r, std::vector<DataLoader>& loaders,
                                                     const std::vector<int64_t>& limits) {
  Module& m = *r.module;
  std::vector<std::vector<at::Tensor>> out(loaders.size());
  const Run::NoAutograd no_autograd(r.opts.inference_mode());
  r.eval_pass = "predict";
  r.eval_batch = -1;
  struct ClearIndices {
    Run& r;
    ~ClearIndices() { r.predict_indices.clear(); }
  } clear_indices{r};
  r.st.num_dataloaders = static_cast<int64_t>(loaders.size());
  r.st.dataloader_idx = 0;
  m.save_training_modes();
  r.module_hook("on_predict_model_eval", [&](Module& mm) { mm.on_predict_model_eval(); });
  r.hook(
      "on_predict_start", [&](Module& mm) { mm.on_predict_start(); },
      [&](Callback& c) { c.on_predict_start(r, m); });
  r.hook(
      "on_predict_epoch_start", [&](Module& mm) { mm.on_predict_epoch_start(); },
      [&](Callback& c) { c.on_predict_epoch_start(r, m); });
  const bool keep = r.opts.return_predictions();
  // Several loaders run one after the other, each from batch 0.
  for (size_t d = 0; d < loaders.size(); ++d) {
    r.st.dataloader_idx = static_cast<int64_t>(d);
    r.st.num_eval_batches = limits[d];
    BatchStream stream = loaders[d].stream(0, 0, limits[d]);
    Batch raw;
    int64_t idx = 0;
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
      // Kept on the host, as Lightning's prediction loop moves what it keeps to the CPU: a
      // prediction over a whole data set would otherwise hold the device's memory.
      if (keep) out[d].push_back(prediction.defined() ? prediction.cpu() : prediction);
      ++idx;
      r.check_stop_in_evaluation(/*pass_done=*/false);
    }
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
  r.st.dataloader_idx = 0;
  return out;
}

}  // namespace detail
}  // namespace volt
