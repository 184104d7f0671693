#include <dirent.h>
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>
#include <sstream>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "build_paths.h"
#include "core/detail/temp_files.h"
#include "envelope.h"
#include "file_text.h"
#include "reread.h"
#include "tiny.h"

namespace {

using volt_test::file_text;

void write_file(const std::string& p, const std::string& s) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << s;
}
std::string error_of(const std::string& path) {
  try {
    volt::TorchCheckpointIO().load(path);
  } catch (const volt::CheckpointError& e) {
    return e.what();
  }
  return "<no CheckpointError>";
}

TEST(CheckpointIO, RoundTripAndNoTempFilesLeft) {
  volt_test::TempDir dir;
  torch::serialize::OutputArchive ar;
  ar.write("w", torch::arange(5, torch::kFloat));
  volt::TorchCheckpointIO io;
  io.save(ar, dir / "sub/a.ckpt");
  auto in = io.load(dir / "sub/a.ckpt");
  torch::Tensor w;
  in.read("w", w);
  EXPECT_TRUE(w.equal(torch::arange(5, torch::kFloat)));
  DIR* d = opendir((dir / "sub").c_str());
  int files = 0;
  while (dirent* e = readdir(d)) files += e->d_name[0] != '.';
  closedir(d);
  EXPECT_EQ(files, 1);  // only a.ckpt: the temporary was renamed
}

TEST(CheckpointIO, AStreamedSaveIsTheEnvelopeOfLibtorchsArchive) {
  // TorchCheckpointIO streams the archive into the file; its bytes are the documented envelope
  // (magic, version, payload size, CRC-32 of the payload) around what libtorch's own save_to
  // writes, and they do not depend on how big the pieces are.
  volt_test::TempDir dir;
  torch::serialize::OutputArchive ar;
  ar.write("big", torch::randn({3 << 20}));  // above the 1 MiB gathering threshold
  for (int i = 0; i < 50; ++i) ar.write("small" + std::to_string(i), torch::randn({i + 1}));
  volt::TorchCheckpointIO().save(ar, dir / "a.ckpt");
  std::string payload;
  ar.save_to([&](const void* d, size_t n) {
    payload.append(static_cast<const char*>(d), n);
    return n;
  });
  const std::string file = file_text(dir / "a.ckpt");
  ASSERT_EQ(file.size(), 24 + payload.size());
  EXPECT_EQ(file.substr(0, 8), "VOLTCKPT");
  EXPECT_TRUE(file.compare(24, std::string::npos, payload) == 0);
  uint64_t size = 0;
  uint32_t crc = 0;
  for (int b = 0; b < 8; ++b) size |= uint64_t(static_cast<unsigned char>(file[12 + b])) << (8 * b);
  for (int b = 0; b < 4; ++b) crc |= uint32_t(static_cast<unsigned char>(file[20 + b])) << (8 * b);
  EXPECT_EQ(size, payload.size());
  EXPECT_EQ(crc, crc32(0, reinterpret_cast<const Bytef*>(payload.data()),
                       static_cast<uInt>(payload.size())));
}

TEST(CheckpointIO, ASaveThatFailsMidStreamKeepsThePreviousFile) {
  // The file-size limit makes the disk "full" after 1 MiB: the streamed write fails part way
  // through libtorch's serializer. The error says why, the previous checkpoint is intact and
  // no temporary file is left.
  volt_test::TempDir dir;
  torch::serialize::OutputArchive old_ar;
  old_ar.write("w", torch::ones({1000}));
  volt::TorchCheckpointIO io;
  io.save(old_ar, dir / "a.ckpt");
  torch::serialize::OutputArchive big;
  big.write("w", torch::randn({4 << 20}));  // 16 MiB
  struct rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of a signal
  struct rlimit small = saved;
  small.rlim_cur = 1 << 20;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string what;
  try {
    io.save(big, dir / "a.ckpt");
  } catch (const volt::CheckpointError& e) {
    what = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_NE(what.find("[CheckpointIO] writing '"), std::string::npos) << what;
  EXPECT_NE(what.find("File too large"), std::string::npos) << what;
  EXPECT_NE(what.find("The previous '" + dir / "a.ckpt" + "' is untouched"), std::string::npos)
      << what;
  auto in = io.load(dir / "a.ckpt");
  torch::Tensor w;
  in.read("w", w);
  EXPECT_TRUE(w.equal(torch::ones({1000})));
  int entries = 0;
  DIR* d = ::opendir(dir.path.c_str());
  while (dirent* e = ::readdir(d)) entries += e->d_name[0] != '.';
  ::closedir(d);
  EXPECT_EQ(entries, 1);  // a.ckpt only
}

TEST(CheckpointIO, DetectsTruncationCorruptionAndForeignFiles) {
  volt_test::TempDir dir;
  torch::serialize::OutputArchive ar;
  ar.write("w", torch::randn({64}));
  volt::TorchCheckpointIO().save(ar, dir / "good.ckpt");
  const std::string good = file_text(dir / "good.ckpt");

  write_file(dir / "trunc.ckpt", good.substr(0, good.size() - 100));
  EXPECT_NE(error_of(dir / "trunc.ckpt").find("truncated"), std::string::npos);

  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x40;
  write_file(dir / "flip.ckpt", flipped);
  EXPECT_NE(error_of(dir / "flip.ckpt").find("CRC-32 mismatch"), std::string::npos);

  write_file(dir / "foreign.ckpt", "PK\x03\x04 this is a zip");
  EXPECT_NE(error_of(dir / "foreign.ckpt").find("not a volt checkpoint"), std::string::npos);

  EXPECT_NE(error_of(dir / "missing.ckpt").find("cannot open"), std::string::npos);
  EXPECT_NE(error_of(dir.path).find("cannot read checkpoint '" + dir.path + "' (Is a directory)"),
            std::string::npos)
      << error_of(dir.path);
}

using volt_test::envelope_around;

TEST(CheckpointIO, ArchiveLibtorchRefusesWithANonC10ErrorIsACheckpointError) {
  // Found by fuzz/envelope_fuzzer.cpp: a TorchScript archive naming a class its code section
  // lacks (its code record's name is mangled) made libtorch throw torch::jit::ErrorReport, which
  // is no c10::Error and escaped. Since session 24 volt's own archive check refuses it first
  // (tests/io/archive_check_test.cpp); parse_checkpoint still turns any libtorch error into a
  // CheckpointError.
  volt_test::TempDir dir;
  const std::string payload =
      file_text(volt_test::source_dir() + "/tests/io/data/ckpt_payload_unknown_type.bin");
  ASSERT_FALSE(payload.empty());
  write_file(dir / "odd.ckpt", envelope_around(payload));
  const std::string m = error_of(dir / "odd.ckpt");
  EXPECT_NE(m.find("passed its CRC but is not an archive torch::serialize writes (a record name "
                   "that is empty, too long or not printable)"),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;  // one line

  write_file(dir / "empty.ckpt", envelope_around(""));
  EXPECT_NE(error_of(dir / "empty.ckpt").find("no ZIP end-of-directory record"), std::string::npos);
}

TEST(ModuleState, MismatchListsNamesAndShapes) {
  volt_test::TinyClassifier a(8), b(5);
  torch::serialize::OutputArchive out;
  volt::save_module_state(a, out);
  volt_test::TempDir dir;
  volt::TorchCheckpointIO().save(out, dir / "a.ckpt");
  auto in = volt::TorchCheckpointIO().load(dir / "a.ckpt");
  try {
    volt::load_module_state(b, in);
    FAIL();
  } catch (const volt::CheckpointError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("fc1.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("[16, 8]"), std::string::npos) << m;
    EXPECT_NE(m.find("[16, 5]"), std::string::npos) << m;
    EXPECT_EQ(m.find("fc2.weight"), std::string::npos) << m;  // matching entries are not listed
  }
}

// Adam state saved by parameter name continues exactly like the uninterrupted optimizer.
TEST(OptimizerState, ByNameRoundTripContinuesBitExactly) {
  torch::manual_seed(0);
  volt_test::TinyClassifier a(8), b(8);
  {
    torch::NoGradGuard g;
    for (size_t i = 0; i < a.parameters().size(); ++i) b.parameters()[i].copy_(a.parameters()[i]);
  }
  torch::optim::Adam oa(a.parameters(), torch::optim::AdamOptions(0.01));
  auto x = torch::randn({16, 8});
  auto y = torch::randint(0, 2, {16});
  auto step = [&](volt_test::TinyClassifier& m, torch::optim::Optimizer& o) {
    volt::zero_grad(o);
    m.eval();
    torch::cross_entropy_loss(m.forward(x), y).backward();
    o.step();
  };
  for (int i = 0; i < 3; ++i) step(a, oa);
  torch::serialize::OutputArchive out, model_out;
  volt::save_module_state(a, model_out);
  out.write("model", model_out);
  torch::serialize::OutputArchive opt_out;
  volt::save_optimizer_state(oa, a, opt_out);
  out.write("opt", opt_out);
  volt_test::TempDir dir;
  volt::TorchCheckpointIO().save(out, dir / "s.ckpt");

  auto in = volt::TorchCheckpointIO().load(dir / "s.ckpt");
  torch::optim::Adam ob(b.parameters(), torch::optim::AdamOptions(0.5));  // lr restored from file
  torch::serialize::InputArchive model_in;
  in.read("model", model_in);
  volt::load_module_state(b, model_in);
  torch::serialize::InputArchive opt_in;
  in.read("opt", opt_in);
  volt::load_optimizer_state(ob, b, opt_in);
  EXPECT_DOUBLE_EQ(ob.param_groups()[0].options().get_lr(), 0.01);
  for (int i = 0; i < 3; ++i) {
    step(a, oa);
    step(b, ob);
  }
  EXPECT_TRUE(a.flat_params().equal(b.flat_params()));
}

// As torch's load_state_dict, a loaded state replaces the optimizer's: a state saved before the
// first step leaves none behind (before session 81 the stepped Adam kept its moments and step
// counts), and a state that does not fit changes nothing (the lr was overwritten before the
// parameter count was checked).
TEST(OptimizerState, LoadingReplacesTheStateAndAMismatchChangesNothing) {
  torch::manual_seed(0);
  volt_test::TinyClassifier m(8);
  torch::optim::Adam fresh(m.parameters(), torch::optim::AdamOptions(0.01));
  torch::serialize::OutputArchive fresh_out;
  volt::save_optimizer_state(fresh, m, fresh_out);
  std::stringstream fresh_bytes;
  fresh_out.save_to(fresh_bytes);

  torch::optim::Adam stepped(m.parameters(), torch::optim::AdamOptions(0.5));
  for (int i = 0; i < 3; ++i) {
    volt::zero_grad(stepped);
    m.forward(torch::randn({4, 8})).sum().backward();
    stepped.step();
  }
  ASSERT_FALSE(stepped.state().empty());
  // A checkpoint of one parameter fewer: refused, and the lr and state stay.
  {
    const std::vector<at::Tensor> params = m.parameters();
    torch::optim::Adam fewer(std::vector<at::Tensor>(params.begin() + 1, params.end()),
                             torch::optim::AdamOptions(0.01));
    torch::serialize::OutputArchive out;
    volt::save_optimizer_state(fewer, m, out);
    auto in = volt_test::reread(out);
    const size_t states = stepped.state().size();
    EXPECT_THROW(volt::load_optimizer_state(stepped, m, in), volt::CheckpointError);
    EXPECT_DOUBLE_EQ(stepped.param_groups()[0].options().get_lr(), 0.5);
    EXPECT_EQ(stepped.state().size(), states);
  }
  torch::serialize::InputArchive in;
  in.load_from(fresh_bytes);
  volt::load_optimizer_state(stepped, m, in);
  EXPECT_DOUBLE_EQ(stepped.param_groups()[0].options().get_lr(), 0.01);
  EXPECT_TRUE(stepped.state().empty());
}

/// A writer in another process, stopped mid-write: the child creates and locks the temp file of
/// `path` exactly as atomic_write_file does, writes a little, tells the parent through a pipe and
/// waits to be killed.
struct ChildWriter {
  pid_t pid = -1;
  std::string temp;
};

ChildWriter start_child_writer(const std::string& path) {
  int ready[2];
  EXPECT_EQ(::pipe(ready), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(ready[0]);
    const int fd = volt::detail::create_locked_temp(volt::detail::temp_path_for(path));
    const char partial[] = "VOLTCKPT partial";
    const bool ok = ::write(fd, partial, sizeof partial) == static_cast<ssize_t>(sizeof partial);
    const char c = ok ? 'r' : 'x';
    if (::write(ready[1], &c, 1) != 1) ::_exit(1);
    for (;;) ::pause();  // until SIGKILL
  }
  ::close(ready[1]);
  char c = 0;
  EXPECT_EQ(::read(ready[0], &c, 1), 1);  // blocks until the child holds its temp file
  EXPECT_EQ(c, 'r');
  ::close(ready[0]);
  return {pid, path + ".volt-tmp." + std::to_string(pid)};
}

void kill_child(const ChildWriter& w) {
  ASSERT_EQ(::kill(w.pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(w.pid, &status, 0), w.pid);
  ASSERT_TRUE(WIFSIGNALED(status));
}

bool exists(const std::string& p) {
  return ::access(p.c_str(), F_OK) == 0;
}

TEST(CheckpointIO, WritesRemoveTempFilesOfDeadWritersButNotOfLiveOnes) {
  volt_test::TempDir dir;
  const ChildWriter live = start_child_writer(dir / "model.ckpt");
  ASSERT_TRUE(exists(live.temp));
  // Debris of writers that died before: unlocked temp files, one named with this very process's
  // pid (a liveness check by pid would keep it), and files that only look similar.
  const std::string stale = dir / "epoch=3.ckpt.volt-tmp.4194000";
  const std::string own_pid = dir / ("last.ckpt.volt-tmp." + std::to_string(::getpid()));
  for (const auto& p : {stale, own_pid}) write_file(p, std::string(1000, 'x'));
  // Another program's temporary file ("<name>.tmp.<digits>" was volt's own pattern before
  // session 81, and every write in the folder deleted such files) stays.
  const std::vector<std::string> kept = {dir / "notes.tmp",          dir / "a.ckpt.volt-tmp.12x",
                                         dir / ".volt-tmp.123",      dir / "a.ckpt.volt-tmp.",
                                         dir / "other.out.tmp.4242", dir / "x.tmp.7"};
  for (const auto& p : kept) write_file(p, "keep");

  volt::atomic_write_file(dir / "config.yaml", "a: 1\n");
  EXPECT_FALSE(exists(stale));
  EXPECT_FALSE(exists(own_pid));
  for (const auto& p : kept) EXPECT_TRUE(exists(p)) << p;
  // The live writer's file is untouched, with what it wrote so far.
  EXPECT_TRUE(exists(live.temp));
  EXPECT_EQ(file_text(live.temp), std::string("VOLTCKPT partial", 17));

  // Killed mid-write: the next checkpoint written in the folder removes its temp file.
  kill_child(live);
  ASSERT_TRUE(exists(live.temp));
  torch::serialize::OutputArchive ar;
  ar.write("w", torch::ones({3}));
  volt::TorchCheckpointIO().save(ar, dir / "model.ckpt");
  EXPECT_FALSE(exists(live.temp));
  EXPECT_TRUE(exists(dir / "model.ckpt"));
  EXPECT_EQ(file_text(dir / "config.yaml"), "a: 1\n");
}

TEST(CheckpointIO, TwoThreadsWritingOnePathTakeTurnsAndReadersSeeOnlyWholeFiles) {
  // Both writers name their temp file "<path>.volt-tmp.<pid>": the second waits on the first's lock
  // (and starts over once the name is renamed away), so neither writes into the other's file.
  volt_test::TempDir dir;
  const std::string path = dir / "shared.bin";
  const size_t kBytes = 1 << 20;
  volt::atomic_write_file(path, std::string(kBytes, 'a'));
  std::atomic<bool> done{false};
  std::atomic<int> torn{0}, reads{0};
  std::thread reader([&] {
    while (!done.load()) {
      const std::string got = file_text(path);
      ++reads;
      const bool whole = got.size() == kBytes &&
                         got.find_first_not_of(got.empty() ? 'a' : got[0]) == std::string::npos;
      if (!whole) ++torn;
    }
  });
  auto writer = [&](char c) {
    for (int i = 0; i < 20; ++i) volt::atomic_write_file(path, std::string(kBytes, c));
  };
  std::thread w1(writer, 'b'), w2(writer, 'c');
  w1.join();
  w2.join();
  done = true;
  reader.join();
  EXPECT_EQ(torn.load(), 0) << "of " << reads.load() << " reads";
  EXPECT_GT(reads.load(), 0);
  const std::string last = file_text(path);
  EXPECT_TRUE(last == std::string(kBytes, 'b') || last == std::string(kBytes, 'c'));
  // No temp file is left behind.
  DIR* d = ::opendir(dir.path.c_str());
  ASSERT_NE(d, nullptr);
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  }
  ::closedir(d);
  EXPECT_EQ(names, std::vector<std::string>{"shared.bin"});
}

TEST(CheckpointIO, TempFileNames) {
  EXPECT_TRUE(volt::detail::is_temp_name("last.ckpt.volt-tmp.123"));
  EXPECT_TRUE(volt::detail::is_temp_name("a.volt-tmp.b.volt-tmp.7"));
  EXPECT_FALSE(volt::detail::is_temp_name("last.ckpt.volt-tmp."));
  EXPECT_FALSE(volt::detail::is_temp_name(".volt-tmp.5"));
  EXPECT_FALSE(volt::detail::is_temp_name("last.ckpt.volt-tmp.1a"));
  EXPECT_FALSE(volt::detail::is_temp_name("last.ckpt.tmp.123"));  // not volt's
  EXPECT_FALSE(volt::detail::is_temp_name("last.ckpt"));
  EXPECT_EQ(volt::detail::temp_path_for("/x/a.ckpt"),
            "/x/a.ckpt.volt-tmp." + std::to_string(::getpid()));
  // A name near the 255-byte limit: the temporary keeps as much of it as fits, never splitting
  // a UTF-8 character (it failed with ENAMETOOLONG for a valid checkpoint name).
  const std::string suffix = ".volt-tmp." + std::to_string(::getpid());
  const std::string long_name = std::string(240, 'a') + "\xc3\xa9" + std::string(9, 'b');
  const std::string tmp = volt::detail::temp_path_for("/x/" + long_name);
  EXPECT_LE(tmp.size() - 3, 255u);
  EXPECT_EQ(tmp.rfind("/x/" + std::string(240, 'a'), 0), 0u) << tmp;
  EXPECT_EQ(tmp.substr(tmp.size() - suffix.size()), suffix);
  EXPECT_TRUE(volt::detail::is_temp_name(tmp.substr(3)));
  const unsigned char last = static_cast<unsigned char>(tmp[tmp.size() - suffix.size() - 1]);
  EXPECT_NE(last, 0xc3) << "a split character";
}

// A checkpoint whose name is near the file system's limit is written and read (its temporary
// name did not fit: "cannot create ... (File name too long)").
TEST(CheckpointIO, ANameNearTheLengthLimitIsWritten) {
  volt_test::TempDir dir;
  torch::serialize::OutputArchive ar;
  ar.write("w", torch::arange(3, torch::kFloat));
  const std::string path = dir / (std::string(245, 'c') + ".ckpt");
  volt::TorchCheckpointIO().save(ar, path);
  torch::Tensor w;
  volt::TorchCheckpointIO().load(path).read("w", w);
  EXPECT_TRUE(w.equal(torch::arange(3, torch::kFloat)));
}

// A symbolic link planted at the name of a write's temporary file (the pid is predictable) is
// not followed: before session 81 its target was truncated and overwritten, and the rename left
// the checkpoint a link to it.
TEST(CheckpointIO, ALinkAtTheTemporaryNameIsNotFollowed) {
  volt_test::TempDir dir;
  const std::string target = dir / "precious.txt";
  write_file(target, "keep me");
  const std::string path = dir / "model.ckpt";
  ASSERT_EQ(::symlink(target.c_str(), volt::detail::temp_path_for(path).c_str()), 0);
  volt::atomic_write_file(path, "new contents");
  EXPECT_EQ(file_text(target), "keep me");
  EXPECT_EQ(file_text(path), "new contents");
  struct stat st;
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

}  // namespace

namespace {

torch::Tensor saved_value(const std::string& path) {
  torch::Tensor w;
  volt::TorchCheckpointIO().load(path).read("w", w);
  return w;
}

void save_value(const std::string& path, float v) {
  torch::serialize::OutputArchive ar;
  ar.write("w", torch::full({4}, v));
  volt::TorchCheckpointIO().save(ar, path);
}

}  // namespace

// ModelCheckpoint's save_last="link": a relative link (the folder can move) that replaces a
// file or an older link at once, and refuses a folder in the way.
TEST(CheckpointIO, LinkMakesARelativeLinkThatReplacesAFileOrALink) {
  namespace fs = std::filesystem;
  volt_test::TempDir dir;
  fs::create_directories(dir / "c");
  fs::create_directories(dir / "other");
  save_value(dir / "c/a.ckpt", 1);
  save_value(dir / "other/b.ckpt", 2);
  save_value(dir / "c/last.ckpt", 9);  // a file of its own before
  volt::TorchCheckpointIO io;
  io.link(dir / "c/a.ckpt", dir / "c/last.ckpt");
  ASSERT_TRUE(fs::is_symlink(dir / "c/last.ckpt"));
  EXPECT_EQ(fs::read_symlink(dir / "c/last.ckpt"), fs::path("a.ckpt"));
  EXPECT_EQ(saved_value(dir / "c/last.ckpt")[0].item<float>(), 1.0f);
  io.link(dir / "other/b.ckpt", dir / "c/last.ckpt");  // over the older link
  EXPECT_EQ(fs::read_symlink(dir / "c/last.ckpt"), fs::path("../other/b.ckpt"));
  EXPECT_EQ(saved_value(dir / "c/last.ckpt")[0].item<float>(), 2.0f);
  io.link(dir / "c/a.ckpt", dir / "c/last.ckpt");
  // Only the link and the two files: no temporary name left behind.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir / "c")) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"a.ckpt", "last.ckpt"}));
  // The folder moves with its link.
  fs::rename(dir / "c", dir / "moved");
  EXPECT_EQ(saved_value(dir / "moved/last.ckpt")[0].item<float>(), 1.0f);
  // A folder in the way, or a path that cannot hold a link, is a CheckpointError and changes
  // nothing.
  fs::create_directories(dir / "moved/folder.ckpt");
  try {
    io.link(dir / "moved/a.ckpt", dir / "moved/folder.ckpt");
    ADD_FAILURE() << "no CheckpointError";
  } catch (const volt::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("a folder is in the way"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_directory(dir / "moved/folder.ckpt"));
  write_file(dir / "blocker", "a file, not a folder");
  EXPECT_THROW(io.link(dir / "moved/a.ckpt", dir / "blocker/last.ckpt"), volt::CheckpointError);
}

namespace {

// Runs `fn` on a thread of its own on which the kernel refuses symlink(2) and symlinkat(2) with
// EPERM, as a file system without symbolic links does (a seccomp filter: it binds that thread
// alone, and ends with it). Returns what `fn` threw ("" when nothing).
std::string without_symlinks(const std::function<void()>& fn) {
  std::string error = "<filter not installed>";
  std::thread t([&] {
    std::vector<sock_filter> prog = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr))};
#ifdef __NR_symlink  // x86_64 has both calls; aarch64 symlinkat only
    prog.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_symlink, 2, 0));
#endif
    prog.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_symlinkat, 1, 0));
    prog.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    prog.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)));
    sock_fprog program{static_cast<unsigned short>(prog.size()), prog.data()};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
      return;
    }
    error = "";
    try {
      fn();
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  t.join();
  return error;
}

}  // namespace

// A file system without symbolic links: save_last="link" copies the file instead, atomically, as
// Lightning's _link_checkpoint falls back to shutil.copy (it was a CheckpointError telling the
// user to set save_last=true). A folder of shards is not copied: the error says so.
TEST(CheckpointIO, LinkCopiesTheFileWhereTheFileSystemHasNoLinks) {
  namespace fs = std::filesystem;
  volt_test::TempDir dir;
  save_value(dir / "a.ckpt", 3);
  save_value(dir / "last.ckpt", 9);
  // The filter works: a plain symlink on that thread fails with EPERM.
  int err = 0;
  const std::string installed = without_symlinks([&] {
    if (::symlink("a.ckpt", (dir / "probe").c_str()) != 0) err = errno;
  });
  if (installed == "<filter not installed>") {
    GTEST_SKIP() << "this kernel or sandbox refuses seccomp filters";
  }
  ASSERT_EQ(installed, "");
  ASSERT_EQ(err, EPERM);
  volt::TorchCheckpointIO io;
  EXPECT_EQ(without_symlinks([&] { io.link(dir / "a.ckpt", dir / "last.ckpt"); }), "");
  EXPECT_FALSE(fs::is_symlink(dir / "last.ckpt"));
  EXPECT_EQ(file_text(dir / "last.ckpt"), file_text(dir / "a.ckpt"));
  EXPECT_EQ(saved_value(dir / "last.ckpt")[0].item<float>(), 3.0f);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"a.ckpt", "last.ckpt"}));  // no temporary file
  fs::create_directories(dir / "shards.ckpt");
  const std::string folder =
      without_symlinks([&] { io.link(dir / "shards.ckpt", dir / "last.ckpt"); });
  EXPECT_NE(folder.find("does not support symbolic links, and a folder of shards is not copied: "
                        "use save_last=true"),
            std::string::npos)
      << folder;
  EXPECT_EQ(saved_value(dir / "last.ckpt")[0].item<float>(), 3.0f);  // as it was
}
