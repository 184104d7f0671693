// libFuzzer target: volt's checkpoint envelope reader (detail::parse_checkpoint, which
// TorchCheckpointIO::load calls on the bytes of a .ckpt file). Bad bytes must end in a
// CheckpointError; anything else is a finding.
//
// Input: byte 0 picks the mode, the rest is the data.
//   even: the data is the whole file (exercises magic, version, size and CRC checks);
//   odd:  the data is a payload wrapped in a correct header (magic, version, size, CRC-32), so
//         that mutated libtorch archives reach libtorch's reader and volt's translation of its
//         errors (random bytes would almost never pass the CRC).

#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz_common.h"
#include "io/detail/checkpoint_envelope.h"
#include "volt/core/errors.h"
#include "volt/io/checkpoint_io.h"

namespace {

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool wrap = data[0] & 1;
  std::string file;
  if (wrap) {
    const std::string payload(reinterpret_cast<const char*>(data + 1), size - 1);
    file.append("VOLTCKPT", 8);
    put_le(file, volt::TorchCheckpointIO::kFormatVersion, 4);
    put_le(file, payload.size(), 8);
    put_le(file,
           crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(payload.data()),
                 static_cast<uInt>(payload.size())),
           4);
    file += payload;
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
