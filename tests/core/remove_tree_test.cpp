// detail::remove_tree, volt's replacement for std::filesystem::remove_all (which the torch 2.x
// wheels' libtorch.so exports in a copy that crashes): a real folder tree with files, nested
// folders and a link to a folder outside, which must survive.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "core/detail/remove_tree.h"
#include "tiny.h"

namespace {

bool exists(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

}  // namespace

TEST(RemoveTree, RemovesEverythingUnderThePathButNotWhatLinksPointTo) {
  volt_test::TempDir tmp;
  const std::string outside = tmp / "outside", root = tmp / "root";
  ASSERT_EQ(::mkdir(outside.c_str(), 0755), 0);
  std::ofstream(outside + "/keep.txt") << "keep";
  ASSERT_EQ(::mkdir(root.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((root + "/a").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((root + "/a/b").c_str(), 0755), 0);
  std::ofstream(root + "/top.txt") << "x";
  std::ofstream(root + "/a/b/deep.bin") << std::string(1 << 16, 'y');
  ASSERT_EQ(::symlink(outside.c_str(), (root + "/a/link").c_str()), 0);

  EXPECT_TRUE(volt::detail::remove_tree(root));
  EXPECT_FALSE(exists(root));
  EXPECT_TRUE(exists(outside + "/keep.txt"));    // the link was removed, not followed
  EXPECT_TRUE(volt::detail::remove_tree(root));  // nothing there: done
  EXPECT_TRUE(volt::detail::remove_tree(""));
  std::ofstream(tmp / "file") << "z";  // a plain file is removed too
  EXPECT_TRUE(volt::detail::remove_tree(tmp / "file"));
  EXPECT_FALSE(exists(tmp / "file"));
}
