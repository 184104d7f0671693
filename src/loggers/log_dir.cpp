#include "detail/log_dir.h"

#include <dirent.h>
#include <sys/stat.h>
#include <torch/serialize/archive.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <regex>

#include "core/detail/ascii.h"
#include "core/detail/numbers.h"
#include "core/detail/version_folder.h"
#include "volt/core/atomic_file.h"
#include "volt/core/check.h"
#include "volt/core/log.h"

namespace volt {
namespace detail {
namespace {

// YAML 1.1 readers (PyYAML, hence Lightning and TensorBoard tooling) resolve these plain words
// to booleans or null; yaml-cpp's emitter quotes only some of them. Values are strings here.
// Numbers as C++ and Python print them stay plain (PyYAML reads them back as the same number, or
// one with an exponent and no point, 1e-05, as that same text); other
// text that PyYAML's resolvers take for a number or a date is quoted: "010" (octal 8), "1:20"
// (sexagesimal 80), "0x1F", "1_000", ".5", "2024-01-02".
bool yaml_reads_as_non_string(const std::string& s) {
  // "=" and "<<" are PyYAML's value and merge keys: its full_load (Lightning's hparams reader)
  // refuses them plain.
  static const char* kWords[] = {"y",    "n",     "yes",  "no", "on", "off",
                                 "true", "false", "null", "~",  "=",  "<<"};
  const std::string lower = ascii_lower(s);
  for (const char* w : kWords) {
    if (lower == w) return true;
  }
  if (is_printed_number(s)) return false;
  // PyYAML's implicit resolvers for int, float and timestamp (yaml/resolver.py).
  static const std::regex kPyYaml(
      R"([-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)"
      R"(|[-+]?[1-9][0-9_]*(:[0-5]?[0-9])+)"
      R"(|[-+]?[0-9][0-9_]*\.[0-9_]*([eE][-+][0-9]+)?|\.[0-9][0-9_]*([eE][-+][0-9]+)?)"
      R"(|[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+\.[0-9_]*|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN))"
      R"(|[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}([Tt \t].*)?)");
  return std::regex_match(s, kPyYaml);
}

void emit_string(YAML::Emitter& out, const std::string& s) {
  if (yaml_reads_as_non_string(s)) out << YAML::DoubleQuoted;
  out << s;
}

}  // namespace

bool is_printed_number(const std::string& s) {
  static const std::regex kPrinted(R"(-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?)");
  return std::regex_match(s, kPrinted);
}

void make_dirs(const std::string& path, const std::string& component) {
  std::string cur;
  auto ss = detail::c_stream<std::stringstream>(path);
  std::string part;
  if (!path.empty() && path[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
      VOLT_CHECK(false, ConfigError, "[", component, "] cannot create folder '", cur, "' (",
                 std::strerror(errno), "); choose a writable save_dir.");
    }
    struct stat st;
    VOLT_CHECK(::stat(cur.c_str(), &st) == 0 && S_ISDIR(st.st_mode), ConfigError, "[", component,
               "] cannot create folder '", cur,
               "': a file of that name is in the way; choose another path.");
  }
}

std::string version_root(const std::string& save_dir, const std::string& name) {
  std::error_code ec;
  const auto path = std::filesystem::absolute(std::filesystem::path(save_dir) / name, ec);
  return (ec ? std::filesystem::path(save_dir) / name : path).lexically_normal().string();
}

bool continues_saved_version(const std::string& saved_root, int64_t saved, const std::string& root,
                             int64_t option_version, const std::string& component) {
  if (!saved_root.empty() && saved_root != root) {
    log_warning(component, "the checkpoint's logs are in '" + saved_root + "/version_" +
                               std::to_string(saved) + "', not under '" + root +
                               "': this run logs into a version of its own there.");
    return false;
  }
  if (option_version >= 0 && option_version != saved) {
    log_warning(component, "the checkpoint's logs are version_" + std::to_string(saved) +
                               " but version=" + std::to_string(option_version) +
                               " was asked for: the resumed run logs into version_" +
                               std::to_string(option_version) + ".");
    return false;
  }
  return true;
}

int64_t next_version(const std::string& root) {
  int64_t next = 0;
  if (DIR* d = ::opendir(root.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (const auto n = version_folder_number(e->d_name)) next = std::max<int64_t>(next, *n + 1);
    }
    ::closedir(d);
  }
  return next;
}

namespace {

// The roots a live SharedVersionClaims shares, with the version claimed for each (-1: none yet).
std::mutex& shared_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, int64_t>& shared_roots() {
  static std::map<std::string, int64_t> roots;
  return roots;
}
std::string root_key(const std::string& root) {
  return std::filesystem::path(root).lexically_normal().string();
}

int64_t claim_unshared(const std::string& root, const std::string& component) {
  make_dirs(root, component);
  for (int64_t n = next_version(root);; ++n) {
    const std::string dir = root + "/version_" + std::to_string(n);
    if (::mkdir(dir.c_str(), 0755) == 0) return n;
    VOLT_CHECK(errno == EEXIST, ConfigError, "[", component, "] cannot create folder '", dir, "' (",
               std::strerror(errno), "); choose a writable save_dir.");
  }
}

}  // namespace

SharedVersionClaims::SharedVersionClaims(const std::vector<std::string>& roots) {
  std::lock_guard<std::mutex> lock(shared_mutex());
  for (const auto& r : roots) {
    if (shared_roots().emplace(root_key(r), -1).second) roots_.push_back(root_key(r));
  }
}

SharedVersionClaims::~SharedVersionClaims() {
  std::lock_guard<std::mutex> lock(shared_mutex());
  for (const auto& r : roots_) shared_roots().erase(r);
}

int64_t claim_next_version(const std::string& root, const std::string& component) {
  std::unique_lock<std::mutex> lock(shared_mutex());
  const auto it = shared_roots().find(root_key(root));
  if (it == shared_roots().end()) {
    lock.unlock();
    return claim_unshared(root, component);
  }
  if (it->second < 0) it->second = claim_unshared(root, component);
  return it->second;
}

void save_version_state(torch::serialize::OutputArchive& ar, int64_t version,
                        const std::string& save_dir, const std::string& name) {
  ar.write("version", c10::IValue(version));
  ar.write("root", c10::IValue(version_root(save_dir, name)));
}

int64_t resumed_version(torch::serialize::InputArchive& ar, const std::string& save_dir,
                        const std::string& name, int64_t option_version, int64_t claimed,
                        const std::string& component) {
  c10::IValue v;
  ar.read("version", v);
  if (v.toInt() < 0) return -1;
  c10::IValue saved_root;
  const bool continues = continues_saved_version(
      ar.try_read("root", saved_root) ? saved_root.toStringRef() : std::string(), v.toInt(),
      version_root(save_dir, name), option_version, component);
  if (!continues) return -1;
  if (claimed >= 0 && claimed != v.toInt() && option_version < 0) {
    // rmdir removes only an empty folder: one a logger has written to stays.
    ::rmdir((save_dir + "/" + name + "/version_" + std::to_string(claimed)).c_str());
  }
  return v.toInt();
}

Metrics with_prefix(const Metrics& metrics, const std::string& prefix) {
  if (prefix.empty()) return metrics;
  Metrics out;
  for (const auto& kv : metrics) out.emplace(prefix + "-" + kv.first, kv.second);
  return out;
}

void write_hparams_yaml(const std::string& dir, const std::map<std::string, std::string>& hparams) {
  // yaml-cpp quotes whatever YAML would misread (": ", "#", "- x", "null", newlines ...); numbers
  // stay plain.
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const auto& kv : hparams) {
    out << YAML::Key;
    emit_string(out, kv.first);
    out << YAML::Value;
    emit_string(out, kv.second);
  }
  out << YAML::EndMap;
  VOLT_ASSERT(out.good(), "hparams.yaml emitter: ", out.GetLastError());
  atomic_write_file(dir + "/hparams.yaml", std::string(out.c_str()) + "\n");
}

}  // namespace detail
}  // namespace volt
