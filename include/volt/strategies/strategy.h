#pragma once
/// Strategy: owns the accelerator, precision and checkpoint IO, and how the model is placed,
/// backpropagated, stepped, reduced across processes and checkpointed.

#include <ATen/Tensor.h>
#include <c10/util/Optional.h>
#include <torch/serialize/archive.h>

#include <memory>
#include <string>

#include "volt/accelerators/accelerator.h"
#include "volt/core/run_context.h"
#include "volt/data/batch.h"
#include "volt/io/checkpoint_io.h"
#include "volt/precision/precision.h"

namespace volt {

class Module;

/// The Trainer talks to devices, precision and (later) process groups only through this class.
/// Sharded strategies may partition parameters, gradients and optimizer state: nothing outside
/// the Strategy assumes a parameter is whole or that optimizer state is local.
class Strategy {
 public:
  Strategy(std::shared_ptr<Accelerator> accelerator, std::shared_ptr<Precision> precision,
           std::shared_ptr<CheckpointIO> checkpoint_io);
  virtual ~Strategy() = default;
  /// Registry name ("single_device").
  virtual std::string name() const = 0;
  /// Creates process groups etc. Called once before anything else.
  virtual void setup_environment() {}
  /// Moves the module to the root device and lets precision convert it.
  virtual void setup_module(Module& module);
  virtual c10::Device root_device() const = 0;
  virtual Batch batch_to_device(const Batch& batch) const;
  virtual void backward(const at::Tensor& loss);
  /// Unscales, optionally clips (value > 0), then steps; false if precision skipped the step.
  virtual bool optimizer_step(torch::optim::Optimizer& optimizer, c10::optional<double> clip_value,
                              ClipAlgorithm algorithm);
  /// Reduces a tensor across processes (identity for one process).
  virtual at::Tensor reduce(const at::Tensor& value, Reduce op) const { return value; }
  virtual void barrier() {}
  virtual int64_t rank() const { return 0; }
  virtual int64_t world_size() const { return 1; }
  bool is_global_zero() const { return rank() == 0; }

  virtual void save_model_state(const Module& module, torch::serialize::OutputArchive& ar) const;
  virtual void load_model_state(Module& module, torch::serialize::InputArchive& ar) const;
  virtual void save_optimizer_state(const torch::optim::Optimizer& optimizer, const Module& module,
                                    torch::serialize::OutputArchive& ar) const;
  virtual void load_optimizer_state(torch::optim::Optimizer& optimizer, const Module& module,
                                    torch::serialize::InputArchive& ar) const;
  /// Writes the checkpoint (only the global-zero process writes).
  virtual void save_checkpoint(torch::serialize::OutputArchive& archive, const std::string& path);
  virtual torch::serialize::InputArchive load_checkpoint(const std::string& path);
  virtual void remove_checkpoint(const std::string& path);
  virtual void teardown() {}

  Accelerator& accelerator() const { return *accelerator_; }
  Precision& precision() const { return *precision_; }
  CheckpointIO& checkpoint_io() const { return *checkpoint_io_; }

 protected:
  std::shared_ptr<Accelerator> accelerator_;
  std::shared_ptr<Precision> precision_;
  std::shared_ptr<CheckpointIO> checkpoint_io_;
};

/// One process, one device ("single_device").
class SingleDeviceStrategy : public Strategy {
 public:
  SingleDeviceStrategy(c10::Device device, std::shared_ptr<Accelerator> accelerator,
                       std::shared_ptr<Precision> precision,
                       std::shared_ptr<CheckpointIO> checkpoint_io = nullptr);
  std::string name() const override { return "single_device"; }
  c10::Device root_device() const override { return device_; }

 private:
  c10::Device device_;
};

}  // namespace volt
