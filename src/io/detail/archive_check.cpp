#include "archive_check.h"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/detail/ascii.h"
#include "crc32.h"
#include "volt/core/check.h"

namespace volt {
namespace detail {
namespace {

// A record whose contents are inspected (pickles, code) larger than this is not one volt
// writes; data records (tensor bytes) are only bounds-checked and may be any size.
constexpr uint64_t kMaxInspected = uint64_t(1) << 28;

// libtorch 1.13 finds a class's attribute by a linear search of its names, when it loads the
// archive and at each InputArchive read, so a class of n attributes costs about n^2 string
// compares: 64,000 took 5.9 s to load and 7.6 s to read key by key here (32,000: 2.0 s and
// 2.4 s). The sum of n^2 over the archive's classes is capped at 65,536^2 (one class of 65,536,
// or 256 of 4,096, ...): at most about 15 s. A volt checkpoint has far fewer (its largest class
// is an optimizer's state, one entry per parameter tensor), and writing one of 64,000 took
// libtorch's writer 24 s, quadratic too.
constexpr uint64_t kMaxAttributePairs = uint64_t(1) << 32;

class Archive {
 public:
  Archive(const char* data, size_t size, const std::string& path)
      : d_(reinterpret_cast<const unsigned char*>(data)), n_(size), path_(path) {}

  [[noreturn]] void fail(const std::string& what) const {
    VOLT_CHECK(false, CheckpointError, "[CheckpointIO] '", path_,
               "' passed its CRC but is not an archive torch::serialize writes (", what,
               "); it was damaged or forged: use an intact checkpoint, and load checkpoints only "
               "from sources you trust.");
    __builtin_unreachable();
  }

  void check() {
    read_directory();
    for (const Entry& e : entries_) {
      const std::string rel = e.name.substr(root_.size());
      const bool pickle = ends_with(rel, ".pkl") || ends_with(rel, ".debug_pkl");
      const bool code = rel.compare(0, 5, "code/") == 0 && ends_with(rel, ".py");
      if (e.method == 8 || pickle || code || rel == "version") {
        const std::string bytes = contents(e, pickle || code || rel == "version");
        if (pickle) check_pickle(rel, bytes);
        if (code) code_files_.emplace_back(rel, bytes);
        if (rel == "version") {
          const bool digits = !bytes.empty() && bytes.size() <= 20 &&
                              std::all_of(bytes.begin(), bytes.end(), [](char c) {
                                return (c >= '0' && c <= '9') || c == '\n';
                              });
          if (!digits) fail("its version record is not a number");
        }
      }
    }
    check_code();
  }

 private:
  struct Entry {
    std::string name;
    int method = 0;
    uint32_t crc = 0;
    uint64_t comp = 0, uncomp = 0, data = 0;  // data: offset of the record's bytes
    uint64_t local = 0;                       // offset of its local header
  };

  static bool ends_with(const std::string& s, const char* suffix) {
    const size_t k = std::strlen(suffix);
    return s.size() >= k && s.compare(s.size() - k, k, suffix) == 0;
  }

  uint64_t le(uint64_t at, int bytes) const {
    if (at > n_ || static_cast<uint64_t>(bytes) > n_ - at) fail("a ZIP field lies past its end");
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | d_[at + i];
    return v;
  }

  // The ZIP container as libtorch's reader (miniz) sees it: the end record at the very end (no
  // comment), its ZIP64 version when a locator precedes it, then the central directory.
  void read_directory() {
    if (n_ < 22 || le(n_ - 22, 4) != 0x06054b50) {
      fail("no ZIP end-of-directory record at its end");
    }
    uint64_t count = le(n_ - 22 + 10, 2), cd_size = le(n_ - 22 + 12, 4);
    uint64_t cd_off = le(n_ - 22 + 16, 4);
    if (le(n_ - 22 + 4, 2) != 0 || le(n_ - 22 + 6, 2) != 0 || le(n_ - 22 + 8, 2) != count) {
      fail("a multi-disk ZIP");
    }
    if (n_ >= 42 && le(n_ - 42, 4) == 0x07064b50) {
      const uint64_t z = le(n_ - 42 + 8, 8);
      if (le(z, 4) != 0x06064b50) fail("a broken ZIP64 end record");
      const uint64_t count64 = le(z + 32, 8), size64 = le(z + 40, 8), off64 = le(z + 48, 8);
      if (le(z + 24, 8) != count64 || le(z + 16, 4) != 0 || le(z + 20, 4) != 0) {
        fail("a multi-disk ZIP64");
      }
      // The 32-bit fields either agree with the 64-bit ones or are saturated.
      if ((count != 0xffff && count != count64) || (cd_size != 0xffffffff && cd_size != size64) ||
          (cd_off != 0xffffffff && cd_off != off64)) {
        fail("its ZIP and ZIP64 end records disagree");
      }
      count = count64;
      cd_size = size64;
      cd_off = off64;
    }
    if (cd_off > n_ || cd_size > n_ - cd_off) fail("the central directory lies past its end");
    if (count == 0 || count > cd_size / 46) fail("an empty or miscounted central directory");
    std::set<std::string> names;
    uint64_t at = cd_off;
    for (uint64_t i = 0; i < count; ++i) {
      if (le(at, 4) != 0x02014b50) fail("a broken central directory entry");
      Entry e;
      const uint64_t flags = le(at + 8, 2);
      e.method = static_cast<int>(le(at + 10, 2));
      e.crc = static_cast<uint32_t>(le(at + 16, 4));
      e.comp = le(at + 20, 4);
      e.uncomp = le(at + 24, 4);
      const uint64_t name_len = le(at + 28, 2), extra_len = le(at + 30, 2);
      const uint64_t comment_len = le(at + 32, 2);
      uint64_t local = le(at + 42, 4);
      if (le(at + 34, 2) != 0) fail("a multi-disk ZIP entry");
      if ((flags & 1) != 0) fail("an encrypted ZIP entry");
      if (e.method != 0 && e.method != 8) fail("a ZIP entry neither stored nor deflated");
      const uint64_t name_at = at + 46;
      le(name_at + name_len + extra_len + comment_len - 1, 1);  // all inside the file
      e.name.assign(reinterpret_cast<const char*>(d_ + name_at), name_len);
      // ZIP64 sizes and offset, in this order, for the fields that are saturated.
      for (uint64_t x = name_at + name_len; x + 4 <= name_at + name_len + extra_len;) {
        const uint64_t id = le(x, 2), len = le(x + 2, 2);
        if (x + 4 + len > name_at + name_len + extra_len) fail("a broken ZIP extra field");
        if (id == 1) {
          uint64_t y = x + 4;
          for (uint64_t* field : {&e.uncomp, &e.comp, &local}) {
            const uint64_t saturated = 0xffffffff;
            if (*field != saturated) continue;
            if (y + 8 > x + 4 + len) fail("a short ZIP64 extra field");
            *field = le(y, 8);
            y += 8;
          }
        }
        x += 4 + len;
      }
      at = name_at + name_len + extra_len + comment_len;
      if (at > cd_off + cd_size) fail("the central directory overruns its size");
      if (e.name.empty() || e.name.size() > 4096 ||
          !std::all_of(e.name.begin(), e.name.end(), [](char c) { return c > 0x20 && c < 0x7f; })) {
        fail("a record name that is empty, too long or not printable");
      }
      if (!names.insert(e.name).second) fail("two records named '" + e.name + "'");
      if (i == 0) {
        const size_t slash = e.name.find('/');
        if (slash == std::string::npos || slash == 0) fail("records outside a root folder");
        root_ = e.name.substr(0, slash + 1);
      } else if (e.name.compare(0, root_.size(), root_) != 0) {
        fail("records outside the root folder '" + root_ + "'");
      }
      // The local header, whose own name and extra lengths place the bytes.
      if (le(local, 4) != 0x04034b50) fail("a broken local ZIP header");
      e.data = local + 30 + le(local + 26, 2) + le(local + 28, 2);
      if (e.data > cd_off || e.comp > cd_off - e.data) fail("record '" + e.name + "' overruns");
      if (e.method == 0 && e.comp != e.uncomp) fail("a stored record whose sizes differ");
      e.local = local;
      entries_.push_back(std::move(e));
    }
    // Each record's bytes are its own, as the writer lays them out one after another. Records
    // sharing bytes would make the checks below inflate one deflated record once per entry
    // naming it (a few hundred KB that inflate to 256 MiB, named a thousand times: 256 GiB
    // kept), and load one tensor's bytes as another's.
    std::vector<const Entry*> by_offset;
    for (const Entry& e : entries_) by_offset.push_back(&e);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const Entry* a, const Entry* b) { return a->local < b->local; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const Entry& a = *by_offset[i - 1];
      if (by_offset[i]->local < a.data + a.comp) {
        fail("records '" + a.name + "' and '" + by_offset[i]->name + "' share bytes");
      }
    }
  }

  // A record's bytes (inflated if deflated; its declared size and CRC-32 checked). `keep` false:
  // only inflated to check the declared size (what libtorch would allocate), nothing kept.
  std::string contents(const Entry& e, bool keep) const {
    // Deflate expands at most ~1032:1; a claim beyond that is a lie told to the allocator.
    if (e.method == 8 && e.uncomp > e.comp * 1032 + 1024) {
      fail("record '" + e.name + "' claims too much");
    }
    if (keep && e.uncomp > kMaxInspected) fail("record '" + e.name + "' is implausibly large");
    std::string out;
    if (e.method == 0) {
      out.assign(reinterpret_cast<const char*>(d_ + e.data), e.uncomp);
    } else {
      if (e.comp > 0xffffffffu) fail("record '" + e.name + "' is implausibly large");
      z_stream zs{};
      if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) fail("zlib cannot start");
      zs.next_in = const_cast<Bytef*>(d_ + e.data);
      zs.avail_in = static_cast<uInt>(e.comp);
      std::vector<char> chunk(1 << 16);
      uint64_t total = 0;
      int rc = Z_OK;
      while (rc == Z_OK) {
        zs.next_out = reinterpret_cast<Bytef*>(chunk.data());
        zs.avail_out = static_cast<uInt>(chunk.size());
        rc = inflate(&zs, Z_NO_FLUSH);
        const size_t got = chunk.size() - zs.avail_out;
        total += got;
        if (total > e.uncomp) break;
        if (keep) out.append(chunk.data(), got);
        if (rc == Z_BUF_ERROR && zs.avail_in == 0) break;
        if (rc == Z_BUF_ERROR && got > 0) rc = Z_OK;
      }
      inflateEnd(&zs);
      if (rc != Z_STREAM_END || total != e.uncomp) {
        fail("record '" + e.name + "' does not inflate to its declared size");
      }
      if (!keep) return out;
    }
    if (crc32_of(out.data(), out.size()) != e.crc)
      fail("record '" + e.name + "' fails its ZIP CRC-32");
    return out;
  }

  // ------------------------------------------------------------------------- pickles

  // Walks the opcodes of a pickle (protocols 0-5): every length fits the record, memo indices
  // are assigned in order and read only once assigned, and STOP comes before the end.
  void check_pickle(const std::string& name, const std::string& p) {
    const auto bad = [&](const std::string& why) { fail("pickle '" + name + "': " + why); };
    const uint64_t n = p.size();
    uint64_t i = 0, memo = 0;
    const auto arg = [&](int bytes) {
      if (static_cast<uint64_t>(bytes) > n - i) bad("an opcode's argument is cut off");
      uint64_t v = 0;
      for (int k = bytes - 1; k >= 0; --k) v = (v << 8) | static_cast<unsigned char>(p[i + k]);
      i += bytes;
      return v;
    };
    const auto skip = [&](uint64_t len) {
      if (len > n - i) bad("a length of " + std::to_string(len) + " bytes runs past the record");
      i += len;
    };
    const auto line = [&] {
      const size_t end = p.find('\n', i);
      if (end == std::string::npos) bad("a text argument without its newline");
      std::string s = p.substr(i, end - i);
      i = end + 1;
      return s;
    };
    const auto index = [&](const std::string& s) {
      if (s.empty() || s.size() > 10 ||
          !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        bad("a memo index that is not a number");
      }
      return std::stoull(s);
    };
    const auto put = [&](uint64_t k) {
      if (k > memo) bad("memo index " + std::to_string(k) + " skips ahead");
      if (k == memo) ++memo;
    };
    const auto get = [&](uint64_t k) {
      if (k >= memo) bad("memo index " + std::to_string(k) + " was never stored");
    };
    while (i < n) {
      const unsigned char op = static_cast<unsigned char>(p[i++]);
      switch (op) {
        case '.':  // STOP
          return;
        case '(':
        case '0':
        case '1':
        case '2':
        case 'N':
        case 'R':
        case 'b':
        case ')':
        case 't':
        case ']':
        case 'a':
        case 'e':
        case 'l':
        case '}':
        case 'd':
        case 's':
        case 'u':
        case 'Q':
        case 'o':
        case 0x81:
        case 0x85:
        case 0x86:
        case 0x87:
        case 0x88:
        case 0x89:
        case 0x8f:
        case 0x90:
        case 0x91:
        case 0x92:
        case 0x93:
        case 0x97:
        case 0x98: break;
        case 0x80: arg(1); break;  // PROTO
        case 0x95: arg(8); break;  // FRAME
        case 'K':
        case 0x82: arg(1); break;  // BININT1, EXT1
        case 'M':
        case 0x83: arg(2); break;  // BININT2, EXT2
        case 'J':
        case 0x84: arg(4); break;      // BININT, EXT4
        case 'G': arg(8); break;       // BINFLOAT
        case 'h': get(arg(1)); break;  // BINGET
        case 'j': get(arg(4)); break;  // LONG_BINGET
        case 'q': put(arg(1)); break;  // BINPUT
        case 'r': put(arg(4)); break;  // LONG_BINPUT
        case 0x94: ++memo; break;      // MEMOIZE
        case 'U':
        case 'C':
        case 0x8c:
        case 0x8a: skip(arg(1)); break;  // 1-byte lengths
        case 'T':
        case 'X':
        case 'B':
        case 0x8b: skip(arg(4)); break;  // 4-byte lengths
        case 0x8d:
        case 0x8e:
        case 0x96: skip(arg(8)); break;  // 8-byte lengths
        case 'I':
        case 'L':
        case 'F':
        case 'S':
        case 'V':
        case 'P': line(); break;
        case 'g': get(index(line())); break;  // GET
        case 'p': put(index(line())); break;  // PUT
        case 'c':
        case 'i': {  // GLOBAL, INST
          const std::string module = line(), global = line();
          if (module == "__torch__" || module.compare(0, 10, "__torch__.") == 0) {
            used_.emplace_back(module + "." + global, name);  // a class of this archive
          }
          break;
        }
        default: bad("unknown opcode " + std::to_string(op));
      }
    }
    bad("no STOP opcode");
  }

  // ------------------------------------------------------------------------- code

  struct Token {
    enum Kind { kName, kString, kPunct } kind;
    std::string text;  // kName: dotted name; kString: the literal as written; kPunct: the char
  };

  // Splits one line after its indentation; false when it holds anything the writer never prints.
  static bool tokenize(const std::string& s, size_t from, std::vector<Token>* out) {
    const auto ident_start = [](char c) { return ascii_alpha(c) || c == '_'; };
    const auto ident_char = [&](char c) { return ident_start(c) || ascii_digit(c); };
    for (size_t i = from; i < s.size();) {
      const char c = s[i];
      if (c == ' ') {
        ++i;
      } else if (ident_start(c)) {
        size_t j = i;
        for (;;) {  // identifiers joined by dots, each starting with a letter or '_'
          while (j < s.size() && ident_char(s[j])) ++j;
          if (j + 1 < s.size() && s[j] == '.' && ident_start(s[j + 1])) {
            ++j;
            continue;
          }
          break;
        }
        out->push_back({Token::kName, s.substr(i, j - i)});
        i = j;
      } else if (c == '"') {
        size_t j = i + 1;
        for (;;) {
          if (j >= s.size()) return false;
          if (s[j] == '"') break;
          if (s[j] == '\\') {
            const char e = j + 1 < s.size() ? s[j + 1] : '\0';
            if (std::strchr("\\'\"abfnrtv", e) != nullptr && e != '\0') {
              j += 2;
            } else if (e >= '0' && e <= '3' && j + 3 < s.size() && s[j + 2] >= '0' &&
                       s[j + 2] <= '7' && s[j + 3] >= '0' && s[j + 3] <= '7') {
              j += 4;
            } else {
              return false;
            }
          } else {
            ++j;
          }
        }
        out->push_back({Token::kString, s.substr(i, j + 1 - i)});
        i = j + 1;
      } else if (std::strchr("[](),:=", c) != nullptr) {
        out->push_back({Token::kPunct, std::string(1, c)});
        ++i;
      } else {
        return false;
      }
    }
    return true;
  }

  // Line `number` (1-based) of `text`, quoted for a message: at most 80 characters, bytes
  // outside printable ASCII as \xHH.
  static std::string quoted_line(const std::string& text, size_t number) {
    size_t begin = 0;
    for (size_t k = 1; k < number && begin != std::string::npos; ++k) {
      begin = text.find('\n', begin);
      if (begin != std::string::npos) ++begin;
    }
    if (begin == std::string::npos) return "\"\"";
    const size_t end = std::min(text.find('\n', begin), text.size());
    std::string out = "\"";
    static const char* hex = "0123456789abcdef";
    for (size_t i = begin; i < end && i < begin + 80; ++i) {
      const unsigned char c = static_cast<unsigned char>(text[i]);
      if (c >= 0x20 && c < 0x7f) {
        out += static_cast<char>(c);
      } else {
        out += "\\x";
        out += hex[c >> 4];
        out += hex[c & 15];
      }
    }
    if (end > begin + 80) out += "...";
    return out + "\"";
  }

  static bool is_keyword(const std::string& s) { return is_torchscript_keyword(s); }

  // A type expression at tokens[*i]: builtin names, containers with their arities, or a class
  // of this archive (recorded in *classes_used).
  bool type_at(const std::vector<Token>& t, size_t* i, std::vector<std::string>* classes_used,
               int depth) const {
    if (depth > 32 || *i >= t.size()) return false;
    if (t[*i].kind == Token::kPunct && t[*i].text == "(") {  // Tuple[()]: the empty tuple
      if (*i + 1 >= t.size() || t[*i + 1].text != ")") return false;
      *i += 2;
      return true;
    }
    if (t[*i].kind != Token::kName) return false;
    const std::string name = t[(*i)++].text;
    static const std::set<std::string> scalars = {"Tensor",  "int",      "float", "bool",  "str",
                                                  "complex", "NoneType", "Any",   "Device"};
    static const std::map<std::string, std::pair<int, int>> containers = {{"List", {1, 1}},
                                                                          {"Optional", {1, 1}},
                                                                          {"Dict", {2, 2}},
                                                                          {"Tuple", {1, 1 << 16}},
                                                                          {"Union", {1, 1 << 16}}};
    if (scalars.count(name) != 0) return true;
    if (name.compare(0, 10, "__torch__.") == 0) {
      classes_used->push_back(name);
      return true;
    }
    const auto c = containers.find(name);
    if (c == containers.end()) return false;
    if (*i >= t.size() || t[*i].text != "[") return false;
    ++*i;
    int args = 0;
    for (;;) {
      if (!type_at(t, i, classes_used, depth + 1)) return false;
      ++args;
      if (*i >= t.size()) return false;
      if (t[*i].text == "]") break;
      if (t[*i].text != ",") return false;
      ++*i;
    }
    ++*i;
    return args >= c->second.first && args <= c->second.second;
  }

  // Every code file holds only classes as torch::serialize's writer prints them, and every class
  // a type names is defined in the archive.
  void check_code() {
    std::set<std::string> defined;
    for (const auto& file : code_files_) {
      const std::string& rel = file.first;  // a plain reference: lambdas capture it in C++17
      const std::string& text = file.second;
      // code/__torch__.py -> __torch__; code/__torch__/a/b.py -> __torch__.a.b
      std::string qualifier = rel.substr(5, rel.size() - 8);
      std::replace(qualifier.begin(), qualifier.end(), '/', '.');
      const auto bad = [&](size_t line, const std::string& why) {
        fail("code file '" + rel + "' line " + std::to_string(line) + " (" +
             quoted_line(text, line) + "): " + why);
      };
      std::string klass;  // the class being read
      std::set<std::string> attributes, tensors_declared;
      std::vector<std::string> listed;  // names in __parameters__ / __buffers__
      size_t members = 0, header_line = 0;
      const auto end_class = [&](size_t line) {
        if (klass.empty()) return;
        if (members == 0) bad(header_line, "class " + klass + " has no members");
        attribute_pairs_ += uint64_t(attributes.size()) * attributes.size();
        for (const auto& name : listed) {
          if (tensors_declared.count(name) == 0) {
            bad(line, "class " + klass + " lists '" + name + "' without a Tensor attribute");
          }
        }
        klass.clear();
        attributes.clear();
        tensors_declared.clear();
        listed.clear();
        members = 0;
      };
      size_t number = 0;
      for (size_t pos = 0; pos < text.size();) {
        size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        const std::string s = text.substr(pos, end - pos);
        pos = end + 1;
        ++number;
        if (s.empty()) continue;
        std::vector<Token> t;
        const bool member = s.compare(0, 2, "  ") == 0;
        if (member && s.size() > 2 && s[2] == ' ') bad(number, "an unexpected indentation");
        if (!tokenize(s, member ? 2 : 0, &t) || t.empty()) bad(number, "not a class member");
        if (!member) {
          // class Name(Module):
          if (t.size() != 6 || t[0].text != "class" || t[1].kind != Token::kName ||
              t[1].text.find('.') != std::string::npos || is_keyword(t[1].text) ||
              t[2].text != "(" || t[3].text != "Module" || t[4].text != ")" || t[5].text != ":") {
            bad(number, "not a class header as the archive writer prints it");
          }
          end_class(number);
          klass = t[1].text;
          header_line = number;
          if (!defined.insert(qualifier + "." + klass).second) {
            bad(number, "class " + klass + " is defined twice");
          }
          continue;
        }
        if (klass.empty()) bad(number, "a member outside a class");
        ++members;
        if (t[0].kind != Token::kName) bad(number, "not a class member");
        const std::string& first = t[0].text;
        if (first == "__parameters__" || first == "__buffers__" || first == "__constants__") {
          // NAME = [ "a", "b", ]
          if (t.size() < 4 || t[1].text != "=" || t[2].text != "[" || t.back().text != "]") {
            bad(number, "a broken " + first + " list");
          }
          for (size_t i = 3; i + 1 < t.size();) {
            if (t[i].kind != Token::kString) bad(number, "a broken " + first + " list");
            if (first != "__constants__") {
              listed.push_back(t[i].text.substr(1, t[i].text.size() - 2));
            }
            ++i;
            if (t[i].text == ",") {
              ++i;
            } else if (i + 1 != t.size()) {
              bad(number, "a broken " + first + " list");
            }
          }
          continue;
        }
        // `__annotations__ = []`: printed before the first attribute when that attribute's name
        // is no identifier (it is then declared as below).
        if (first == "__annotations__" && t.size() == 4 && t[1].text == "=" && t[2].text == "[" &&
            t[3].text == "]") {
          continue;
        }
        // name : Type   or   __annotations__["name"] = Type
        std::string attr;
        size_t i = 0;
        if (first == "__annotations__") {
          if (t.size() < 6 || t[1].text != "[" || t[2].kind != Token::kString || t[3].text != "]" ||
              t[4].text != "=") {
            bad(number, "a broken __annotations__ entry");
          }
          attr = t[2].text.substr(1, t[2].text.size() - 2);
          i = 5;
        } else {
          if (first.find('.') != std::string::npos || is_keyword(first) || t.size() < 3 ||
              t[1].text != ":") {
            bad(number, "not an attribute declaration");
          }
          attr = first;
          i = 2;
        }
        std::vector<std::string> classes;
        const size_t type_start = i;
        if (!type_at(t, &i, &classes, 0) || i != t.size()) {
          bad(number, "the type of '" + attr + "' is not one the archive writer prints");
        }
        if (!attributes.insert(attr).second) bad(number, "'" + attr + "' is declared twice");
        if (attribute_pairs_ + uint64_t(attributes.size()) * attributes.size() >
            kMaxAttributePairs) {
          bad(number, "class " + klass + " has " + std::to_string(attributes.size()) +
                          " attributes, more than libtorch's reader looks up in reasonable time "
                          "(it searches a class's names one by one; at most 65,536 in one "
                          "class, fewer when other classes are large)");
        }
        const std::string& type = t[type_start].text;
        if (i == type_start + 1 && type == "Tensor") tensors_declared.insert(attr);
        if (type == "Optional" && i == type_start + 4 && t[type_start + 2].text == "Tensor") {
          tensors_declared.insert(attr);
        }
        for (auto& c : classes) used_.emplace_back(std::move(c), rel);
      }
      end_class(number);
    }
    for (const auto& [name, rel] : used_) {
      if (defined.count(name) == 0) {
        fail("'" + rel + "' names class " + name + ", which the archive's code does not define");
      }
    }
  }

  const unsigned char* d_;
  size_t n_;
  const std::string& path_;
  std::string root_;  // "<folder>/"
  std::vector<Entry> entries_;
  std::vector<std::pair<std::string, std::string>> code_files_;  // (path below root, text)
  std::vector<std::pair<std::string, std::string>> used_;        // (class, the record naming it)
  uint64_t attribute_pairs_ = 0;  // the sum of n^2 over the classes read (n: attributes)
};

}  // namespace

// The words TorchScript's lexer reserves (torch/csrc/jit/frontend/lexer.h, the same list in
// 1.13 and 2.11): as a class or attribute name they would be a parse error inside libtorch.
// Python keywords outside it (yield, lambda, ...) are plain names to TorchScript.
bool is_torchscript_keyword(const std::string& name) {
  static const std::set<std::string> k = {
      "Ellipsis", "False", "None",   "NoneType", "True",   "and",   "as",
      "assert",   "break", "class",  "continue", "def",    "del",   "elif",
      "else",     "for",   "global", "if",       "import", "in",    "is",
      "not",      "or",    "pass",   "raise",    "return", "while", "with"};
  return k.count(name) != 0;
}

void check_torch_archive(const char* data, size_t size, const std::string& path) {
  Archive(data, size, path).check();
}

}  // namespace detail
}  // namespace volt
