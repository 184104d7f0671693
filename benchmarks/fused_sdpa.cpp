// FusedSDPA vs the naive composition (matmul, softmax, matmul) on CPU: forward+backward time
// (interleaved repetitions, median) and peak resident memory of one forward+backward, each
// measured in a fresh process so the runs cannot share allocator state.
//
// Usage: volt_bench_fused_sdpa [--threads N] [--seqs 512,1024,2048,4096] [--batch B] [--heads H]
//                              [--head-dim D] [--reps R] [--causal] [--dtype f32|bf16]

#include <unistd.h>

#include <torch/torch.h>
#include <volt/volt.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "timing.h"

namespace {

using volt_bench::median;

struct Config {
  int threads = 1;
  std::vector<int64_t> seqs = {512, 1024, 2048, 4096};
  int64_t batch = 1, heads = 8, head_dim = 64;
  int reps = 3;
  bool causal = false;
  at::ScalarType dtype = at::kFloat;
};

enum class Impl { kNaive, kFusedRecompute, kFusedKeep };

const char* name(Impl i) {
  switch (i) {
    case Impl::kNaive: return "naive";
    case Impl::kFusedRecompute: return "fused (recompute)";
    case Impl::kFusedKeep: return "fused (non-recompute)";
  }
  return "?";
}

// What a libtorch user writes without a fused kernel.
at::Tensor naive(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  at::Tensor s = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(q.size(-1))));
  if (causal) {
    auto keep = at::ones({q.size(2), k.size(2)}, q.options().dtype(at::kBool)).tril();
    s = s.masked_fill(keep.logical_not(), -std::numeric_limits<float>::infinity());
  }
  return at::matmul(at::softmax(s, -1), v);
}

struct Inputs {
  at::Tensor q, k, v, g;
};

Inputs make(const Config& c, int64_t seq) {
  auto gen = at::detail::createCPUGenerator(0);
  auto o = at::TensorOptions().dtype(at::kFloat);
  Inputs in;
  in.q = at::randn({c.batch, c.heads, seq, c.head_dim}, gen, o).to(c.dtype).requires_grad_();
  in.k = at::randn({c.batch, c.heads, seq, c.head_dim}, gen, o).to(c.dtype).requires_grad_();
  in.v = at::randn({c.batch, c.heads, seq, c.head_dim}, gen, o).to(c.dtype).requires_grad_();
  in.g = at::randn({c.batch, c.heads, seq, c.head_dim}, gen, o).to(c.dtype);
  return in;
}

void fwd_bwd(Impl impl, Inputs& in, bool causal) {
  at::Tensor out;
  if (impl == Impl::kNaive) {
    out = naive(in.q, in.k, in.v, causal);
  } else {
    out = volt::fused_sdpa(in.q, in.k, in.v,
                           volt::SdpaOptions()
                               .is_causal(causal)
                               .recompute(impl == Impl::kFusedRecompute)
                               .require_fused(true))
              .output;
  }
  out.backward(in.g);
  in.q.mutable_grad().reset();
  in.k.mutable_grad().reset();
  in.v.mutable_grad().reset();
}

long status_kb(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(std::strlen(field)));
  }
  return -1;
}

// Peak RSS growth (MiB) of one forward+backward, measured in this process (child mode).
double measure_peak_here(const Config& c, int64_t seq, Impl impl) {
  Inputs in = make(c, seq);
  const long before = status_kb("VmRSS:");
  std::ofstream("/proc/self/clear_refs") << "5";  // reset VmHWM to the current RSS
  fwd_bwd(impl, in, c.causal);
  return (status_kb("VmHWM:") - before) / 1024.0;
}

// The same, in a fresh process (re-executing this binary): fork() after OpenMP has started its
// pool deadlocks in libgomp, and a fresh process shares no allocator state with the timings.
double peak_mib(const Config& c, int64_t seq, Impl impl) {
  std::ostringstream cmd;
  cmd << "/proc/" << getpid() << "/exe --peak " << seq << " " << static_cast<int>(impl)
      << " --threads " << c.threads << " --batch " << c.batch << " --heads " << c.heads
      << " --head-dim " << c.head_dim << (c.dtype == at::kBFloat16 ? " --dtype bf16" : "")
      << (c.causal ? " --causal" : "");
  FILE* pipe = popen(cmd.str().c_str(), "r");
  if (!pipe) return -1;
  double mib = -1;
  if (std::fscanf(pipe, "%lf", &mib) != 1) mib = -1;
  pclose(pipe);
  return mib;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  int64_t peak_seq = -1;
  int peak_impl = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() { return std::string(i + 1 < argc ? argv[++i] : ""); };
    if (a == "--threads")
      c.threads = std::stoi(next());
    else if (a == "--batch")
      c.batch = std::stoll(next());
    else if (a == "--heads")
      c.heads = std::stoll(next());
    else if (a == "--head-dim")
      c.head_dim = std::stoll(next());
    else if (a == "--reps")
      c.reps = std::stoi(next());
    else if (a == "--causal")
      c.causal = true;
    else if (a == "--peak") {
      peak_seq = std::stoll(next());
      peak_impl = std::stoi(next());
    } else if (a == "--dtype")
      c.dtype = next() == "bf16" ? at::kBFloat16 : at::kFloat;
    else if (a == "--seqs") {
      c.seqs.clear();
      std::stringstream ss(next());
      std::string t;
      while (std::getline(ss, t, ',')) c.seqs.push_back(std::stoll(t));
    } else {
      std::cerr << "unknown argument " << a << "\n";
      return 2;
    }
  }
  at::set_num_threads(c.threads);
  if (peak_seq > 0) {
    std::printf("%.3f\n", measure_peak_here(c, peak_seq, static_cast<Impl>(peak_impl)));
    return 0;
  }
  std::printf(
      "FusedSDPA vs naive, fwd+bwd, batch %ld, heads %ld, head_dim %ld, %s, causal=%d, "
      "torch threads %d\n\n",
      c.batch, c.heads, c.head_dim, c.dtype == at::kFloat ? "float32" : "bfloat16", c.causal,
      c.threads);
  std::printf(
      "| seq | impl | fwd+bwd ms (median of %d) | speed vs naive | peak MiB | memory vs naive |\n",
      c.reps);
  std::printf("|---|---|---|---|---|---|\n");
  const Impl impls[] = {Impl::kNaive, Impl::kFusedRecompute, Impl::kFusedKeep};
  for (int64_t seq : c.seqs) {
    std::vector<double> mem(3);
    for (int i = 0; i < 3; ++i) mem[i] = peak_mib(c, seq, impls[i]);
    Inputs in = make(c, seq);
    for (Impl impl : impls) fwd_bwd(impl, in, c.causal);  // warm-up
    std::vector<std::vector<double>> ms(3);
    for (int r = 0; r < c.reps; ++r) {
      for (int i = 0; i < 3; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        fwd_bwd(impls[i], in, c.causal);
        ms[i].push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count());
      }
    }
    const double base = median(ms[0]);
    for (int i = 0; i < 3; ++i) {
      std::printf("| %ld | %s | %.1f | %.2fx | %.0f | %.1fx less |\n", seq, name(impls[i]),
                  median(ms[i]), base / median(ms[i]), mem[i], mem[0] / std::max(mem[i], 1.0));
    }
    std::fflush(stdout);
  }
  return 0;
}
