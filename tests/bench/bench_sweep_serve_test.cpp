// scripts/run_measure.sh against the real `dsv4 serve` on a tiny CPU model: it starts the server
// (nothing answers on the port), runs `bench sweep` with the gate expecting the tiny model's known
// greedy answer, three steps, and stops the server. Needs the default tokenizer (label serve).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "scripted_server.h"
#include "test_util.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream ss(text);
  for (std::string l; std::getline(ss, l);) lines.push_back(l);
  return lines;
}

TEST(BenchSweepServe, RunMeasureAgainstDsv4ServeOnATinyModel) {
  const std::string dir = test::fresh_dir("bench_sweep_serve");
  // The greedy chat answer of this model (make-tiny's default seed) to the 17*23 question, in
  // two tokens, is "탄 charming" (found by running the server; the same at every thread count).
  test::CommandResult r = test::run_dsv4("make-tiny --out " + dir + "/tiny --set num_hidden_layers=2");
  ASSERT_EQ(r.rc, 0) << r.out;
  const int port = test::unused_port();
  const std::string cmd = "RESULTS=" + dir + "/results PORT=" + std::to_string(port) + " DSV4=" + DSV4_BINARY +
                          " READY_TIMEOUT=120 SWEEP_ARGS='--gate-max-tokens 2 --gate-expect charming --concurrency 1,2,4 "
                          "--num-prompts 2,4,8 --random-input-len 16 --random-output-len 8 --ignore-eos' " DSV4_SOURCE_DIR
                          "/scripts/run_measure.sh tiny --model " + dir + "/tiny --max-num-seqs 8 >" + dir + "/run.log 2>&1";
  const int status = std::system(cmd.c_str());
  const std::string out = test::read_text(dir + "/run.log");
  ASSERT_TRUE(WIFEXITED(status)) << out;
  const std::string res = dir + "/results/tiny";
  const std::string log_text = test::read_text(res + "/sweep.log");
  EXPECT_EQ(WEXITSTATUS(status), 0) << out << log_text << test::read_text(res + "/bench.log") << test::read_text(res + "/server.log");
  auto log = lines_of(log_text);
  ASSERT_EQ(log.size(), 7u) << log_text;
  EXPECT_EQ(log[1], "gate: passed (expected 'charming', answer \"탄 charming\")");
  const int concurrency[] = {1, 2, 4}, prompts[] = {2, 4, 8};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(log[size_t(2 + i)].rfind("step " + std::to_string(i + 1) + "/3: concurrency " + std::to_string(concurrency[i]), 0), 0u)
        << log[size_t(2 + i)];
    auto j = nlohmann::json::parse(test::read_text(res + "/c" + std::to_string(concurrency[i]) + "-n" +
                                                   std::to_string(prompts[i]) + ".json"));
    EXPECT_EQ(j["completed"], prompts[i]);
    EXPECT_EQ(j["total_output_tokens"], prompts[i] * 8);  // the server's usage, --ignore-eos
    EXPECT_EQ(j["total_input_tokens"], prompts[i] * 16);  // token-id prompts: exact
    EXPECT_GT(j["median_tpot_ms"].get<double>(), 0);
  }
  EXPECT_EQ(log[5], "status: ok");
  EXPECT_EQ(log[6], "ALL_DONE_tiny");
  EXPECT_TRUE(fs::exists(res + "/sweep.svg"));
  // The server the script started is gone.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(uint16_t(port));
  EXPECT_NE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << "dsv4 serve still listens on " << port;
  ::close(fd);
}

}  // namespace
}  // namespace dsv4
