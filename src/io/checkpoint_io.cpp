#include "volt/io/checkpoint_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>

#include "core/detail/atomic_file_writer.h"
#include "core/detail/temp_files.h"
#include "detail/archive_check.h"
#include "detail/checkpoint_envelope.h"
#include "detail/crc32.h"
#include "io/detail/whole_file.h"
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

// The header's first 12 bytes (magic, format version) and zeros where the payload size and CRC
// go (sealed_fields, at offset 12, once the payload is known).
std::string unsealed_header() {
  std::string h(kMagic, sizeof(kMagic));
  put_le(h, TorchCheckpointIO::kFormatVersion, 4);
  put_le(h, 0, 8);
  put_le(h, 0, 4);
  return h;
}

std::string sealed_fields(uint64_t payload_size, uint32_t crc) {
  std::string fields;
  put_le(fields, payload_size, 8);
  put_le(fields, crc, 4);
  return fields;
}

constexpr uint64_t kSealedFieldsOffset = 12;

}  // namespace

void detail::remove_file(const std::string& path) {
  VOLT_CHECK(::unlink(path.c_str()) == 0 || errno == ENOENT, CheckpointError,
             "[CheckpointIO] cannot remove '", path, "' (", std::strerror(errno),
             "); check the folder's permissions (the file stays).");
}

void CheckpointIO::remove(const std::string& path) {
  detail::remove_file(path);
}

namespace {

// `target`'s bytes into `path` by an AtomicFileWriter (a crash leaves `path` as it was).
void copy_file_atomically(const std::string& target, const std::string& path) {
  const int in = ::open(target.c_str(), O_RDONLY | O_CLOEXEC);
  VOLT_CHECK(in >= 0, CheckpointError, "[CheckpointIO] cannot read '", target, "' to copy it to '",
             path, "' (", std::strerror(errno), "); check its permissions.");
  try {
    detail::AtomicFileWriter out(path);
    std::string buffer(size_t{1} << 20, '\0');
    for (;;) {
      const ssize_t n = ::read(in, buffer.data(), buffer.size());
      if (n < 0 && errno == EINTR) continue;
      VOLT_CHECK(n >= 0, CheckpointError, "[CheckpointIO] cannot read '", target,
                 "' to copy it to '", path, "' (", std::strerror(errno), ").");
      if (n == 0) break;
      out.write(buffer.data(), static_cast<size_t>(n));
    }
    out.commit();
  } catch (...) {
    ::close(in);
    throw;
  }
  ::close(in);
}

}  // namespace

void detail::make_link(const std::string& target, const std::string& path) {
  namespace fs = std::filesystem;
  struct stat st;
  VOLT_CHECK(::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode), CheckpointError,
             "[CheckpointIO] cannot make '", path, "' a link to '", target,
             "': a folder is in the way; move it away or choose another path.");
  // Relative to the link's folder (Lightning's os.path.relpath), so the pair can move together.
  std::error_code ec;
  const fs::path link = fs::absolute(path, ec).lexically_normal();
  const fs::path to = fs::absolute(target, ec).lexically_normal();
  fs::path relative = to.lexically_relative(link.parent_path());
  if (relative.empty()) relative = to;
  const std::string tmp = detail::temp_path_for(path);
  ::unlink(tmp.c_str());  // a link a killed process of this pid left
  if (::symlink(relative.c_str(), tmp.c_str()) != 0) {
    const int error = errno;
    // A file system without symbolic links (some network and FAT mounts): a copy of a file, as
    // Lightning's _link_checkpoint falls back to shutil.copy.
    if ((error == EPERM || error == EOPNOTSUPP || error == ENOSYS) &&
        ::stat(target.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      copy_file_atomically(target, path);
      return;
    }
    VOLT_CHECK(false, CheckpointError, "[CheckpointIO] cannot make the link '", path, "' -> '",
               relative.string(), "' (", std::strerror(error), "); ",
               error == EPERM || error == EOPNOTSUPP || error == ENOSYS
                   ? "the file system does not support symbolic links, and a folder of shards "
                     "is not copied: use save_last=true."
                   : "check that its folder exists and is writable.");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    VOLT_CHECK(false, CheckpointError, "[CheckpointIO] cannot put the link '", path, "' -> '",
               relative.string(), "' in place (", std::strerror(error),
               "); check the folder's permissions (it keeps what it held).");
  }
  // Makes the rename durable, as AtomicFileWriter::commit.
  const std::string folder = link.parent_path().string();
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

void CheckpointIO::link(const std::string& target, const std::string& path) {
  detail::make_link(target, path);
}

void detail::serialize_checkpoint(torch::serialize::OutputArchive& archive, std::string& file) {
  // clear + append, never (move-)assignment, which would replace file's memory by the header's.
  file.clear();
  file.append(unsealed_header());
  archive.save_to([&file](const void* data, size_t n) {
    file.append(static_cast<const char*>(data), n);
    return n;
  });
}

void detail::seal_checkpoint(std::string& file) {
  const size_t size = file.size() - kHeaderSize;
  const std::string fields = sealed_fields(size, detail::crc32_of(file.data() + kHeaderSize, size));
  file.replace(kSealedFieldsOffset, fields.size(), fields);
}

void TorchCheckpointIO::save(torch::serialize::OutputArchive& archive, const std::string& path) {
  // Streamed: libtorch's serializer writes straight into the temporary file and the CRC is
  // computed on the way, so a save needs no buffer of the checkpoint's size (nor its page
  // faults); the same bytes as serialize_checkpoint + seal_checkpoint.
  detail::AtomicFileWriter out(path);
  const std::string header = unsealed_header();
  out.write(header.data(), header.size());
  uLong crc = crc32(0L, Z_NULL, 0);
  std::exception_ptr failure;
  const auto sink = [&](const void* data, size_t n) -> size_t {
    // A failed write is remembered and the rest of the archive is dropped, but libtorch is told
    // every byte was taken: no exception may cross its zip writer (C code), and libtorch 1.13
    // aborts the process when a short write makes its writer's destructor throw.
    if (failure) return n;
    try {
      out.write(data, n);
    } catch (...) {
      failure = std::current_exception();
      return n;
    }
    crc = detail::crc32_update(crc, static_cast<const char*>(data), n);
    return n;
  };
  archive.save_to(sink);
  // The temporary file is removed (out's destructor) and the previous file stays.
  if (failure) std::rethrow_exception(failure);
  const std::string fields = sealed_fields(out.size() - kHeaderSize, static_cast<uint32_t>(crc));
  out.overwrite(fields.data(), fields.size(), kSealedFieldsOffset);
  out.commit();
}

torch::serialize::InputArchive TorchCheckpointIO::load(const std::string& path) {
  const std::string file =
      detail::read_whole_file(path, "[CheckpointIO]", "checkpoint", "check the path (ckpt_path).");
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
  const uint32_t actual = detail::crc32_of(file.data() + kHeaderSize, size);
  VOLT_CHECK(actual == crc, CheckpointError, "[CheckpointIO] '", path,
             "' is corrupted: CRC-32 mismatch (stored ", crc, ", computed ", actual,
             "); use an intact checkpoint (e.g. an older one).");
  // libtorch's reader trusts what it reads (docs/HARDENING.md): check the archive's shape first.
  detail::check_torch_archive(file.data() + kHeaderSize, size, path);
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(file.data() + kHeaderSize, size);
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
