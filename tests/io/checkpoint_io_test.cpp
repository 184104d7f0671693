#include <gtest/gtest.h>
#include <dirent.h>

#include <fstream>

#include "tiny.h"

namespace {

std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}
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

TEST(CheckpointIO, DetectsTruncationCorruptionAndForeignFiles) {
  volt_test::TempDir dir;
  torch::serialize::OutputArchive ar;
  ar.write("w", torch::randn({64}));
  volt::TorchCheckpointIO().save(ar, dir / "good.ckpt");
  const std::string good = read_file(dir / "good.ckpt");

  write_file(dir / "trunc.ckpt", good.substr(0, good.size() - 100));
  EXPECT_NE(error_of(dir / "trunc.ckpt").find("truncated"), std::string::npos);

  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x40;
  write_file(dir / "flip.ckpt", flipped);
  EXPECT_NE(error_of(dir / "flip.ckpt").find("CRC-32 mismatch"), std::string::npos);

  write_file(dir / "foreign.ckpt", "PK\x03\x04 this is a zip");
  EXPECT_NE(error_of(dir / "foreign.ckpt").find("not a volt checkpoint"), std::string::npos);

  EXPECT_NE(error_of(dir / "missing.ckpt").find("cannot open"), std::string::npos);
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

}  // namespace
