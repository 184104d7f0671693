#include "volt/io/safetensors.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/detail/fp8_state.h"
#include "core/detail/input_limits.h"
#include "core/detail/numbers.h"
#include "core/detail/print.h"
#include "detail/safetensors_parse.h"
#include "io/detail/whole_file.h"
#include "volt/core/check.h"
#include "volt/io/checkpoint_io.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors stores little-endian data; volt's writer assumes a little-endian host");

namespace volt {
namespace {

// The format's own limit (the reference implementation's MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeName {
  const char* name;
  at::ScalarType type;
};

// In the reference writer's layout order (safetensors' Dtype enum, descending: the wider dtypes
// first, each starting at a multiple of its element size), restricted to what libtorch 1.13 has.
const DtypeName kDtypes[] = {
    {"I64", at::kLong}, {"F64", at::kDouble},    {"C64", at::kComplexFloat}, {"F32", at::kFloat},
    {"I32", at::kInt},  {"BF16", at::kBFloat16}, {"F16", at::kHalf},         {"I16", at::kShort},
    {"I8", at::kChar},  {"U8", at::kByte},       {"BOOL", at::kBool},
};

// A dtype's place in that order.
size_t layout_rank(at::ScalarType t) {
  for (size_t i = 0; i < std::size(kDtypes); ++i) {
    if (kDtypes[i].type == t) return i;
  }
  return std::size(kDtypes);
}

std::string valid_dtype_names() {
  return detail::joined(kDtypes, [](const auto& d) { return d.name; });
}

const char* name_of(at::ScalarType t) {
  for (const auto& d : kDtypes) {
    if (d.type == t) return d.name;
  }
  VOLT_CHECK(false, ValueError, "[Safetensors] dtype ", t,
             " cannot be stored; supported: ", valid_dtype_names(),
             ". Convert the tensor first (e.g. .to(torch::kFloat)).");
  return nullptr;
}

std::string shape_str(const at::Tensor& t) {
  auto os = detail::c_stream<std::ostringstream>();
  os << t.sizes();
  return os.str();
}

}  // namespace

void save_safetensors(const std::map<std::string, at::Tensor>& tensors, const std::string& path,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  struct Laid {
    const std::string* name;
    at::Tensor t;
  };
  std::vector<Laid> data;
  for (const auto& [name, tensor] : tensors) {
    VOLT_CHECK(!name.empty() && name != "__metadata__", ValueError, "[Safetensors] tensor name '",
               name, "' is reserved or empty; rename it.");
    VOLT_CHECK(tensor.defined(), ValueError, "[Safetensors] tensor '", name,
               "' is undefined; drop it or give it a value.");
    at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
    name_of(t.scalar_type());  // a dtype the format has, before anything is laid out
    data.push_back({&name, std::move(t)});
  }
  // In the reference writer's order (its dtype order, then by name: the map's order), so the
  // bytes are Python's for the same tensors: every tensor starts at a multiple of its element
  // size, so readers that map the file cast in place.
  std::stable_sort(data.begin(), data.end(), [](const Laid& a, const Laid& b) {
    return layout_rank(a.t.scalar_type()) < layout_rank(b.t.scalar_type());
  });
  std::map<std::string, std::pair<uint64_t, uint64_t>> offsets;
  uint64_t offset = 0;
  for (const auto& d : data) {
    const uint64_t bytes = static_cast<uint64_t>(d.t.numel()) * d.t.element_size();
    offsets[*d.name] = {offset, offset + bytes};
    offset += bytes;
  }
  for (const auto& [name, span] : offsets) {
    const at::Tensor& t = tensors.at(name);
    header[name] = {{"dtype", name_of(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {span.first, span.second}}};
  }
  std::string json;
  try {
    json = header.dump();
  } catch (const nlohmann::json::type_error& e) {
    VOLT_CHECK(false, ValueError, "[Safetensors] a tensor name or metadata text is not UTF-8 (",
               e.what(), "); the header is JSON: give names and metadata as UTF-8 text.");
  }
  json.append((8 - json.size() % 8) % 8, ' ');  // keep the data 8-byte aligned, as Python does
  VOLT_CHECK(json.size() <= kMaxHeaderBytes, ValueError, "[Safetensors] the header of '", path,
             "' would be ", json.size(), " bytes, over the format's limit of ", kMaxHeaderBytes,
             " (readers refuse it); split the tensors over several files.");
  std::string file;
  file.reserve(8 + json.size() + offset);
  const uint64_t n = json.size();
  file.append(reinterpret_cast<const char*>(&n), 8);
  file += json;
  for (const auto& d : data) {
    file.append(static_cast<const char*>(d.t.data_ptr()), d.t.numel() * d.t.element_size());
  }
  atomic_write_file(path, file);
}

void save_safetensors(const torch::nn::Module& module, const std::string& path,
                      const std::map<std::string, std::string>& metadata) {
  std::map<std::string, at::Tensor> tensors;
  for (const auto& p : module.named_parameters(true)) tensors[p.key()] = p.value();
  for (const auto& b : module.named_buffers(true)) tensors[b.key()] = b.value();
  save_safetensors(tensors, path, metadata);
}

SafetensorsFile load_safetensors(const std::string& path) {
  // One buffer of the file's size; a read error or a folder is said as such (a stream read
  // them as a short file: "truncated or not safetensors").
  const std::string file =
      detail::read_whole_file(path, "[Safetensors]", "file", "check the path and permissions.");
  return detail::parse_safetensors(file, path);
}

SafetensorsFile detail::parse_safetensors(const std::string& file, const std::string& path) {
  const std::string where = "[Safetensors] '" + path + "': ";
  VOLT_CHECK(file.size() >= 8, CheckpointError, where, "file is ", file.size(),
             " bytes, shorter than the 8-byte header length; it is truncated or not safetensors.");
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  VOLT_CHECK(
      n <= kMaxHeaderBytes && n <= file.size() - 8, CheckpointError, where, "header length ", n,
      " exceeds the file (", file.size(),
      " bytes) or the format's 100,000,000-byte limit; the file is truncated or not safetensors.");
  nlohmann::json header;
  try {
    // Bounded as every JSON volt reads: the header is one level of entries whose shape and
    // offsets are lists, and 100 MB of '[' parsed unbounded took about 8 GB before failing.
    // A real header has about a dozen nodes per tensor in 100-odd bytes: the node limit grows
    // with the header (a file of 100,000 tensors is valid).
    detail::InputLimits limits;
    limits.max_bytes = kMaxHeaderBytes;
    limits.max_depth = 8;
    limits.max_nodes = std::max<size_t>(limits.max_nodes, static_cast<size_t>(n / 4));
    header = detail::parse_json_bounded(std::string(file.data() + 8, n), "Safetensors", "header",
                                        limits, "the file is damaged or not safetensors");
  } catch (const ConfigError& e) {
    // Its text is "[Safetensors] header: <what>": said once, with the path.
    const std::string what = e.what();
    const std::string inner = "[Safetensors] header: ";
    VOLT_CHECK(false, CheckpointError, where,
               "header: ", what.rfind(inner, 0) == 0 ? what.substr(inner.size()) : what);
  }
  VOLT_CHECK(header.is_object(), CheckpointError, where, "header must be a JSON object.");
  const uint64_t data_size = file.size() - 8 - n;
  const char* data = file.data() + 8 + n;

  SafetensorsFile out;
  // Every entry is checked, and the spans must tile the data section, before any tensor is
  // made: overlapping entries each naming the whole section would otherwise allocate the section
  // once per entry before the overlap was seen (1,000 of them over 64 MiB: 64 GB).
  struct Span {
    uint64_t begin, end;
    std::string name;
    at::ScalarType type;
    std::vector<int64_t> shape;
  };
  std::vector<Span> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      VOLT_CHECK(entry.is_object(), CheckpointError, where,
                 "__metadata__ must be an object of strings.");
      for (const auto& [k, v] : entry.items()) {
        VOLT_CHECK(v.is_string(), CheckpointError, where, "__metadata__ value of '", k,
                   "' is not a string.");
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    VOLT_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                   entry.contains("data_offsets"),
               CheckpointError, where, "entry '", name,
               "' needs \"dtype\", \"shape\" and \"data_offsets\".");
    const auto& dt = entry["dtype"];
    VOLT_CHECK(dt.is_string(), CheckpointError, where, "dtype of '", name, "' is not a string.");
    const std::string dtype = dt.get<std::string>();
    const DtypeName* found = nullptr;
    for (const auto& d : kDtypes) {
      if (dtype == d.name) found = &d;
    }
    VOLT_CHECK(found != nullptr, CheckpointError, where, "unknown dtype '", dtype, "' for '", name,
               "'; volt reads ", valid_dtype_names(),
               " (libtorch 1.13 has no unsigned 16-64-bit or 8-bit float types).");
    const auto& sh = entry["shape"];
    VOLT_CHECK(sh.is_array(), CheckpointError, where, "shape of '", name, "' is not a list.");
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    for (const auto& d : sh) {
      VOLT_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                 CheckpointError, where, "shape of '", name, "' must hold non-negative integers.");
      const uint64_t v = d.get<uint64_t>();
      // libtorch sizes are int64: a larger dimension would turn negative (even in an empty
      // tensor, whose other dimension is 0).
      VOLT_CHECK(v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), CheckpointError,
                 where, "shape of '", name, "' has dimension ", v, ", more than 2^63-1.");
      VOLT_CHECK(v == 0 || numel <= std::numeric_limits<uint64_t>::max() / v, CheckpointError,
                 where, "shape of '", name, "' overflows.");
      numel *= v;
      shape.push_back(static_cast<int64_t>(v));
    }
    const auto& off = entry["data_offsets"];
    VOLT_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                   off[1].is_number_unsigned(),
               CheckpointError, where, "data_offsets of '", name,
               "' must be [begin, end] with non-negative integers.");
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    VOLT_CHECK(begin <= end && end <= data_size, CheckpointError, where, "data_offsets [", begin,
               ", ", end, "] of '", name, "' are out of range (data section is ", data_size,
               " bytes).");
    const uint64_t item = c10::elementSize(found->type);
    // numel * item must not wrap around: [2^62] floats would "need" 0 bytes.
    VOLT_CHECK(numel <= std::numeric_limits<uint64_t>::max() / item, CheckpointError, where,
               "shape of '", name, "' overflows: ", numel, " elements of ", item, " bytes.");
    VOLT_CHECK(end - begin == numel * item, CheckpointError, where, "'", name, "' spans ",
               end - begin, " bytes but dtype ", dtype, " and its shape need ", numel * item, ".");
    spans.push_back({begin, end, name, found->type, std::move(shape)});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
  });
  uint64_t covered = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    VOLT_CHECK(spans[i].begin >= covered, CheckpointError, where, "tensors '", spans[i - 1].name,
               "' and '", spans[i].name, "' overlap in the data section.");
    VOLT_CHECK(spans[i].begin == covered, CheckpointError, where, "bytes [", covered, ", ",
               spans[i].begin, ") of the data section belong to no tensor; the file is damaged.");
    covered = spans[i].end;
  }
  VOLT_CHECK(covered == data_size, CheckpointError, where, "the data section has ",
             data_size - covered, " trailing bytes that belong to no tensor.");
  for (const Span& sp : spans) {
    at::Tensor t = at::empty(sp.shape, at::TensorOptions().dtype(sp.type));
    if (sp.end > sp.begin) std::memcpy(t.data_ptr(), data + sp.begin, sp.end - sp.begin);
    out.tensors[sp.name] = t;
  }
  return out;
}

void load_safetensors(torch::nn::Module& module, const std::string& path, bool strict) {
  SafetensorsFile f = load_safetensors(path);
  std::vector<std::string> problems;
  std::set<std::string> used;
  std::vector<std::string> keys;
  for (const auto& kv : f.tensors) keys.push_back(kv.first);
  detail::Fp8StateCrossing fp8(keys, module);
  // Copied only once every entry was checked, so a strict mismatch changes nothing.
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  auto load_one = [&](const std::string& name, const at::Tensor& target) {
    auto it = f.tensors.find(name);
    if (it == f.tensors.end()) {
      if (!fp8.skip_missing(name))
        problems.push_back("missing '" + name + "' " + shape_str(target));
      return;
    }
    used.insert(name);
    if (!it->second.sizes().equals(target.sizes())) {
      problems.push_back("shape of '" + name + "': file " + shape_str(it->second) + " vs model " +
                         shape_str(target));
      return;
    }
    copies.emplace_back(target, it->second);
  };
  for (auto& p : module.named_parameters(true)) load_one(p.key(), p.value());
  for (auto& b : module.named_buffers(true)) load_one(b.key(), b.value());
  for (const auto& kv : f.tensors) {
    if (!used.count(kv.first) && !fp8.skip_unexpected(kv.first)) {
      problems.push_back("unexpected '" + kv.first + "'");
    }
  }
  fp8.log("Safetensors");
  if (strict && !problems.empty()) {
    auto os = detail::c_stream<std::ostringstream>();
    os << "[Safetensors] '" << path << "' does not match the model (" << problems.size()
       << " mismatch" << (problems.size() > 1 ? "es" : "") << "): ";
    for (size_t i = 0; i < problems.size(); ++i) os << (i ? "; " : "") << problems[i];
    os << ". Load weights saved from the same model, or pass strict=false.";
    throw CheckpointError(os.str());
  }
  torch::NoGradGuard no_grad;
  for (auto& [target, saved] : copies) target.copy_(saved);
}

}  // namespace volt
