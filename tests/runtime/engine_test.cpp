// The engine core on the CPU backend with the tiny-a fixture (layers SWA, CSA, HCA, CSA, HCA):
// batched outputs equal solo outputs token for token (the CPU backend is batch-invariant), stop
// conditions, the step budget, cancellation, admission by cache capacity, seeded sampling and
// shutdown. Every wait is bounded.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "backend/cpu/sampling_reference.h"
#include "core/error.h"
#include "model/tensor_parallel_model.h"
#include "runtime/engine.h"

namespace dsv4 {
namespace {

using namespace std::chrono_literals;

class EngineTest : public ::testing::Test {
 public:  // the helpers serve the EngineParallel tests too
  static void SetUpTestSuite() {
    backend_ = make_backend("cpu").release();
    model_ = new Dsv4Model(load_model_weights(std::string(DSV4_TEST_DATA) + "/golden/tiny-a", backend_), *backend_);
  }
  static void TearDownTestSuite() {
    delete model_;
    delete backend_;
  }
  static Dsv4Model& model() { return *model_; }

  // The request alone, straight on the model: whole-prompt prefill, then one decode per token.
  static std::vector<int32_t> solo(const std::vector<int32_t>& prompt, int n, SamplingParams sp = {}) {
    SeqId s = model().new_sequence();
    std::vector<int32_t> out;
    std::vector<int32_t> tokens = prompt;
    for (int i = 0; i < n; ++i) {
      BatchItem b{s, tokens};
      b.return_logits = false;
      b.sampling = sp;
      b.sample_counter = uint64_t(i);
      out.push_back(model().step({b}).tokens[0]);
      tokens = {out.back()};
    }
    model().free_sequence(s);
    return out;
  }

  static std::vector<int32_t> prompt_of(int len, int salt) {
    std::vector<int32_t> p;
    for (int i = 0; i < len; ++i) p.push_back(2 + (i * 37 + salt * 101) % 1000);
    return p;
  }

  static Request request(std::vector<int32_t> prompt, int max_tokens, bool ignore_eos = true) {
    Request r;
    r.prompt = std::move(prompt);
    r.stop.max_tokens = max_tokens;
    r.stop.ignore_eos = ignore_eos;
    return r;
  }

  struct Result {
    std::vector<int32_t> tokens;
    std::vector<size_t> stop_flagged;  // indices of tokens delivered with is_stop_token
    Event fin;
    bool done = false;
  };
  // Reads a stream to its Finished event, or gives up at the deadline.
  static Result drain(const RequestHandle& h, std::chrono::seconds limit = 30s) {
    Result r;
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      auto e = h->next(100ms);
      if (!e) continue;
      if (e->kind == Event::Kind::Finished) {
        r.fin = *e;
        r.done = true;
        break;
      }
      if (e->is_stop_token) r.stop_flagged.push_back(r.tokens.size());
      r.tokens.push_back(e->token);
    }
    return r;
  }

  template <typename F>
  static bool wait_until(F cond, std::chrono::seconds limit = 10s) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (!cond()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(5ms);
    }
    return true;
  }

  static Backend* backend_;
  static Dsv4Model* model_;
};
Backend* EngineTest::backend_ = nullptr;
Dsv4Model* EngineTest::model_ = nullptr;

int64_t pool_pages(Dsv4Model& m) {
  int64_t n = 0;
  for (int l = 0; l < m.config().n_layers; ++l) n += m.caches(l).kv.pages_in_use() + m.caches(l).keys.pages_in_use();
  return n;
}

// The admission arithmetic against what the model really allocates, at page boundaries of every
// pool kind (CSA entries and keys at 64·4 = 256 positions, HCA entries at 128), chunked prefill.
TEST_F(EngineTest, PageArithmeticMatchesTheModel) {
  const ModelConfig& c = model().config();
  ASSERT_EQ(pool_pages(model()), 0);
  SeqId s = model().new_sequence();
  std::vector<int32_t> prompt = prompt_of(260, 3);
  int64_t pos = 0;
  for (int64_t until : {1, 4, 5, 127, 128, 129, 255, 256, 257, 260}) {
    model().step({BatchItem{s, std::vector<int32_t>(prompt.begin() + pos, prompt.begin() + until)}});
    pos = until;
    for (int l = 0; l < c.n_layers; ++l) {
      LayerPages want = sequence_layer_pages(model().weights().blocks[size_t(l)].ratio, c.window, pos);
      EXPECT_EQ(model().caches(l).kv.pages_in_use(), want.kv) << "layer " << l << " at " << pos << " positions";
      EXPECT_EQ(model().caches(l).keys.pages_in_use(), want.keys) << "layer " << l << " at " << pos << " positions";
    }
  }
  EXPECT_EQ(sequence_layer_pages(4, 128, 260).kv, 2 + 2);
  EXPECT_EQ(sequence_layer_pages(4, 128, 260).keys, 2);
  EXPECT_EQ(sequence_layer_pages(128, 128, 260).kv, 2 + 1);
  EXPECT_EQ(sequence_layer_pages(0, 128, 260).kv, 2);
  model().free_sequence(s);
  EXPECT_EQ(pool_pages(model()), 0);
}

TEST_F(EngineTest, PoolCapacityIsEnforced) {
  PagePool pool(*backend_, EntryKind::KV);
  pool.set_capacity(3);
  std::vector<int32_t> got;
  for (int i = 0; i < 3; ++i) got.push_back(pool.alloc());
  EXPECT_FALSE(pool.can_alloc(1));
  EXPECT_THROW(pool.alloc(), Error);
  pool.free(got.back());
  EXPECT_TRUE(pool.can_alloc(1));
  EXPECT_EQ(pool.alloc(), got.back());
  EXPECT_THROW(pool.set_capacity(2), Error);
}

TEST_F(EngineTest, ConcurrentGreedyRequestsMatchSoloRuns) {
  const std::vector<int> lengths = {2, 5, 9, 16, 31, 40, 70, 140, 3};
  const int n = 5;
  std::vector<std::vector<int32_t>> want;
  for (size_t i = 0; i < lengths.size(); ++i) want.push_back(solo(prompt_of(lengths[i], int(i)), n));
  EngineConfig cfg;
  cfg.scheduler.max_num_batched_tokens = 64;  // forces chunked prefill next to decodes
  cfg.scheduler.max_num_seqs = 16;
  Engine engine(model(), cfg);
  std::vector<RequestHandle> hs;
  for (size_t i = 0; i < lengths.size(); ++i) hs.push_back(engine.submit(request(prompt_of(lengths[i], int(i)), n)));
  for (size_t i = 0; i < hs.size(); ++i) {
    Result r = drain(hs[i]);
    ASSERT_TRUE(r.done) << "request " << i;
    EXPECT_EQ(r.fin.reason, FinishReason::Length) << r.fin.error;
    EXPECT_EQ(r.tokens, want[i]) << "request " << i << " (prompt " << lengths[i] << ")";
    EXPECT_EQ(r.fin.usage.prompt_tokens, lengths[i]);
    EXPECT_EQ(r.fin.usage.completion_tokens, n);
  }
  ASSERT_TRUE(wait_until([&] { return engine.stats().cache_pages_in_use == 0 && engine.stats().running == 0; }));
  EngineStats st = engine.stats();
  int64_t prompt_total = 0;
  for (int l : lengths) prompt_total += l;
  EXPECT_EQ(st.prompt_tokens, uint64_t(prompt_total));
  EXPECT_EQ(st.generation_tokens, uint64_t(n) * lengths.size());
  EXPECT_EQ(st.requests_finished, lengths.size());
}

// The engine drives a model split over ranks as it drives one model (ServingModel): concurrent
// greedy requests through tiny-a split over 2 ranks (attention heads and experts by intermediate
// slice, then by whole experts) equal solo runs on that split model token for token (the split
// ops are row-wise, so the CPU backend stays batch-invariant), and every rank's pages come back.
TEST(EngineParallel, ConcurrentRequestsOnASplitModelMatchSoloRuns) {
  const std::vector<int> lengths = {2, 9, 40, 140, 3};
  const int n = 4;
  for (bool ep : {false, true}) {
    TensorParallelModel tp(std::string(DSV4_TEST_DATA) + "/golden/tiny-a", "cpu", {2, ep});
    std::vector<std::vector<int32_t>> want;
    for (size_t i = 0; i < lengths.size(); ++i) {
      SeqId s = tp.new_sequence();
      std::vector<int32_t> tokens = EngineTest::prompt_of(lengths[i], int(i)), out;
      for (int k = 0; k < n; ++k) {
        BatchItem b{s, tokens};
        b.return_logits = false;
        b.sampling = SamplingParams{};
        b.sample_counter = uint64_t(k);
        out.push_back(tp.step({b}).tokens[0]);
        tokens = {out.back()};
      }
      tp.free_sequence(s);
      want.push_back(out);
    }
    EngineConfig cfg;
    cfg.scheduler.max_num_batched_tokens = 64;  // chunked prefill beside decodes
    cfg.scheduler.max_num_seqs = 8;
    cfg.scheduler.kv_pages_per_layer = 64;  // capacity set on every rank
    cfg.scheduler.key_pages_per_layer = 32;
    Engine engine(tp, cfg);
    std::vector<RequestHandle> hs;
    for (size_t i = 0; i < lengths.size(); ++i)
      hs.push_back(engine.submit(EngineTest::request(EngineTest::prompt_of(lengths[i], int(i)), n)));
    for (size_t i = 0; i < hs.size(); ++i) {
      EngineTest::Result r = EngineTest::drain(hs[i]);
      ASSERT_TRUE(r.done) << "request " << i;
      EXPECT_EQ(r.fin.reason, FinishReason::Length) << r.fin.error;
      EXPECT_EQ(r.tokens, want[i]) << (ep ? "expert" : "tensor") << " parallel, request " << i;
    }
    ASSERT_TRUE(EngineTest::wait_until([&] { return engine.stats().running == 0 && engine.stats().cache_pages_in_use == 0; }));
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(pool_pages(tp.rank_model(rank)), 0) << "rank " << rank;
      EXPECT_EQ(tp.rank_model(rank).caches(0).kv.capacity(), 64) << "rank " << rank;
    }
  }
}

TEST_F(EngineTest, StopConditions) {
  const std::vector<int32_t> prompt = prompt_of(12, 7);
  const std::vector<int32_t> g = solo(prompt, 8);
  Engine plain(model(), {});
  // max_tokens
  Result r = drain(plain.submit(request(prompt, 3)));
  ASSERT_TRUE(r.done);
  EXPECT_EQ(r.fin.reason, FinishReason::Length);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(g.begin(), g.begin() + 3));
  EXPECT_TRUE(r.stop_flagged.empty());
  // stop token ids: stops at the first occurrence, which is delivered and named
  const size_t at = size_t(std::find(g.begin(), g.end(), g[2]) - g.begin());
  Request q = request(prompt, 8);
  q.stop.stop_token_ids = {g[2]};
  r = drain(plain.submit(q));
  ASSERT_TRUE(r.done);
  EXPECT_EQ(r.fin.reason, FinishReason::Stop);
  EXPECT_EQ(r.fin.stop_token, g[2]);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(g.begin(), g.begin() + long(at) + 1));
  EXPECT_EQ(r.stop_flagged, std::vector<size_t>{at}) << "the stop token itself says it ends the request";
  // min_tokens: a stop token before it is an ordinary token
  q.stop.min_tokens = int64_t(at) + 2;
  r = drain(plain.submit(q));
  ASSERT_TRUE(r.done);
  size_t next = at + 1;
  while (next < g.size() && (g[next] != g[2] || int64_t(next + 1) < q.stop.min_tokens)) ++next;
  std::vector<int32_t> want(g.begin(), g.begin() + long(std::min(next + 1, g.size())));
  EXPECT_EQ(r.tokens, want);
  EXPECT_EQ(r.fin.reason, next < g.size() ? FinishReason::Stop : FinishReason::Length);
  EXPECT_EQ(r.stop_flagged, next < g.size() ? std::vector<size_t>{next} : std::vector<size_t>{})
      << "a stop token before min_tokens is an ordinary token";
  plain.shutdown();

  // EOS (the engine's EOS ids) and ignore_eos
  EngineConfig cfg;
  cfg.scheduler.eos_token_ids = {g[2]};
  Engine eos(model(), cfg);
  r = drain(eos.submit(request(prompt, 8, false)));
  ASSERT_TRUE(r.done);
  EXPECT_EQ(r.fin.reason, FinishReason::Stop);
  EXPECT_EQ(r.tokens.size(), at + 1);
  r = drain(eos.submit(request(prompt, 8, true)));
  ASSERT_TRUE(r.done);
  EXPECT_EQ(r.fin.reason, FinishReason::Length);
  EXPECT_EQ(r.tokens, g);
  // the caller's stop (a stop string it matched on text)
  RequestHandle h = eos.submit(request(prompt, 1000, true));
  auto first = h->next(30s);
  ASSERT_TRUE(first && first->kind == Event::Kind::Token);
  eos.stop(h);
  r = drain(h);
  ASSERT_TRUE(r.done);
  EXPECT_EQ(r.fin.reason, FinishReason::Stop);
  EXPECT_EQ(r.fin.stop_token, -1);
  EXPECT_TRUE(r.stop_flagged.empty()) << "a caller's stop flags no token";
}

TEST_F(EngineTest, InvalidRequestsFailAtSubmit) {
  Engine engine(model(), {});
  EXPECT_THROW(engine.submit(request({}, 4)), Error);
  EXPECT_THROW(engine.submit(request({5, 99999}, 4)), Error);
  EXPECT_THROW(engine.submit(request({5, -1}, 4)), Error);
  EXPECT_THROW(engine.submit(request({5}, 0)), Error);
  EXPECT_THROW(engine.submit(request({5}, int(1) << 30)), Error);  // past max_position_embeddings (2^20)
  Request r = request({5}, 4);
  r.sampling.top_p = 0;
  EXPECT_THROW(engine.submit(r), Error);
  r = request({5}, 4);
  r.sampling.temperature = -1;
  EXPECT_THROW(engine.submit(r), Error);
  r = request({5}, 4);
  r.stop.min_tokens = 5;
  EXPECT_THROW(engine.submit(r), Error);
  // the engine still serves
  Result ok = drain(engine.submit(request({5, 6, 7}, 2)));
  EXPECT_TRUE(ok.done);
  EXPECT_EQ(ok.fin.reason, FinishReason::Length);
}

TEST_F(EngineTest, StepsRespectTokenBudgetAndSequenceLimit) {
  EngineConfig cfg;
  cfg.scheduler.max_num_batched_tokens = 24;
  cfg.scheduler.max_num_seqs = 3;
  std::mutex m;
  std::vector<StepRecord> steps;
  cfg.on_step = [&](const StepRecord& s) {
    std::lock_guard lock(m);
    steps.push_back(s);
  };
  const std::vector<int> lengths = {30, 7, 50, 3, 12};
  std::vector<std::vector<int32_t>> want;
  for (size_t i = 0; i < lengths.size(); ++i) want.push_back(solo(prompt_of(lengths[i], int(i) + 20), 4));
  Engine engine(model(), cfg);
  std::vector<RequestHandle> hs;
  for (size_t i = 0; i < lengths.size(); ++i) hs.push_back(engine.submit(request(prompt_of(lengths[i], int(i) + 20), 4)));
  for (size_t i = 0; i < hs.size(); ++i) {
    Result r = drain(hs[i]);
    ASSERT_TRUE(r.done);
    EXPECT_EQ(r.tokens, want[i]) << "request " << i;
  }
  engine.shutdown();
  std::lock_guard lock(m);
  ASSERT_FALSE(steps.empty());
  bool mixed = false, chunked = false;
  std::map<uint64_t, int64_t> first_step;
  for (size_t s = 0; s < steps.size(); ++s) {
    const StepRecord& st = steps[s];
    int64_t sum = 0;
    bool has_decode = false, has_prefill = false;
    for (auto& p : st.parts) {
      sum += p.tokens;
      (p.prefill ? has_prefill : has_decode) = true;
      if (p.prefill && p.tokens == 24) chunked = true;
      first_step.emplace(p.request, int64_t(s));
    }
    EXPECT_EQ(sum, st.num_tokens);
    EXPECT_LE(st.num_tokens, 24) << "step " << s;
    EXPECT_LE(st.parts.size(), 3u) << "step " << s;
    mixed |= has_decode && has_prefill;
  }
  EXPECT_TRUE(mixed) << "decode tokens and prefill chunks should share steps";
  EXPECT_TRUE(chunked) << "the 30- and 50-token prompts need chunks";
  // first come, first served: requests start in submission order
  std::vector<int64_t> starts;
  for (auto& [id, s] : first_step) starts.push_back(s);
  EXPECT_TRUE(std::is_sorted(starts.begin(), starts.end()));
}

TEST_F(EngineTest, CancelFreesPagesAndLeavesOthersAlone) {
  const std::vector<int32_t> pa = prompt_of(20, 31), pb = prompt_of(45, 32);
  const std::vector<int32_t> wa = solo(pa, 12), wb = solo(pb, 12);
  Engine engine(model(), {});
  const int64_t idle = engine.stats().cache_pages_in_use;
  EXPECT_EQ(idle, 0);
  RequestHandle a = engine.submit(request(pa, 12));
  RequestHandle victim = engine.submit(request(prompt_of(33, 33), 1000));
  RequestHandle b = engine.submit(request(pb, 12));
  for (int i = 0; i < 3; ++i) {
    auto e = victim->next(30s);
    ASSERT_TRUE(e && e->kind == Event::Kind::Token);
  }
  engine.cancel(victim);
  Result rv = drain(victim);
  ASSERT_TRUE(rv.done);
  EXPECT_EQ(rv.fin.reason, FinishReason::Cancelled);
  EXPECT_LT(rv.tokens.size() + 3, 1000u);
  Result ra = drain(a), rb = drain(b);
  ASSERT_TRUE(ra.done && rb.done);
  EXPECT_EQ(ra.tokens, wa);
  EXPECT_EQ(rb.tokens, wb);
  ASSERT_TRUE(wait_until([&] { return engine.stats().running == 0; }));
  EXPECT_EQ(engine.stats().cache_pages_in_use, idle);

  // Alone: the pages come back while the engine keeps running.
  RequestHandle c = engine.submit(request(prompt_of(10, 34), 1000));
  auto e = c->next(30s);
  ASSERT_TRUE(e && e->kind == Event::Kind::Token);
  EXPECT_GT(engine.stats().cache_pages_in_use, idle);
  engine.cancel(c);
  ASSERT_TRUE(drain(c).done);
  ASSERT_TRUE(wait_until([&] { return engine.stats().cache_pages_in_use == idle; }));
  engine.cancel(c);  // finished already: a no-op
}

TEST_F(EngineTest, AdmissionWaitsForCachePages) {
  // Each request needs, per layer, 2 window pages + 1 compressed page (CSA) and 1 step scratch
  // page: a 4-page KV pool holds one such request at a time, never two.
  const std::vector<int32_t> p1 = prompt_of(20, 41), p2 = prompt_of(24, 42);
  const std::vector<int32_t> w1 = solo(p1, 6), w2 = solo(p2, 6);
  EngineConfig cfg;
  cfg.scheduler.max_num_batched_tokens = 64;
  cfg.scheduler.kv_pages_per_layer = 4;
  cfg.scheduler.key_pages_per_layer = 1;
  std::mutex m;
  std::vector<StepRecord> steps;
  cfg.on_step = [&](const StepRecord& s) {
    std::lock_guard lock(m);
    steps.push_back(s);
  };
  Engine engine(model(), cfg);
  EXPECT_GT(engine.stats().cache_pages_capacity, 0);
  // A request whose worst case exceeds the empty cache is refused at once, not queued forever.
  EXPECT_THROW(engine.submit(request(prompt_of(20, 43), 300)), Error);
  RequestHandle h1 = engine.submit(request(p1, 6)), h2 = engine.submit(request(p2, 6));
  Result r1 = drain(h1), r2 = drain(h2);
  ASSERT_TRUE(r1.done && r2.done);
  EXPECT_EQ(r1.tokens, w1);
  EXPECT_EQ(r2.tokens, w2);
  engine.shutdown();
  std::lock_guard lock(m);
  for (auto& s : steps) EXPECT_EQ(s.parts.size(), 1u) << "the two requests never fit together";
  EXPECT_EQ(steps.size(), 2u * 6u);
}

TEST_F(EngineTest, ExactCapacityIsEnoughToFinish) {
  // The worst case is reserved at admission, so a running request always grows: with capacity set
  // to exactly one request's need, it crosses page boundaries during decode (63 → 65 CSA entries)
  // and finishes without a cache error.
  const std::vector<int32_t> prompt = prompt_of(254, 51);
  Sequence probe(0, request(prompt, 8));
  const ModelConfig& c = model().config();
  int64_t kv = 0, keys = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    LayerPages p = sequence_layer_pages(model().weights().blocks[size_t(l)].ratio, c.window, probe.max_positions());
    kv = std::max(kv, p.kv), keys = std::max(keys, p.keys);
  }
  EXPECT_EQ(kv, 4);  // 2 window + 2 compressed (65 CSA entries)
  EngineConfig cfg;
  cfg.scheduler.max_num_batched_tokens = 128;
  cfg.scheduler.kv_pages_per_layer = kv + step_scratch_pages(128);
  cfg.scheduler.key_pages_per_layer = keys;
  Engine engine(model(), cfg);
  Result r = drain(engine.submit(request(prompt, 8)));
  ASSERT_TRUE(r.done);
  EXPECT_EQ(r.fin.reason, FinishReason::Length) << r.fin.error;
  EXPECT_EQ(r.tokens.size(), 8u);
}

// Penalties through the engine against the definition applied by hand: each step's raw logits
// (return_logits) with every seen token's logit through penalized_logit, then the same sampler.
// Batched with an unpenalised request, whose tokens must not change.
TEST_F(EngineTest, PenaltiesFollowTheDefinitionAloneAndBatched) {
  const std::vector<int32_t> prompt = prompt_of(10, 5);
  // Penalties that favour seen tokens (repetition < 1, negative frequency and presence), so the
  // greedy output surely changes; the arithmetic is the same for discouraging ones.
  PenaltyParams pen{0.3f, -1.5f, -1.0f};
  SamplingParams sp;  // greedy: the penalties alone decide what changes
  const int n = 8;
  std::vector<int32_t> want;
  {
    SeqId s = model().new_sequence();
    std::vector<int32_t> tokens = prompt;
    for (int i = 0; i < n; ++i) {
      StepOutput out = model().step({BatchItem{s, tokens}});
      std::vector<float> row(out.logits.end() - out.vocab, out.logits.end());
      std::map<int32_t, int32_t> counts;
      for (int32_t t : prompt) counts.emplace(t, 0);
      for (int32_t t : want) ++counts[t];
      for (auto [id, count] : counts) row[size_t(id)] = sampling::penalized_logit(row[size_t(id)], pen, count);
      uint64_t counter = uint64_t(i);
      int32_t next = -1;
      sample_reference(row.data(), 1, out.vocab, &sp, &counter, &next);
      want.push_back(next);
      tokens = {next};
    }
    model().free_sequence(s);
  }
  const std::vector<int32_t> plain = solo(prompt_of(7, 9), n);
  EXPECT_NE(want, solo(prompt, n)) << "the penalties change this greedy output (else the test proves nothing)";
  Engine engine(model(), {});
  Request penalised = request(prompt, n);
  penalised.penalties = pen;
  RequestHandle a = engine.submit(penalised), b = engine.submit(request(prompt_of(7, 9), n));
  Result ra = drain(a), rb = drain(b);
  ASSERT_TRUE(ra.done && rb.done);
  EXPECT_EQ(ra.tokens, want);
  EXPECT_EQ(rb.tokens, plain) << "the penalties stay on their own row";
  Request bad = request(prompt, 2);
  bad.penalties.repetition = 0;
  EXPECT_THROW(engine.submit(bad), Error);
}

// Logprobs ride on the token events: the sampled token's and the top N of the raw row, the same
// alone and batched; under greedy sampling the token is the top one.
TEST_F(EngineTest, LogprobsComeWithTheTokens) {
  const std::vector<int32_t> prompt = prompt_of(9, 4);
  const int n = 5;
  auto run = [&](std::vector<Request> requests) {
    Engine engine(model(), {});
    std::vector<RequestHandle> handles;
    for (Request& r : requests) handles.push_back(engine.submit(std::move(r)));
    std::vector<std::vector<TokenLogprobs>> all;
    for (const RequestHandle& h : handles) {
      std::vector<TokenLogprobs> lps;
      auto deadline = std::chrono::steady_clock::now() + 30s;
      while (std::chrono::steady_clock::now() < deadline) {
        auto e = h->next(100ms);
        if (!e) continue;
        if (e->kind == Event::Kind::Finished) break;
        EXPECT_TRUE(e->logprobs.has_value() == (&h == &handles[0])) << "logprobs only where asked";
        if (e->logprobs) {
          EXPECT_EQ(e->logprobs->top_ids.front(), e->token) << "greedy picks the top token";
          lps.push_back(*e->logprobs);
        }
      }
      all.push_back(lps);
    }
    return all;
  };
  Request with = request(prompt, n);
  with.logprobs = 4;
  const auto alone = run({with});
  const auto batched = run({with, request(prompt_of(20, 2), n)});
  ASSERT_EQ(alone[0].size(), size_t(n));
  ASSERT_EQ(batched[0].size(), size_t(n));
  for (int i = 0; i < n; ++i) {
    const TokenLogprobs& t = alone[0][size_t(i)];
    ASSERT_EQ(t.top.size(), 4u);
    EXPECT_EQ(t.chosen, t.top[0]);
    EXPECT_LE(t.top[0], 0.f);
    for (size_t k = 1; k < t.top.size(); ++k) EXPECT_LE(t.top[k], t.top[k - 1]);
    EXPECT_EQ(batched[0][size_t(i)].top_ids, t.top_ids);
    EXPECT_EQ(batched[0][size_t(i)].top, t.top);
    EXPECT_EQ(batched[0][size_t(i)].chosen, t.chosen);
  }
}

TEST_F(EngineTest, SeededSamplingIsTheSameAloneAndBatched) {
  std::vector<SamplingParams> sp(4);
  std::vector<std::vector<int32_t>> prompts, want;
  for (int i = 0; i < 4; ++i) {
    sp[size_t(i)].temperature = 0.9f + 0.1f * float(i);
    sp[size_t(i)].top_p = 0.95f;
    sp[size_t(i)].top_k = i == 1 ? 0 : 40;
    sp[size_t(i)].min_p = i == 2 ? 0.05f : 0;
    sp[size_t(i)].seed = 1000 + uint64_t(i);
    prompts.push_back(prompt_of(6 + 9 * i, 60 + i));
    want.push_back(solo(prompts.back(), 6, sp[size_t(i)]));
  }
  EngineConfig cfg;
  cfg.scheduler.max_num_batched_tokens = 16;
  cfg.scheduler.max_num_seqs = 8;
  Engine engine(model(), cfg);
  std::vector<RequestHandle> hs;
  for (int i = 0; i < 4; ++i) {
    Request r = request(prompts[size_t(i)], 6);
    r.sampling = sp[size_t(i)];
    hs.push_back(engine.submit(r));
  }
  for (int i = 0; i < 4; ++i) {
    Result r = drain(hs[size_t(i)]);
    ASSERT_TRUE(r.done);
    EXPECT_EQ(r.tokens, want[size_t(i)]) << "request " << i;
  }
}

TEST_F(EngineTest, ShutdownWithRequestsInFlight) {
  std::vector<RequestHandle> hs;
  {
    Engine engine(model(), {});
    for (int i = 0; i < 5; ++i) hs.push_back(engine.submit(request(prompt_of(8 + 5 * i, 70 + i), 10000)));
    auto e = hs[0]->next(30s);
    ASSERT_TRUE(e && e->kind == Event::Kind::Token);
    auto t0 = std::chrono::steady_clock::now();
    engine.shutdown();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
    EXPECT_THROW(engine.submit(request({5, 6}, 2)), Error);
    engine.shutdown();  // idempotent
    EXPECT_EQ(engine.stats().running, 0u);
    EXPECT_EQ(engine.stats().cache_pages_in_use, 0);
  }
  for (auto& h : hs) {
    Result r = drain(h, 1s);
    ASSERT_TRUE(r.done);
    EXPECT_EQ(r.fin.reason, FinishReason::Cancelled);
  }
  // Drain finishes what was submitted.
  Engine engine(model(), {});
  RequestHandle a = engine.submit(request({5, 6, 7}, 3)), b = engine.submit(request({8, 9}, 2));
  engine.shutdown(Engine::Shutdown::Drain);
  Result ra = drain(a, 1s), rb = drain(b, 1s);
  ASSERT_TRUE(ra.done && rb.done);
  EXPECT_EQ(ra.fin.reason, FinishReason::Length);
  EXPECT_EQ(ra.tokens.size(), 3u);
  EXPECT_EQ(rb.tokens.size(), 2u);
}

}  // namespace
}  // namespace dsv4
