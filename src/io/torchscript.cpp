// to_torchscript: libtorch's tracer records the function with the module's tensors read
// through attributes of a TorchScript module that mirrors the module's tree (the way
// torch.jit.trace records a module's forward), then the mirror holds copies of them.
#include "volt/io/torchscript.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/nn/module.h>
#include <torch/script.h>

#include <memory>
#include <unordered_map>
#include <utility>

#include "core/detail/ascii.h"
#include "core/detail/host_syncs.h"
#include "core/detail/numbers.h"
#include "core/detail/training_modes.h"
#include "kernels/detail/host_read_watch.h"
#include "volt/core/atomic_file.h"
#include "volt/core/check.h"
#include "volt/core/errors.h"
#include "volt/core/module.h"

namespace volt {
namespace {

constexpr const char* kTag = "[to_torchscript]";

std::string first_line(const std::string& s) {
  return s.substr(0, s.find('\n'));
}

// The line that says what went wrong: libtorch's message without its backtrace, and of an error
// in the TorchScript interpreter (a TorchScript traceback, then the error) its last line.
std::string summary(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  if (text.find("TorchScript interpreter") != std::string::npos) {
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    text = text.substr(text.rfind('\n') + 1);
  }
  return first_line(text);
}

// A TorchScript class name from a C++ module's name ("torch::nn::LinearImpl" -> "Linear",
// "ns::Classifier<ns::MlpNet>" -> "Classifier").
std::string class_name(const std::string& cpp_name) {
  const std::string plain = cpp_name.substr(0, cpp_name.find('<'));
  const size_t colons = plain.rfind("::");
  std::string n = plain.substr(colons == std::string::npos ? 0 : colons + 2);
  if (n.size() > 4 && n.compare(n.size() - 4, 4, "Impl") == 0) n.resize(n.size() - 4);
  for (char& c : n) {
    if (!detail::ascii_alnum(c) && c != '_') c = '_';
  }
  if (n.empty() || detail::ascii_digit(n.front())) n = "Module_" + n;
  return n;
}

// The TorchScript tree with the C++ module's tensors themselves (so that the tracer finds them),
// recording where each one sits for the copies made after the trace.
struct Slot {
  torch::jit::Module owner;
  std::string name;
};

torch::jit::Module mirror(const torch::nn::Module& m,
                          const std::shared_ptr<torch::jit::CompilationUnit>& cu,
                          std::vector<Slot>& slots) {
  torch::jit::Module jm(c10::QualifiedName("__torch__.volt_export." + class_name(m.name())), cu,
                        /*shouldMangle=*/true);
  // As a scripted nn.Module has it: Python's m.training, m.train() and m.eval() need it.
  jm.register_attribute("training", c10::BoolType::get(), m.is_training());
  for (const auto& p : m.named_parameters(/*recurse=*/false)) {
    if (!p.value().defined()) continue;
    jm.register_parameter(p.key(), p.value(), /*is_buffer=*/false);
    slots.push_back({jm, p.key()});
  }
  for (const auto& b : m.named_buffers(/*recurse=*/false)) {
    if (!b.value().defined()) continue;
    jm.register_buffer(b.key(), b.value());
    slots.push_back({jm, b.key()});
  }
  for (const auto& c : m.named_children())
    jm.register_module(c.key(), mirror(*c.value(), cu, slots));
  return jm;
}

// Puts every module of the tree back in the mode it had, whatever happens in between.
class ModesGuard {
 public:
  explicit ModesGuard(torch::nn::Module& module)
      : module_(module), modes_(detail::training_modes(module)) {}
  ~ModesGuard() { detail::set_training_modes(module_, modes_); }
  ModesGuard(const ModesGuard&) = delete;
  ModesGuard& operator=(const ModesGuard&) = delete;

 private:
  torch::nn::Module& module_;
  std::vector<bool> modes_;
};

std::vector<at::Tensor> tensors_of(const c10::IValue& v) {
  if (v.isTensor()) return {v.toTensor()};
  std::vector<at::Tensor> out;
  for (const auto& e : v.toTupleRef().elements()) out.push_back(e.toTensor());
  return out;
}

std::string shape(const at::Tensor& t) {
  auto os = detail::c_stream<std::ostringstream>();
  os << t.sizes() << " " << t.dtype();
  return os.str();
}

// Empty when `got` (the exported module's) matches `want` (the function's); else what differs.
std::string difference(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want,
                       double tolerance) {
  if (got.size() != want.size()) {
    return std::to_string(got.size()) + " outputs instead of " + std::to_string(want.size());
  }
  for (size_t i = 0; i < got.size(); ++i) {
    const at::Tensor& a = got[i];
    const at::Tensor& b = want[i];
    const std::string which = "output " + std::to_string(i);
    if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) {
      return which + " is " + shape(a) + " where the function gives " + shape(b);
    }
    const bool same = a.is_floating_point()
                          ? at::allclose(a, b.to(a.device()), tolerance, tolerance,
                                         /*equal_nan=*/true)
                          : at::equal(a, b.to(a.device()));
    if (!same) {
      auto os = detail::c_stream<std::ostringstream>();
      os << which << " differs";
      if (a.is_floating_point() && a.numel() > 0) {
        os << " (largest difference "
           << (a.to(at::kDouble) - b.to(a.device(), at::kDouble))
                  .abs()
                  .nan_to_num(0)
                  .max()
                  .item<double>()
           << ")";
      }
      return os.str();
    }
  }
  return "";
}

// The example with one more row (its first repeated) in every input whose first size is the
// first input's; nullopt when the first input has no first dimension.
c10::optional<std::vector<at::Tensor>> one_more_row(const std::vector<at::Tensor>& inputs) {
  if (inputs.front().dim() == 0 || inputs.front().size(0) == 0) return c10::nullopt;
  const int64_t rows = inputs.front().size(0);
  std::vector<at::Tensor> out;
  for (const auto& t : inputs) {
    out.push_back(t.dim() > 0 && t.size(0) == rows ? at::cat({t, t.narrow(0, 0, 1)}) : t);
  }
  return out;
}

bool identifier(const std::string& s) {
  if (s.empty() || detail::ascii_digit(s.front())) return false;
  for (char c : s) {
    if (!detail::ascii_alnum(c) && c != '_') return false;
  }
  return true;
}

}  // namespace

torch::jit::Module to_torchscript(torch::nn::Module& module, const ExportFunction& fn,
                                  const std::vector<at::Tensor>& example_inputs,
                                  const TorchScriptOptions& options) {
  VOLT_CHECK(static_cast<bool>(fn), ValueError, kTag, " got no function; pass one.");
  VOLT_CHECK(!example_inputs.empty(), ValueError, kTag,
             " got no example inputs; pass the tensors the function takes (a batch of them).");
  for (size_t i = 0; i < example_inputs.size(); ++i) {
    VOLT_CHECK(example_inputs[i].defined(), ValueError, kTag, " example input ", i,
               " is an undefined tensor; pass defined tensors only.");
  }
  VOLT_CHECK(identifier(options.method_name()), ValueError, kTag, " method_name '",
             options.method_name(),
             "' is not an identifier; use letters, digits and '_' (e.g. \"forward\").");
  VOLT_CHECK(options.check_tolerance() >= 0, ValueError, kTag, " check_tolerance ",
             options.check_tolerance(), " is negative; use 0 or more.");

  ModesGuard modes(module);
  module.eval();
  c10::NoGradGuard no_grad;

  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  std::vector<Slot> slots;
  torch::jit::Module jm = mirror(module, cu, slots);

  torch::jit::Stack stack(example_inputs.begin(), example_inputs.end());
  std::vector<std::string> names;
  for (size_t i = 0; i < example_inputs.size(); ++i) {
    names.push_back(example_inputs.size() == 1 ? "input" : "input_" + std::to_string(i));
  }
  std::shared_ptr<torch::jit::tracer::TracingState> state;
  torch::jit::Stack traced;
  std::vector<at::Tensor> traced_out;
  detail::HostReadWatch watch;
  try {
    std::tie(state, traced) = torch::jit::tracer::trace(
        std::move(stack),
        [&](torch::jit::Stack s) {
          std::vector<at::Tensor> args;
          for (auto& v : s) args.push_back(v.toTensor());
          std::vector<at::Tensor> outs = fn(args);
          VOLT_CHECK(!outs.empty(), ValueError, kTag,
                     " the function returned no tensors; return at least one.");
          for (size_t i = 0; i < outs.size(); ++i) {
            VOLT_CHECK(outs[i].defined(), ValueError, kTag, " the function's output ", i,
                       " is an undefined tensor; return defined tensors only.");
          }
          traced_out = outs;
          if (outs.size() == 1) return torch::jit::Stack{outs.front()};
          std::vector<c10::IValue> elements(outs.begin(), outs.end());
          return torch::jit::Stack{c10::ivalue::Tuple::create(std::move(elements))};
        },
        [](const at::Tensor&) { return std::string(); }, /*strict=*/true,
        /*force_outplace=*/false, &jm, names);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // libtorch's errors, and the tracer's own refusals (runtime_errors).
    throw ValueError(std::string(kTag) + " could not trace the function: " + summary(e) +
                     "; every tensor it reads must be an input, one of the module's parameters "
                     "or buffers, or a constant that needs no gradient, and it must return "
                     "tensors only.");
  }
  VOLT_CHECK(watch.op().empty(), ValueError, kTag,
             " the function read a tensor's value on the "
             "host while traced (",
             watch.op(), ": ", detail::host_sync_source(watch.op()),
             "); the export would keep that value, and any branch it decided, as a constant. "
             "Compute with tensor ops instead (e.g. at::where for a branch).");

  jm.type()->addMethod(cu->create_function(
      c10::QualifiedName(*jm.type()->name(), options.method_name()), state->graph));
  // Copies: the file must not change when the module trains on. A tensor in two places (tied
  // weights) gets one copy.
  std::unordered_map<const void*, at::Tensor> copies;
  for (auto& s : slots) {
    const at::Tensor t = s.owner.attr(s.name).toTensor();
    auto it = copies.find(t.unsafeGetTensorImpl());
    if (it == copies.end()) {
      at::Tensor copy = t.detach().clone();
      copy.set_requires_grad(t.requires_grad());
      it = copies.emplace(t.unsafeGetTensorImpl(), copy).first;
    }
    s.owner.setattr(s.name, it->second);
  }
  jm.eval();

  if (options.check()) {
    auto run_export = [&](const std::vector<at::Tensor>& inputs) {
      return tensors_of(jm.get_method(options.method_name())(
          std::vector<c10::IValue>(inputs.begin(), inputs.end())));
    };
    std::vector<at::Tensor> got;
    try {
      got = run_export(example_inputs);
    } catch (const std::exception& e) {
      throw ValueError(std::string(kTag) +
                       " the exported module fails on the example: " + summary(e) +
                       "; set TorchScriptOptions().check(false) to "
                       "export it anyway.");
    }
    const std::string diff = difference(got, traced_out, options.check_tolerance());
    VOLT_CHECK(diff.empty(), ValueError, kTag, " on the example the exported module's ", diff,
               " from the function's: the function does not depend on its inputs and the "
               "module's tensors alone (random ops in evaluation mode, state that changes "
               "between calls), which a trace cannot hold; make it deterministic, or set "
               "TorchScriptOptions().check(false).");
    const auto more = options.dynamic_batch() ? one_more_row(example_inputs) : c10::nullopt;
    if (more) {
      const int64_t rows = example_inputs.front().size(0);
      const std::string where = " at " + std::to_string(rows + 1) + " rows (the example has " +
                                std::to_string(rows) + ") ";
      const std::string fix =
          ": a size read into a C++ integer (x.size(0), a batch size passed as a number) is a "
          "constant of the trace. Compute shapes with ops that keep them (x.flatten(1), "
          "reshape({-1, ...}), view_as), or set TorchScriptOptions().dynamic_batch(false) for "
          "a model run at " +
          std::to_string(rows) + " rows only.";
      std::vector<at::Tensor> want;
      try {
        want = fn(*more);
      } catch (const std::exception& e) {
        throw ValueError(std::string(kTag) + " the function itself fails" + where + "(" +
                         summary(e) +
                         "), so the export cannot be checked at another batch size; set "
                         "TorchScriptOptions().dynamic_batch(false) if its inputs have no "
                         "batch dimension.");
      }
      try {
        got = run_export(*more);
      } catch (const std::exception& e) {
        throw ValueError(std::string(kTag) + " the exported module fails" + where + "(" +
                         summary(e) + ")" + fix);
      }
      const std::string d = difference(got, want, options.check_tolerance());
      VOLT_CHECK(d.empty(), ValueError, kTag, " the exported module's ", d, where,
                 "from the function's", fix);
    }
  }

  if (!options.file_path().empty()) {
    auto bytes = detail::c_stream<std::ostringstream>();
    jm.save(bytes);
    atomic_write_file(options.file_path(), bytes.str());
  }
  return jm;
}

torch::jit::Module to_torchscript(Module& module, const at::Tensor& example_input,
                                  const TorchScriptOptions& options) {
  return to_torchscript(
      module,
      [&module](const std::vector<at::Tensor>& in) {
        Batch batch;
        batch.input = in.front();
        at::Tensor out = module.predict_step(batch, 0);
        VOLT_CHECK(out.defined(), ValueError, kTag,
                   " predict_step returned an undefined tensor; return the prediction.");
        return std::vector<at::Tensor>{out};
      },
      {example_input}, options);
}

}  // namespace volt
