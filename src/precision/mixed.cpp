#include "volt/precision/mixed.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <ostream>

#include "core/detail/file_lock.h"
#include "core/detail/machine.h"
#include "core/detail/numbers.h"
#include "detail/linear_policy.h"
#include "volt/core/atomic_file.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/precision/autocast.h"
#include "volt/precision/autocast_ops.h"

namespace volt {
namespace {

template <typename T>
std::ostream& print_list(std::ostream& os, const std::vector<T>& v) {
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os << "]";
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const MixedPrecisionOptions& o) {
  os << "MixedPrecisionOptions(dtype=" << o.dtype() << ", lower_ops=";
  print_list(os, o.lower_ops()) << ", fp32_ops=";
  print_list(os, o.fp32_ops())
      << ", cpu_policy=" << (o.cpu_policy() ? "true" : "false") << ", linear_min_macs="
      << (o.linear_min_macs() ? std::to_string(*o.linear_min_macs()) : std::string("measured"))
      << ", read_env_lists=" << (o.read_env_lists() ? "true" : "false")
      << ", loss_scaling=" << (o.loss_scaling() ? (*o.loss_scaling() ? "true" : "false") : "auto")
      << ", scaler=" << o.scaler() << ")";
  return os;
}

MixedPrecision::MixedPrecision(MixedPrecisionOptions options) : options_(std::move(options)) {
  VOLT_CHECK(options_.dtype() == "bf16" || options_.dtype() == "fp16", ConfigError,
             "[MixedPrecision] dtype=\"", options_.dtype(),
             "\" is not supported; use \"bf16\" "
             "or \"fp16\".");
  dtype_ = options_.dtype() == "bf16" ? c10::kBFloat16 : c10::kHalf;
  VOLT_CHECK(!options_.linear_min_macs() || *options_.linear_min_macs() >= 0, ConfigError,
             "[MixedPrecision] linear_min_macs=", options_.linear_min_macs().value_or(0),
             " must be >= 0 (0 turns the size rule off; leave it unset to measure it).");
  lower_ops_ = options_.lower_ops();
  fp32_ops_ = options_.fp32_ops();
  // The reference reads LOWER_LIST / FP32_LIST before any instance exists; volt reads them
  // once, here, so a run's lists cannot change under it.
  if (options_.read_env_lists()) {
    for (auto& n : AutocastOpLists::read_env_list("LOWER_LIST")) lower_ops_.push_back(n);
    for (auto& n : AutocastOpLists::read_env_list("FP32_LIST")) fp32_ops_.push_back(n);
  }
  // Op names are checked now, so a typo fails where the options are built (the CLI's exit 2),
  // not minutes later at setup.
  AutocastOpLists::resolve_lists(lower_ops_, fp32_ops_);
  const bool scaling = options_.loss_scaling().value_or(dtype_ == c10::kHalf);
  if (scaling) scaler_ = std::make_unique<GradScaler>(options_.scaler());
}

MixedPrecision::~MixedPrecision() = default;

std::string MixedPrecision::name() const {
  return dtype_ == c10::kBFloat16 ? "bf16-mixed" : "16-mixed";
}

void MixedPrecision::setup(c10::Device device) {
  device_ = device.type();
  // Constructing a guard checks the device/dtype pair (NotAvailable for fp16 on a 1.13 CPU).
  { AutocastGuard probe(device_, dtype_); }
  op_lists_.reset();  // a second setup in one process re-registers from scratch
  std::vector<std::string> fp32 = fp32_ops_;
  if (device_ == c10::kCPU && options_.cpu_policy() && dtype_ == c10::kBFloat16) {
    const CpuProbe& probe = cpu_probe();
    // An explicit linear_min_macs is the user's matmul policy: it replaces the measured one.
    CpuProbe decided = probe;
    if (options_.linear_min_macs()) decided.matmul_speedup = std::max(1.0, probe.matmul_speedup);
    const auto slow = cpu_fp32_ops(decided);
    auto figures = detail::c_stream<std::ostringstream>();
    figures << std::fixed << std::setprecision(2) << "bf16 matmuls at " << probe.matmul_speedup
            << "x and convolutions at " << probe.conv_speedup << "x fp32 speed";
    if (slow.empty()) {
      static std::once_flag once;
      std::call_once(once, [&] {
        log_info("MixedPrecision", "this CPU runs " + figures.str() + " (probe at setup)");
      });
    } else {
      warn_once("bf16-slow-cpu", "MixedPrecision",
                "this CPU runs " + figures.str() + "; the slower families stay in fp32 (" +
                    std::to_string(slow.size()) +
                    " ops), so bf16-mixed gains little here; use 32-true, or force them with "
                    "lower_ops / cpu_policy(false).");
    }
    for (auto& op : slow) {
      // The user's lower list wins over volt's measured default.
      const auto bare = [](std::string n) { return n.rfind("aten::", 0) == 0 ? n.substr(6) : n; };
      const bool user_lowered = std::any_of(lower_ops_.begin(), lower_ops_.end(), [&](auto& n) {
        const auto b = bare(n);
        return b == op || b.substr(0, b.find('.')) == op;
      });
      if (!user_lowered && std::find(fp32.begin(), fp32.end(), op) == fp32.end()) {
        fp32.push_back(op);
      }
    }
  }
  if (!lower_ops_.empty() || !fp32.empty()) {
    op_lists_ = std::make_unique<AutocastOpLists>(device_, dtype_, lower_ops_, fp32);
  }
  size_rule_.reset();
  if (device_ == c10::kCPU && options_.cpu_policy() && dtype_ == c10::kBFloat16) {
    const CpuProbe& probe = cpu_probe();
    // The user's lists (and the family demotion above) decide the ops they name.
    std::vector<std::string> listed;
    if (op_lists_) {
      for (const auto* l : {&op_lists_->lower_overloads(), &op_lists_->fp32_overloads()}) {
        for (const auto& n : *l) listed.push_back(n);
      }
    }
    const int64_t min_macs = options_.linear_min_macs().value_or(probe.matmul_min_macs);
    if (min_macs > 0 && !(std::count(listed.begin(), listed.end(), "linear") &&
                          std::count(listed.begin(), listed.end(), "addmm") &&
                          std::count(listed.begin(), listed.end(), "matmul"))) {
      size_rule_ = detail::install_cpu_linear_size_rule(min_macs, listed);
      static std::once_flag once;
      std::call_once(once, [&] {
        log_info(
            "MixedPrecision",
            "linears under " + std::to_string(min_macs) + " multiply-adds stay fp32 (" +
                (options_.linear_min_macs() ? "linear_min_macs" : "bf16 measured slower there") +
                ")");
      });
    }
  }
}

namespace {

// The probe's figures are cached per machine: every process of a job (and a resumed job) must
// make the same fp32/bf16 decisions, which a timing taken by each process under different load
// does not guarantee (ranks would compute different ops in bf16, and a resumed run would not
// continue the killed one bit for bit). One file per CPU model, thread count and libtorch/volt
// version; the first process measures under an exclusive flock while the others wait for it
// (a dead holder releases the lock), then everyone reads the file.
std::string probe_cache_key() {
  auto key = detail::c_stream<std::ostringstream>();
  key << "bf16 probe v1|" << detail::cpu_model_name() << "|threads " << at::get_num_threads()
      << "|torch " << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR << "."
      << TORCH_VERSION_PATCH;
  return key.str();
}

c10::optional<MixedPrecision::CpuProbe> read_probe(const std::string& path,
                                                   const std::string& key) {
  auto in = detail::c_stream<std::ifstream>(path);
  std::string line;
  if (!std::getline(in, line) || line != key) return c10::nullopt;
  MixedPrecision::CpuProbe p;
  std::string a, b, c;
  if (!(in >> a >> p.matmul_speedup >> b >> p.conv_speedup >> c >> p.matmul_min_macs) ||
      a != "matmul_speedup" || b != "conv_speedup" || c != "matmul_min_macs" ||
      !(p.matmul_speedup > 0) || !(p.conv_speedup > 0) || p.matmul_min_macs < 0) {
    return c10::nullopt;
  }
  return p;
}

using detail::FileLock;

MixedPrecision::CpuProbe measure_cpu_probe() {
  // bf16 speed on CPU ranges from ~3x fp32 (avx512_bf16 / AMX through oneDNN) to well below it
  // (emulated bf16 on older cores), so volt measures instead of guessing from CPU flags.
  auto best_of = [](const std::function<void()>& f) {
    double best = 1e30;
    for (int i = 0; i < 6; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (i > 0) best = std::min(best, ms);  // the first run warms caches and allocators
    }
    return best;
  };
  auto fwd_bwd = [](const std::function<at::Tensor()>& f, bool bf16) {
    return [f, bf16] {
      torch::AutoGradMode grad(true);
      at::Tensor loss;
      {
        AutocastGuard g(c10::kCPU, c10::kBFloat16, bf16);
        loss = f();
      }
      loss.to(at::kFloat).backward();
    };
  };
  auto gen = at::detail::createCPUGenerator(0);  // never the global generator: runs stay seeded
  auto x = at::randn({256, 512}, gen);
  auto w = at::randn({512, 512}, gen).mul_(0.05).requires_grad_();
  auto img = at::randn({16, 32, 28, 28}, gen);
  auto k = at::randn({32, 32, 3, 3}, gen).mul_(0.05).requires_grad_();
  auto mm = [&] { return at::linear(x, w).sum(); };
  auto conv = [&] { return at::conv2d(img, k, {}, 1, 1).sum(); };
  MixedPrecision::CpuProbe p;
  p.matmul_speedup = best_of(fwd_bwd(mm, false)) / best_of(fwd_bwd(mm, true));
  p.conv_speedup = best_of(fwd_bwd(conv, false)) / best_of(fwd_bwd(conv, true));
  // The size rule: from the largest size down, the first size where bf16 loses sets the
  // threshold just above it (linears that small or smaller stay fp32).
  if (p.matmul_speedup >= 1.0) {
    for (const int64_t n : {768, 512, 362, 256, 181, 128}) {
      auto xs = at::randn({64, n}, gen);
      auto ws = at::randn({n, n}, gen).mul_(0.05).requires_grad_();
      auto lin = [&] { return at::linear(xs, ws).sum(); };
      if (best_of(fwd_bwd(lin, false)) < best_of(fwd_bwd(lin, true))) {
        p.matmul_min_macs = 64 * n * n + 1;
        break;
      }
    }
  }
  return p;
}

}  // namespace

const MixedPrecision::CpuProbe& MixedPrecision::cpu_probe() {
  static const CpuProbe probe = [] {
    const std::string dir = detail::volt_cache_dir(), key = probe_cache_key();
    std::error_code ec;
    if (!dir.empty()) std::filesystem::create_directories(dir, ec);
    const std::string path =
        dir.empty() ? "" : dir + "/bf16_probe_" + detail::stable_hash_hex(key) + ".txt";
    std::unique_ptr<FileLock> lock;
    if (!path.empty()) lock = std::make_unique<FileLock>(path + ".lock");
    if (lock == nullptr || !lock->locked()) {
      warn_once("bf16-probe-cache", "MixedPrecision",
                "cannot use the probe cache in '" + dir +
                    "' (set VOLT_CACHE_DIR to a writable folder): this process measures for "
                    "itself, so processes of one job may decide bf16 ops differently.");
      return measure_cpu_probe();
    }
    if (auto cached = read_probe(path, key)) {
      log_info("MixedPrecision",
               "bf16 speed probe read from '" + path + "' (delete it to measure again)");
      return *cached;
    }
    const CpuProbe p = measure_cpu_probe();
    auto text = detail::c_stream<std::ostringstream>();
    text << key << "\n"
         << std::setprecision(17) << "matmul_speedup " << p.matmul_speedup << "\nconv_speedup "
         << p.conv_speedup << "\nmatmul_min_macs " << p.matmul_min_macs << "\n";
    try {
      atomic_write_file(path, text.str());
      log_info("MixedPrecision", "bf16 speed probe measured and cached in '" + path +
                                     "' for every process on this machine");
    } catch (const std::exception& e) {
      warn_once("bf16-probe-cache", "MixedPrecision",
                std::string("cannot write the probe cache: ") + e.what());
    }
    return p;
  }();
  return probe;
}

std::vector<std::string> MixedPrecision::cpu_fp32_ops(const CpuProbe& probe) {
  // libtorch's CPU autocast lower-precision list, split into its two families.
  std::vector<std::string> out;
  if (probe.matmul_speedup < 1.0) {
    for (const char* op : {"mm", "bmm", "addmm", "baddbmm", "addbmm", "linear", "matmul"}) {
      out.push_back(op);
    }
  }
  if (probe.conv_speedup < 1.0) {
    for (const char* op : {"conv1d", "conv2d", "conv3d", "_convolution", "conv_tbc",
                           "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"}) {
      out.push_back(op);
    }
  }
  return out;
}

void MixedPrecision::teardown() {
  size_rule_.reset();
  op_lists_.reset();
}

std::shared_ptr<void> MixedPrecision::forward_context() {
  // Without autocast's cast cache: the region spans a whole training_step, and a cached lowered
  // copy of a weight outlives what made it. One cast under no_grad (a target network, a metric)
  // has no grad_fn, so a later forward with gradients reused it and the weight got none; one
  // cast before a manual optimizer.step() kept the old values for the forwards after it.
  // Lightning clears the cache when a no_grad block exits; C++'s NoGradGuard has no such hook.
  // The cost: a weight used several times in a step (a recurrent loop, a tied embedding) is cast
  // once per use, and backward keeps each copy: memory as well as time.
  return std::make_shared<AutocastGuard>(device_, dtype_, /*enabled=*/true,
                                         /*cache_enabled=*/false);
}

void MixedPrecision::backward(const at::Tensor& loss, Module* module) {
  Precision::backward(scaler_ ? scaler_->scale(loss) : loss, module);
}

void MixedPrecision::unscale_gradients(torch::optim::Optimizer& optimizer) {
  if (scaler_) scaler_->unscale(optimizer);
}

void MixedPrecision::agree_on_found_inf(const std::function<bool(bool)>& any_rank) {
  if (scaler_) scaler_->agree_on_found_inf(any_rank);
}

void MixedPrecision::configure_loss_scaler(const GradScalerOptions& options) {
  if (!scaler_) return;
  scaler_ = std::make_unique<GradScaler>(options);
  options_.scaler(options);
}

bool MixedPrecision::optimizer_step(torch::optim::Optimizer& optimizer) {
  if (scaler_) return scaler_->step(optimizer);
  optimizer.step();
  return true;
}

void MixedPrecision::save_state(torch::serialize::OutputArchive& archive) const {
  if (!scaler_) return;
  torch::serialize::OutputArchive sub;
  scaler_->save_state(sub);
  archive.write("grad_scaler", sub);
}

void MixedPrecision::load_state(torch::serialize::InputArchive& archive) {
  if (!scaler_) return;
  torch::serialize::InputArchive sub;
  VOLT_CHECK(archive.try_read("grad_scaler", sub), CheckpointError,
             "[MixedPrecision] the checkpoint holds no loss-scaler state; it was written "
             "without loss scaling (precision ",
             name(),
             " expects it); resume with the same "
             "precision settings it was trained with.");
  scaler_->load_state(sub);
}

}  // namespace volt
