// The server's parts that need no model: the per-choice text pipeline (stop tokens, unknown ids,
// stop strings across tokens, split characters), the Prometheus rendering, and the detection of a
// client that went away.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "serve/http/choice_text.h"
#include "serve/http/client_connection.h"
#include "serve/http/metrics.h"

namespace dsv4::serve {
namespace {

const Tokenizer& tokenizer() {
  static const Tokenizer t = Tokenizer::load_default();
  return t;
}

std::vector<int32_t> ids(const std::string& text) { return tokenizer().encode(text); }

// Feeds every id and returns what was sent, piece by piece.
std::vector<std::string> feed(ChoiceText& choice, const std::vector<int32_t>& tokens, int32_t stop_token = -1) {
  std::vector<std::string> sent;
  for (int32_t t : tokens) sent.push_back(choice.push(t, t == stop_token).text);
  sent.push_back(choice.finish());
  return sent;
}

std::string joined(const std::vector<std::string>& pieces) {
  std::string all;
  for (const std::string& p : pieces) all += p;
  return all;
}

TEST(ChoiceText, TheStopTokenIsCountedButNotSent) {
  ChoiceText choice(tokenizer(), {});
  std::vector<int32_t> tokens = ids("Hello there");
  const int32_t eos = tokenizer().require_token("<｜end▁of▁sentence｜>");
  tokens.push_back(eos);
  EXPECT_EQ(joined(feed(choice, tokens, eos)), "Hello there");
  EXPECT_EQ(choice.tokens(), int64_t(tokens.size()));
  EXPECT_EQ(choice.text(), "Hello there");
}

TEST(ChoiceText, UnknownIdsDecodeToNothing) {
  ChoiceText choice(tokenizer(), {});
  std::vector<int32_t> tokens = ids("ab");
  tokens.insert(tokens.begin() + 1, int32_t(tokenizer().id_limit()) + 5);
  EXPECT_EQ(joined(feed(choice, tokens)), "ab");
  EXPECT_EQ(choice.tokens(), int64_t(tokens.size()));
}

TEST(ChoiceText, StopStringAcrossTokensCutsAndCountsUpToTheMatch) {
  // "STOP" arrives split over tokens; what follows it is never sent nor counted.
  const std::vector<int32_t> tokens = [] {
    std::vector<int32_t> all;
    for (const char* piece : {"one two S", "TO", "P three", " four"}) {
      std::vector<int32_t> p = ids(piece);
      all.insert(all.end(), p.begin(), p.end());
    }
    return all;
  }();
  ChoiceText choice(tokenizer(), {"STOP"});
  std::string sent;
  int64_t pushed = 0;
  for (int32_t t : tokens) {
    ChoiceText::Delta d = choice.push(t, false);
    ++pushed;
    sent += d.text;
    if (d.stopped) break;
  }
  sent += choice.finish();
  EXPECT_EQ(sent, "one two ");
  EXPECT_TRUE(choice.stopped());
  EXPECT_EQ(choice.tokens(), pushed);
  EXPECT_LT(pushed, int64_t(tokens.size()));
  EXPECT_TRUE(choice.push(tokens.back(), false).text.empty());
  EXPECT_EQ(choice.tokens(), pushed) << "tokens after the stop are not counted";
}

TEST(ChoiceText, ASplitCharacterWaitsForItsLastByte) {
  ChoiceText choice(tokenizer(), {});
  const std::vector<int32_t> tokens = ids("🙂🙂");
  ASSERT_GT(tokens.size(), 2u) << "byte-level BPE splits the emoji";
  std::vector<std::string> pieces = feed(choice, tokens);
  for (const std::string& piece : pieces) EXPECT_EQ(piece.size() % 4, 0u) << "never half an emoji";
  EXPECT_EQ(joined(pieces), "🙂🙂");
}

TEST(ServerMetrics, RendersVllmNamesWithCumulativeBuckets) {
  ServerMetrics m("tiny \"q\"", 100);
  m.observe_time_to_first_token(0.003);
  m.observe_time_to_first_token(0.2);
  m.observe_inter_token_latency(0.02);
  m.observe_finished({FinishedReason::Length, 1.2, 7, 3});
  m.observe_finished({FinishedReason::Abort, 0.1, 5, 0});
  EngineStats stats;
  stats.running = 2;
  stats.waiting = 1;
  stats.cache_pages_in_use = 25;
  stats.cache_pages_capacity = 100;
  stats.prompt_tokens = 12;
  stats.generation_tokens = 3;
  const std::string text = m.render(stats, 4096);
  const std::string labels = "model_name=\"tiny \\\"q\\\"\"";
  auto has = [&](const std::string& line) { return text.find(line + "\n") != std::string::npos; };
  EXPECT_TRUE(has("dsv4:num_requests_running{" + labels + "} 2")) << text;
  EXPECT_TRUE(has("dsv4:num_requests_waiting{" + labels + "} 1"));
  EXPECT_TRUE(has("dsv4:kv_cache_usage_perc{" + labels + "} 0.25"));
  EXPECT_TRUE(has("dsv4:prompt_tokens_total{" + labels + "} 12"));
  EXPECT_TRUE(has("dsv4:generation_tokens_total{" + labels + "} 3"));
  EXPECT_TRUE(has("# TYPE dsv4:time_to_first_token_seconds histogram"));
  EXPECT_TRUE(has("dsv4:time_to_first_token_seconds_bucket{" + labels + ",le=\"0.001\"} 0"));
  EXPECT_TRUE(has("dsv4:time_to_first_token_seconds_bucket{" + labels + ",le=\"0.005\"} 1"));
  EXPECT_TRUE(has("dsv4:time_to_first_token_seconds_bucket{" + labels + ",le=\"0.25\"} 2"));
  EXPECT_TRUE(has("dsv4:time_to_first_token_seconds_bucket{" + labels + ",le=\"+Inf\"} 2"));
  EXPECT_TRUE(has("dsv4:time_to_first_token_seconds_count{" + labels + "} 2"));
  EXPECT_TRUE(has("dsv4:inter_token_latency_seconds_count{" + labels + "} 1"));
  EXPECT_TRUE(has("dsv4:time_per_output_token_seconds_count{" + labels + "} 1"));
  EXPECT_TRUE(has("dsv4:e2e_request_latency_seconds_count{" + labels + "} 2"));
  EXPECT_TRUE(has("dsv4:request_success_total{" + labels + ",finished_reason=\"length\"} 1"));
  EXPECT_TRUE(has("dsv4:request_success_total{" + labels + ",finished_reason=\"abort\"} 1"));
  EXPECT_TRUE(has("dsv4:request_success_total{" + labels + ",finished_reason=\"stop\"} 0"));
  EXPECT_TRUE(has("dsv4:request_prompt_tokens_bucket{" + labels + ",le=\"5\"} 1"));
  EXPECT_TRUE(has("dsv4:request_prompt_tokens_bucket{" + labels + ",le=\"100\"} 2"));
  EXPECT_TRUE(has("process_resident_memory_bytes 4096"));
}

TEST(ClientConnection, NoticesAPeerThatClosed) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  socklen_t length = sizeof address;
  getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);
  const int server_port = ntohs(address.sin_port);
  const int peer = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(peer, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  const int accepted = accept(listener, nullptr, nullptr);
  ASSERT_GE(accepted, 0);
  sockaddr_in peer_address{};
  length = sizeof peer_address;
  getsockname(peer, reinterpret_cast<sockaddr*>(&peer_address), &length);

  ClientConnection connection("127.0.0.1", server_port, "127.0.0.1", ntohs(peer_address.sin_port));
  ASSERT_TRUE(connection.found());
  EXPECT_FALSE(connection.gone());
  ASSERT_EQ(write(peer, "GET", 3), 3);
  EXPECT_FALSE(connection.gone()) << "unread data is not a disconnect";
  close(peer);
  EXPECT_TRUE(connection.gone());
  EXPECT_FALSE(ClientConnection("127.0.0.1", server_port, "127.0.0.1", 1).found());
  close(accepted);
  close(listener);
}

}  // namespace
}  // namespace dsv4::serve
