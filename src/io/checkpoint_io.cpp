#include "volt/io/checkpoint_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "detail/checkpoint_envelope.h"
#include "volt/core/check.h"

namespace volt {
namespace {

constexpr char kMagic[8] = {'V', 'O', 'L', 'T', 'C', 'K', 'P', 'T'};
constexpr size_t kHeaderSize = 8 + 4 + 8 + 4;

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

uint32_t crc_of(const char* data, size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib's crc32 takes a uInt length: feed large payloads in chunks.
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), chunk);
    data += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace

void CheckpointIO::remove(const std::string& path) { ::unlink(path.c_str()); }


void TorchCheckpointIO::save(torch::serialize::OutputArchive& archive, const std::string& path) {
  std::ostringstream payload_stream;
  archive.save_to(payload_stream);
  const std::string payload = payload_stream.str();
  std::string file;
  file.reserve(kHeaderSize + payload.size());
  file.append(kMagic, sizeof(kMagic));
  put_le(file, kFormatVersion, 4);
  put_le(file, payload.size(), 8);
  put_le(file, crc_of(payload.data(), payload.size()), 4);
  file.append(payload);
  atomic_write_file(path, file);
}

torch::serialize::InputArchive TorchCheckpointIO::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  VOLT_CHECK(in.good(), CheckpointError, "[CheckpointIO] cannot open checkpoint '", path,
             "' (", std::strerror(errno), "); check the path (ckpt_path).");
  std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return detail::parse_checkpoint(file, path);
}

torch::serialize::InputArchive detail::parse_checkpoint(const std::string& file,
                                                        const std::string& path) {
  VOLT_CHECK(file.size() >= kHeaderSize && std::memcmp(file.data(), kMagic, 8) == 0,
             CheckpointError, "[CheckpointIO] '", path,
             "' is not a volt checkpoint (bad or missing header, ", file.size(),
             " bytes); pass a .ckpt file written by volt.");
  const uint64_t version = get_le(file.data() + 8, 4);
  VOLT_CHECK(version == TorchCheckpointIO::kFormatVersion, CheckpointError, "[CheckpointIO] '",
             path, "' has format version ", version, " but this volt reads version ",
             TorchCheckpointIO::kFormatVersion, "; load it with the volt release that wrote it.");
  const uint64_t size = get_le(file.data() + 12, 8);
  const uint32_t crc = static_cast<uint32_t>(get_le(file.data() + 20, 4));
  VOLT_CHECK(file.size() - kHeaderSize == size, CheckpointError, "[CheckpointIO] '", path,
             "' is truncated or padded: header says ", size, " payload bytes, file has ",
             file.size() - kHeaderSize, "; use an intact checkpoint (e.g. an older one).");
  const uint32_t actual = crc_of(file.data() + kHeaderSize, size);
  VOLT_CHECK(actual == crc, CheckpointError, "[CheckpointIO] '", path,
             "' is corrupted: CRC-32 mismatch (stored ", crc, ", computed ", actual,
             "); use an intact checkpoint (e.g. an older one).");
  std::istringstream payload(file.substr(kHeaderSize));
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(payload);
  } catch (const c10::Error& e) {
    VOLT_CHECK(false, CheckpointError, "[CheckpointIO] '", path,
               "' passed its CRC but libtorch cannot read it (", e.what_without_backtrace(),
               "); it was probably written by an incompatible libtorch.");
  } catch (const std::exception& e) {
    // The TorchScript importer also throws types outside c10::Error (torch::jit::ErrorReport
    // for an unknown class name in the archive; found by fuzz/envelope_fuzzer.cpp). Its
    // message starts with a newline and continues with a source excerpt: keep the first
    // non-empty line.
    std::string what = e.what();
    what.erase(0, std::min(what.size(), what.find_first_not_of(" \n")));
    VOLT_CHECK(false, CheckpointError, "[CheckpointIO] '", path,
               "' passed its CRC but libtorch cannot read it (", what.substr(0, what.find('\n')),
               "); it was probably written by an incompatible libtorch.");
  }
  return archive;
}

}  // namespace volt
