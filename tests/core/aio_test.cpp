// AioFile (src/core/detail/aio.h): io_uring reads and writes of byte ranges at file offsets agree
// with the pread/pwrite reference path byte for byte, across block sizes and queue depths; bad
// paths and short files are typed errors.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>

#include "core/detail/aio.h"
#include "file_text.h"
#include "tiny.h"

namespace {

using volt::detail::AioFile;
using volt::detail::AioOptions;

at::Tensor random_bytes(int64_t n, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randint(0, 256, {n}, gen, at::TensorOptions().dtype(at::kByte));
}

TEST(Aio, UringWritesAndReadsMatchThePreadPwriteReference) {
  volt_test::TempDir dir;
  // Ranges that are not multiples of the block size, at unaligned offsets, more requests than
  // the queue holds.
  const std::vector<std::pair<int64_t, int64_t>> ranges{
      {0, 5000}, {5000, 12345}, {20000, 1}, {17345, 2655}, {40961, 70000}};
  for (const auto& opts : {AioOptions().block_size(4096).queue_depth(2),
                           AioOptions().block_size(1 << 20).queue_depth(8),
                           AioOptions().block_size(333).queue_depth(64)}) {
    std::vector<at::Tensor> data;
    for (size_t i = 0; i < ranges.size(); ++i) data.push_back(random_bytes(ranges[i].second, i));
    {
      AioFile uring(dir / "u.swp", opts, true);
      AioFile posix(dir / "p.swp", AioOptions(opts).use_uring(false), true);
      for (size_t i = 0; i < ranges.size(); ++i) {
        uring.submit_write(data[i].data_ptr(), ranges[i].second, ranges[i].first);
        posix.submit_write(data[i].data_ptr(), ranges[i].second, ranges[i].first);
      }
      EXPECT_LE(uring.in_flight(), opts.queue_depth());
      uring.wait();
      posix.wait();
    }
    // The two files are identical, and each path reads back what the other wrote.
    const std::string ub = volt_test::file_text(dir / "u.swp");
    const std::string pb = volt_test::file_text(dir / "p.swp");
    ASSERT_EQ(ub.size(), pb.size());
    EXPECT_TRUE(ub == pb);
    AioFile uring(dir / "p.swp", opts, false);
    AioFile posix(dir / "u.swp", AioOptions(opts).use_uring(false), false);
    for (size_t i = 0; i < ranges.size(); ++i) {
      at::Tensor a = at::empty({ranges[i].second}, at::kByte), b = at::empty_like(a);
      uring.submit_read(a.data_ptr(), ranges[i].second, ranges[i].first);
      posix.submit_read(b.data_ptr(), ranges[i].second, ranges[i].first);
      uring.wait();
      posix.wait();
      EXPECT_TRUE(torch::equal(a, data[i])) << "range " << i;
      EXPECT_TRUE(torch::equal(b, data[i])) << "range " << i;
    }
  }
}

TEST(Aio, ABadPathIsAConfigErrorNamingIt) {
  for (bool uring : {true, false}) {
    try {
      AioFile f("/nonexistent_volt_dir/x.swp", AioOptions().use_uring(uring), true);
      FAIL() << "opened a file in a missing folder";
    } catch (const volt::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("cannot open '/nonexistent_volt_dir/x.swp'"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("nvme_path"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(AioFile("/tmp/x", AioOptions().queue_depth(0), true), volt::ConfigError);
  EXPECT_THROW(AioFile("/tmp/x", AioOptions().block_size(0), true), volt::ConfigError);
}

TEST(Aio, AShortFileIsADataErrorAtWait) {
  volt_test::TempDir dir;
  std::ofstream(dir / "short.swp") << std::string(100, 'x');
  for (bool uring : {true, false}) {
    AioFile f(dir / "short.swp", AioOptions().use_uring(uring).block_size(64), false);
    std::vector<char> buf(200);
    f.submit_read(buf.data(), 200, 0);
    try {
      f.wait();
      FAIL() << "a read past the end succeeded";
    } catch (const volt::DataError& e) {
      EXPECT_NE(std::string(e.what()).find("the file ends first"), std::string::npos) << e.what();
    }
    // The queue is usable again after the error.
    f.submit_read(buf.data(), 100, 0);
    EXPECT_NO_THROW(f.wait());
    EXPECT_EQ(buf[99], 'x');
  }
}

// A submission the kernel refuses (io_uring_enter's EAGAIN, injected) is a DataError, and the
// refused request is withdrawn: wait() returns once the ones before it are done, where it waited
// forever for a request still sitting in the submission queue, and the buffer is never touched.
TEST(Aio, ARefusedSubmissionIsADataErrorAndWaitStillReturns) {
  volt_test::TempDir dir;
  ::setenv("VOLT_TEST_AIO_SUBMIT_FAILS", "3", 1);
  AioFile f(dir / "f.swp", AioOptions().block_size(4096).queue_depth(4), true);
  ::unsetenv("VOLT_TEST_AIO_SUBMIT_FAILS");
  const at::Tensor data = random_bytes(4 * 4096, 1);
  try {
    f.submit_write(data.data_ptr(), 4 * 4096, 0);
    FAIL() << "the injected refusal did not surface";
  } catch (const volt::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("submitting I/O on"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("withdrawn"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(f.wait());
  EXPECT_EQ(f.in_flight(), 0);
  // The two blocks before the refusal were written; the third never was.
  const std::string bytes = volt_test::file_text(dir / "f.swp");
  ASSERT_EQ(bytes.size(), 2u * 4096);
  EXPECT_EQ(std::memcmp(bytes.data(), data.data_ptr(), bytes.size()), 0);
  // The file goes on working: the whole range again, read back.
  f.submit_write(data.data_ptr(), 4 * 4096, 0);
  f.wait();
  at::Tensor back = at::empty_like(data);
  f.submit_read(back.data_ptr(), 4 * 4096, 0);
  f.wait();
  EXPECT_TRUE(torch::equal(back, data));
}

}  // namespace
