// Bad checkpoints give one clear error line naming file, tensor and expectation, and a non-zero
// exit (through `dsv4 inspect`, the real loader).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint/safetensors.h"
#include "test_util.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& p) { return test::read_text(p); }
void spit(const std::string& p, const std::string& s) { test::write_text(p, s); }

using Result = test::CommandResult;
Result dsv4(const std::string& args) { return test::run_dsv4(args); }

class BadCheckpoint : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    base_ = test::fresh_dir("checkpoint_errors_base") + "/model";
    Result r = dsv4("make-tiny --no-tokenizer --out " + base_ + " --set vocab_size=512 --set num_hidden_layers=3 --seed 5");
    ASSERT_EQ(r.rc, 0) << r.out;
  }
  void SetUp() override {
    dir_ = test::fresh_dir(std::string("checkpoint_errors_") + ::testing::UnitTest::GetInstance()->current_test_info()->name()) +
           "/model";
    fs::copy(base_, dir_);
  }
  std::string shard(int i) const { return dir_ + "/model-0000" + std::to_string(i) + "-of-00002.safetensors"; }
  // Rewrites shard 1 with `edit` applied to its tensor list.
  template <typename F>
  void rewrite_shard1(F edit) {
    std::vector<TensorOut> ts;
    {
      SafetensorsFile f(shard(1));
      for (auto& [name, t] : f.tensors()) ts.push_back(make_tensor_out(name, t.dtype, t.shape, t.data));
    }
    edit(ts);
    write_safetensors(shard(1), ts);
  }
  Result inspect() { return dsv4("inspect --model " + dir_); }
  static void expect_error(const Result& r, std::initializer_list<const char*> parts) {
    EXPECT_NE(r.rc, 0) << r.out;
    EXPECT_EQ(r.out.rfind("error: ", 0), 0u) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one line: " << r.out;
    for (auto* p : parts) EXPECT_NE(r.out.find(p), std::string::npos) << "missing '" << p << "' in: " << r.out;
  }
  static std::string base_;
  std::string dir_;
};
std::string BadCheckpoint::base_;

TEST_F(BadCheckpoint, GoodOneLoads) {
  Result r = inspect();
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("mxfp4"), std::string::npos) << r.out;
}

TEST_F(BadCheckpoint, TruncatedFile) {
  std::string s = slurp(shard(2));
  spit(shard(2), s.substr(0, s.size() / 2));
  expect_error(inspect(), {"model-00002-of-00002.safetensors", "out of range"});
  spit(shard(2), s.substr(0, 5));
  expect_error(inspect(), {"model-00002-of-00002.safetensors", "truncated"});
}

TEST_F(BadCheckpoint, HeaderLengthBeyondFile) {
  std::string s = slurp(shard(1));
  uint64_t huge = uint64_t(s.size()) * 4;
  std::memcpy(s.data(), &huge, 8);
  spit(shard(1), s);
  expect_error(inspect(), {"model-00001-of-00002.safetensors", "header length"});
}

TEST_F(BadCheckpoint, InvalidJsonHeader) {
  std::string s = slurp(shard(1));
  s[8] = '[';
  s[9] = '}';
  spit(shard(1), s);
  expect_error(inspect(), {"model-00001-of-00002.safetensors", "invalid JSON"});
}

TEST_F(BadCheckpoint, OffsetsOutOfRange) {
  std::string s = slurp(shard(1));
  uint64_t n;
  std::memcpy(&n, s.data(), 8);
  std::string header = s.substr(8, n);
  size_t at = header.find("\"data_offsets\":[0,");
  ASSERT_NE(at, std::string::npos);
  header.replace(at, 18, "\"data_offsets\":[9,");  // same length; begin shifted: size mismatch
  spit(shard(1), s.substr(0, 8) + header + s.substr(8 + n));
  expect_error(inspect(), {"model-00001-of-00002.safetensors", "needs"});
  fs::copy_file(base_ + "/model-00001-of-00002.safetensors", shard(1), fs::copy_options::overwrite_existing);
  // An end offset far beyond the data section.
  s = slurp(shard(2));
  std::memcpy(&n, s.data(), 8);
  header = s.substr(8, n);
  size_t key = header.rfind("\"data_offsets\":[");
  ASSERT_NE(key, std::string::npos);
  size_t comma = header.find(',', key);
  at = header.find(']', comma);
  std::string big = "99999999999";
  std::string end_num = header.substr(comma + 1, at - comma - 1);
  ASSERT_LE(end_num.size(), big.size());
  header.replace(comma + 1, end_num.size(), big.substr(0, end_num.size()));
  spit(shard(2), s.substr(0, 8) + header + s.substr(8 + n));
  expect_error(inspect(), {"model-00002-of-00002.safetensors", "out of range"});
}

TEST_F(BadCheckpoint, WrongDtype) {
  rewrite_shard1([](std::vector<TensorOut>& ts) {
    for (auto& t : ts)
      if (t.name == "layers.1.attn.attn_sink") {
        t.dtype = DType::I32;
      }
  });
  expect_error(inspect(), {"layers.1.attn.attn_sink", "F32 expected", "I32 found", "model-00001-of-00002.safetensors"});
}

TEST_F(BadCheckpoint, WrongShape) {
  rewrite_shard1([](std::vector<TensorOut>& ts) {
    for (auto& t : ts)
      if (t.name == "layers.0.attn.kv_norm.weight") {
        t.shape = {256};
        t.bytes.resize(512);
      }
  });
  expect_error(inspect(), {"layers.0.attn.kv_norm.weight", "shape [512] expected", "[256] found"});
}

TEST_F(BadCheckpoint, MissingTensor) {
  rewrite_shard1([](std::vector<TensorOut>& ts) {
    std::erase_if(ts, [](const TensorOut& t) { return t.name == "layers.2.attn.wq_b.scale"; });
  });
  // The index still lists it: the loader names the shard and the tensor.
  expect_error(inspect(), {"layers.2.attn.wq_b.scale", "missing"});
  fs::remove(dir_ + "/model.safetensors.index.json");
  expect_error(inspect(), {"layers.2.attn.wq_b.scale", "missing"});
}

TEST_F(BadCheckpoint, ConfigFieldOfWrongType) {
  std::string cfg = slurp(dir_ + "/config.json");
  size_t at = cfg.find("\"hidden_size\": 128");
  ASSERT_NE(at, std::string::npos);
  cfg.replace(at, 18, "\"hidden_size\": \"128\"");
  spit(dir_ + "/config.json", cfg);
  expect_error(inspect(), {"config.json", "hidden_size", "integer", "string"});
}

TEST_F(BadCheckpoint, ConfigFieldMissing) {
  std::string cfg = slurp(dir_ + "/config.json");
  size_t at = cfg.find("\"q_lora_rank\": 128,");
  ASSERT_NE(at, std::string::npos);
  cfg.erase(at, 19);
  spit(dir_ + "/config.json", cfg);
  expect_error(inspect(), {"config.json", "q_lora_rank", "missing"});
}

TEST_F(BadCheckpoint, NotACheckpoint) {
  expect_error(dsv4("inspect --model " + dir_ + "/nope"), {"no such directory"});
  fs::remove(dir_ + "/config.json");
  expect_error(inspect(), {"config.json is missing"});
}

}  // namespace
}  // namespace dsv4
