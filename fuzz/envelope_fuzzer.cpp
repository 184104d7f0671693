// libFuzzer target: volt's checkpoint envelope reader (detail::parse_checkpoint, which
// TorchCheckpointIO::load calls on the bytes of a .ckpt file). Bad bytes must end in a
// CheckpointError; anything else is a finding.
//
// Input: byte 0 modulo 3 picks the mode, the rest is the data.
//   0: the data is the whole file (exercises magic, version, size and CRC checks);
//   1: the data is a payload wrapped in a correct header (magic, version, size, CRC-32), so
//      that mutated archives reach volt's archive check and libtorch's reader (random bytes
//      would almost never pass the CRC);
//   2: the data is a list of records, each [name length: 1 byte][name][size: 2 bytes LE][bytes],
//      zipped by libtorch's own writer (code/ records deflated, as it writes them) and wrapped:
//      the ZIP's sizes and CRCs are then right, so mutations of the pickles and the code text
//      reach the archive check's pickle walk and code grammar, and libtorch behind it, instead
//      of stopping at a ZIP CRC (session 24; libtorch itself does not check a code record's CRC
//      before parsing it, which is how the importer crash was reachable).

#include <caffe2/serialize/inline_container.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>

#include "fuzz_common.h"
#include "io/detail/checkpoint_envelope.h"
#include "volt/core/errors.h"
#include "volt/io/checkpoint_io.h"

namespace {

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Mode 2's records zipped as libtorch's writer zips an archive (a repeated name is skipped: the
// writer asserts on it, and its destructor would then finish the archive while unwinding).
bool zip_records(const uint8_t* data, size_t size, std::string* zip) {
  std::set<std::string> names = {"version", ".data/version"};  // the writer adds its own
  try {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* p, size_t n) {
      zip->append(static_cast<const char*>(p), n);
      return n;
    });
    size_t i = 0;
    while (i < size) {
      const size_t name_len = data[i++];
      if (name_len == 0 || name_len > size - i) break;
      const std::string name(reinterpret_cast<const char*>(data + i), name_len);
      i += name_len;
      size_t len = 0;
      if (size - i >= 2) len = data[i] | (size_t(data[i + 1]) << 8);
      i += std::min<size_t>(2, size - i);
      len = std::min(len, size - i);
      if (names.insert(name).second) {
        writer.writeRecord(name, data + i, len, /*compress=*/name.compare(0, 5, "code/") == 0);
      }
      i += len;
    }
    writer.writeEndOfFile();
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

std::string envelope(const std::string& payload) {
  std::string file;
  file.append("VOLTCKPT", 8);
  put_le(file, volt::TorchCheckpointIO::kFormatVersion, 4);
  put_le(file, payload.size(), 8);
  put_le(file,
         crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(payload.data()),
               static_cast<uInt>(payload.size())),
         4);
  return file + payload;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 3;
  std::string file;
  if (mode == 1) {
    file = envelope(std::string(reinterpret_cast<const char*>(data + 1), size - 1));
  } else if (mode == 2) {
    std::string zip;
    if (!zip_records(data + 1, size - 1, &zip)) return 0;
    file = envelope(zip);
  } else {
    file.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  }
  try {
    torch::serialize::InputArchive archive = volt::detail::parse_checkpoint(file, "fuzz.ckpt");
    // Read what volt reads first from every checkpoint it loads: a key that may be missing.
    c10::IValue v;
    volt_fuzz::trace(std::string("accepted; volt_format ") +
                     (archive.try_read("volt_format", v) ? "present" : "absent"));
  } catch (const volt::CheckpointError& e) {
    volt_fuzz::trace(std::string("refused: ") + e.what());
  } catch (const std::exception& e) {
    volt_fuzz::finding(std::string("parse_checkpoint let a non-CheckpointError escape: ") +
                       e.what());
  }
  return 0;
}
