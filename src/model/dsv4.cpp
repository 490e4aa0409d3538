// The DeepSeek-V4 forward, SPEC §3, over a batch of sequences. Only backend ops touch tensor data.
#include "model/dsv4.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "core/log.h"

namespace dsv4 {

struct Dsv4Model::Sequence {
  bool live = false;
  int64_t pos = 0;
  std::vector<LayerState> layers;  // main layers
};

RopeTable make_rope_table(const ModelConfig& c, bool compressed_layer) {
  // SPEC §2.8: f32 frequencies; YaRN only for compressed layers (θ = compress_rope_theta).
  const int dim = c.rope_dim;
  const float base = float(compressed_layer ? c.compress_rope_theta : c.rope_theta);
  RopeTable t;
  t.inv_freq.resize(size_t(dim / 2));
  for (int i = 0; i < dim / 2; ++i) t.inv_freq[size_t(i)] = 1.0f / std::pow(base, float(2 * i) / float(dim));
  if (compressed_layer && c.original_seq_len > 0) {
    auto corr = [&](double rot) { return dim * std::log(double(c.original_seq_len) / (rot * 2 * M_PI)) / (2 * std::log(double(base))); };
    double lo = std::max(std::floor(corr(c.beta_fast)), 0.0);
    double hi = std::min(std::ceil(corr(c.beta_slow)), double(dim - 1));
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < dim / 2; ++i) {
      float ramp = std::clamp((float(i) - float(lo)) / float(hi - lo), 0.0f, 1.0f);
      float smooth = 1.0f - ramp;
      float f = t.inv_freq[size_t(i)];
      t.inv_freq[size_t(i)] = f / float(c.rope_factor) * (1.0f - smooth) + f * smooth;
    }
  }
  return t;
}

namespace {
Tensor view(const Tensor& t, std::vector<int64_t> shape) {
  Tensor v = t;
  v.shape = std::move(shape);
  DSV4_CHECK(v.numel() == t.numel(), "view: {} elements as {}", t.numel(), shape_str(v.shape));
  return v;
}
}  // namespace

Dsv4Model::Dsv4Model(std::unique_ptr<ModelWeights> weights, Backend& backend, Communicator* comm)
    : weights_(std::move(weights)), backend_(backend), comm_(comm) {
  const ModelConfig& c = config();
  const int world = comm ? comm->world_size() : 1;
  DSV4_CHECK(weights_->layout.world == world && (!comm || weights_->layout.rank == comm->rank()),
             "weights bound for rank {} of {}, communicator is rank {} of {}", weights_->layout.rank, weights_->layout.world,
             comm ? comm->rank() : 0, world);
  rope_plain_ = make_rope_table(c, false);
  rope_yarn_ = make_rope_table(c, true);
  for (RopeTable* t : {&rope_plain_, &rope_yarn_})
    t->device = static_cast<const float*>(backend_.place_weight(t->inv_freq.data(), t->inv_freq.size() * 4));
  for (int l = 0; l < c.total_layers(); ++l) caches_.push_back(std::make_unique<LayerCaches>(backend_));
  graph_mode_ = can_record() ? DecodeGraphs::Record : DecodeGraphs::Off;
  if (const char* env = std::getenv("DSV4_DECODE_GRAPHS")) {
    const std::string v = env;
    if (v == "off") graph_mode_ = DecodeGraphs::Off;
    else if (v == "pad") graph_mode_ = DecodeGraphs::Pad;
    else if (v == "record") set_decode_graphs(DecodeGraphs::Record);
    else fail("DSV4_DECODE_GRAPHS={}: expected off, pad or record", v);
  }
}

// A recorded decode step: its descriptor buffer (the forward part, refilled before each replay),
// the recording, and the head's logits it leaves (memory the recording owns).
struct Dsv4Model::DecodeGraph {
  // Steps of this shape run as called before one is recorded: the first grows the workspaces
  // and sizes the descriptor, the second runs exactly as a recorded one allocates (its
  // descriptor in the recording's buffer, the sampling part apart), so the pool holds every
  // block the recording will take.
  int warm_steps = 0;
  int failures = 0;        // recordings that failed (a block missing): after 3, run as called
  int64_t words = 0;       // the descriptor's forward part
  Tensor descriptor;
  std::unique_ptr<CapturedWork> work;
  Tensor logits;
};

struct Dsv4Model::NextPlan {
  std::vector<SeqId> seqs;
  std::vector<int64_t> pos;  // each sequence's position at the planned step
  int bucket = 0;
  int64_t bound = 0;
  StepPlan plan;
  // What planning changed in each (sequence, layer) state, to undo it.
  struct Undo {
    LayerState* state;
    LayerCaches* caches;
    int64_t n_comp, n_keys;
    size_t comp_pages, key_pages;
  };
  std::vector<Undo> undo;

  void undo_states() {
    for (const Undo& u : undo) {
      LayerState& st = *u.state;
      while (st.comp_pages.size() > u.comp_pages) u.caches->kv.free(st.comp_pages.back()), st.comp_pages.pop_back();
      while (st.key_pages.size() > u.key_pages) u.caches->keys.free(st.key_pages.back()), st.key_pages.pop_back();
      st.n_comp = u.n_comp, st.n_keys = u.n_keys;
    }
    undo.clear();
  }
};

Dsv4Model::~Dsv4Model() = default;

void Dsv4Model::set_decode_graphs(DecodeGraphs mode) {
  DSV4_CHECK(mode != DecodeGraphs::Record || can_record(), "decode graphs: the {} backend{} cannot record steps",
             backend_.name(), backend_.can_capture() ? "'s collectives (host-staged)" : "");
  graph_mode_ = mode;
  drop_recordings();
}

void Dsv4Model::drop_recordings() {
  drop_next_plan();
  graphs_.clear();
}

void Dsv4Model::drop_next_plan() {
  if (!next_) return;
  release_step_plan(next_->plan);
  next_->undo_states();
  next_.reset();
}

void Dsv4Model::plan_next_step(const std::vector<BatchItem>& batch, int bucket) {
  const ModelConfig& c = config();
  int64_t end = 0;  // the next step's last position + 1
  for (auto& item : batch) end = std::max(end, seqs_[size_t(item.seq)]->pos + 2);
  const int64_t bound = std::max<int64_t>(1024, int64_t(std::bit_ceil(uint64_t(end))));
  if (bound > c.max_position_embeddings) return;
  Tensor descriptor;
  if (graph_mode_ == DecodeGraphs::Record) {
    // Only for a shape that replays (checked before any planning work): its first steps run as
    // called and size its buffers.
    auto it = graphs_.find({bucket, bound});
    if (it == graphs_.end() || it->second->warm_steps < 2 || it->second->failures >= 3 || !it->second->descriptor.data)
      return;
    descriptor = it->second->descriptor;  // refilled after this step's replay read it (stream order)
  }
  PlanRequest rq;
  {
    std::vector<BatchItem> next;
    for (auto& item : batch) next.push_back({item.seq, {0}});  // token ids come with the step
    rq = fixed_request(next, bucket, bound, 1);
  }
  rq.descriptor = descriptor;
  auto np = std::make_unique<NextPlan>();
  np->bucket = bucket, np->bound = bound;
  for (size_t i = 0; i < batch.size(); ++i) {
    np->seqs.push_back(batch[i].seq);
    np->pos.push_back(seqs_[size_t(batch[i].seq)]->pos + 1);
    for (size_t l = 0; l < rq.layers.size(); ++l) {
      LayerState* st = rq.spans[i].states[l];
      np->undo.push_back({st, rq.layers[l].caches, st->n_comp, st->n_keys, st->comp_pages.size(), st->key_pages.size()});
    }
  }
  try {
    np->plan = build_step_plan(backend_, rq);
  } catch (const std::exception& e) {
    // Nothing is lost: the next step plans as usual (and reports what failed, if it fails again).
    np->undo_states();
    log_debug("the next decode step was not planned ahead: {}", e.what());
    return;
  }
  next_ = std::move(np);
}

Dsv4Model::GraphStats Dsv4Model::graph_stats() const {
  GraphStats s = graph_stats_;
  s.recordings = 0;
  for (auto& [k, g] : graphs_) s.recordings += g->work != nullptr;
  return s;
}

LayerState Dsv4Model::make_layer_state(const BlockWeights& block, LayerCaches& caches) {
  const ModelConfig& c = config();
  LayerState s;
  for (int p = 0; p < (c.window + kPageEntries - 1) / kPageEntries; ++p) s.window_pages.push_back(caches.kv.alloc());
  if (block.ratio) s.compressor_slot = caches.compressor.alloc(block.ratio, c.head_dim);
  if (block.ratio == 4) s.index_compressor_slot = caches.index_compressor.alloc(4, c.index_head_dim);
  return s;
}

void Dsv4Model::release_layer_state(LayerState& s, LayerCaches& caches) {
  for (auto p : s.window_pages) caches.kv.free(p);
  for (auto p : s.comp_pages) caches.kv.free(p);
  for (auto p : s.key_pages) caches.keys.free(p);
  if (s.compressor_slot >= 0) caches.compressor.free(s.compressor_slot);
  if (s.index_compressor_slot >= 0) caches.index_compressor.free(s.index_compressor_slot);
  s = LayerState{};
}

SeqId Dsv4Model::new_sequence() {
  size_t id = 0;
  while (id < seqs_.size() && seqs_[id]->live) ++id;
  if (id == seqs_.size()) seqs_.push_back(std::make_unique<Sequence>());
  Sequence& s = *seqs_[id];
  s.live = true;
  s.pos = 0;
  s.layers.clear();
  for (int l = 0; l < config().n_layers; ++l) s.layers.push_back(make_layer_state(weights_->blocks[size_t(l)], *caches_[size_t(l)]));
  return SeqId(id);
}

void Dsv4Model::free_sequence(SeqId id) {
  DSV4_CHECK(id >= 0 && size_t(id) < seqs_.size() && seqs_[size_t(id)]->live, "free_sequence: no sequence {}", id);
  drop_next_plan();
  Sequence& s = *seqs_[size_t(id)];
  for (int l = 0; l < config().n_layers; ++l) release_layer_state(s.layers[size_t(l)], *caches_[size_t(l)]);
  s.live = false;
}

int64_t Dsv4Model::position(SeqId id) const { return seqs_.at(size_t(id))->pos; }

void Dsv4Model::set_cache_capacity(int64_t kv_pages, int64_t key_pages) {
  for (int l = 0; l < config().n_layers; ++l) {
    caches_[size_t(l)]->kv.set_capacity(kv_pages);
    caches_[size_t(l)]->keys.set_capacity(key_pages);
  }
}

Tensor Dsv4Model::embed_streams(const StepPlan& plan) {
  // Every hyper-connection stream starts as the token's embedding (SPEC §3.1): one gather of the
  // embedding row per stream row.
  const ModelConfig& c = config();
  return view(backend_.embed(plan.stream_tokens, weights_->embed, c.dim), {plan.rows, c.hc_mult, c.dim});
}

StepPlan Dsv4Model::plan_step(const std::vector<BatchItem>& batch) {
  drop_next_plan();  // a plan made ahead has moved its sequences' entry counts on
  return build_step_plan(backend_, plan_request(batch));
}

PlanRequest Dsv4Model::plan_request(const std::vector<BatchItem>& batch, int64_t ahead) {
  const ModelConfig& c = config();
  PlanRequest rq;
  rq.hc_mult = c.hc_mult;
  rq.window = c.window;
  rq.index_topk = c.index_topk;
  for (int l = 0; l < c.n_layers; ++l) rq.layers.push_back({weights_->blocks[size_t(l)].ratio, caches_[size_t(l)].get()});
  std::vector<const Sequence*> seen;
  int32_t rows = 0;
  for (auto& item : batch) {
    DSV4_CHECK(item.seq >= 0 && size_t(item.seq) < seqs_.size() && seqs_[size_t(item.seq)]->live, "step: no sequence {}", item.seq);
    DSV4_CHECK(!item.tokens.empty(), "step: sequence {} has no tokens", item.seq);
    Sequence& s = *seqs_[size_t(item.seq)];
    DSV4_CHECK(std::find(seen.begin(), seen.end(), &s) == seen.end(), "step: sequence {} appears twice", item.seq);
    seen.push_back(&s);
    const int64_t pos0 = s.pos + ahead;
    DSV4_CHECK(pos0 + int64_t(item.tokens.size()) <= c.max_position_embeddings,
               "step: sequence {} would reach position {}, beyond max_position_embeddings {}", item.seq,
               pos0 + int64_t(item.tokens.size()), c.max_position_embeddings);
    for (int32_t t : item.tokens)
      DSV4_CHECK(t >= 0 && t < c.vocab_size, "step: token id {} outside the vocabulary (0..{})", t, c.vocab_size - 1);
    PlanRequest::Span sp{item.tokens, pos0, {}};
    for (auto& st : s.layers) sp.states.push_back(&st);
    rq.spans.push_back(std::move(sp));
    // Only the rows whose logits were asked for go through the head; sampling reads an item's last.
    const int32_t n = int32_t(item.tokens.size());
    for (int32_t r = item.all_logits ? 0 : n - 1; r < n; ++r) rq.head_rows.push_back(rows + r);
    if (item.sampling) {
      const int32_t row = int32_t(rq.sample_rows.size());
      rq.sample_rows.push_back(int32_t(rq.head_rows.size()) - 1);
      rq.sample_params.push_back(*item.sampling);
      rq.sample_counters.push_back(item.sample_counter);
      rq.penalty_params.push_back(item.penalties);
      if (const PenaltyTokens* pt = item.penalty_tokens) {
        DSV4_CHECK(pt->ids.size() == pt->output_counts.size(), "step: {} penalty ids, {} counts", pt->ids.size(), pt->output_counts.size());
        for (size_t k = 0; k < pt->ids.size(); ++k) {
          DSV4_CHECK(pt->ids[k] >= 0 && pt->ids[k] < c.vocab_size, "step: penalty token {} outside the vocabulary", pt->ids[k]);
          rq.penalty_rows.push_back(row), rq.penalty_ids.push_back(pt->ids[k]), rq.penalty_counts.push_back(pt->output_counts[k]);
        }
      }
      if (item.logprobs >= 0) {
        rq.logprob_rows.push_back(row);
        rq.top_logprobs = std::max(rq.top_logprobs, item.logprobs);
      }
    }
    rows += n;
  }
  return rq;
}

StepResult Dsv4Model::run_step(const StepPlan& plan) {
  StepResult r;
  r.logits = run_forward(plan);
  sample_head(plan, r);
  return r;
}

Tensor Dsv4Model::run_forward(const StepPlan& plan) {
  const ModelConfig& c = config();
  auto region = [this](int l) {
    if (on_block) on_block(l);
  };
  region(-1);
  BlockOutput state;
  state.X = embed_streams(plan);
  emit("embed_out", 0, state.X);
  for (int l = 0; l < c.n_layers; ++l) {
    region(l);
    state = run_block_pending(weights_->blocks[size_t(l)], std::move(state), plan, size_t(l));
  }
  region(c.n_layers);
  const Tensor X = settle(std::move(state));
  const int64_t P = plan.head_rows.numel();
  Tensor Xp = view(backend_.gather_rows(view(X, {plan.rows, c.hc_mult * c.dim}), plan.head_rows), {P, c.hc_mult, c.dim});
  return head_logits(Xp, weights_->hc_head, weights_->norm);
}

void Dsv4Model::sample_head(const StepPlan& plan, StepResult& r) {
  if (plan.sample_rows.numel()) {
    // The sampled rows of the head's output (a copy where penalties will rewrite them).
    Tensor rows = plan.sample_all_rows && !plan.penalties ? r.logits : backend_.gather_rows(r.logits, plan.sample_rows);
    // Logprobs are of the raw rows (vLLM's default): taken before the penalties.
    Tensor raw = plan.logprob_rows.numel() ? backend_.gather_rows(rows, plan.logprob_rows) : Tensor{};
    if (plan.penalties)
      backend_.apply_penalties(rows, plan.penalty_params, plan.penalty_rows, plan.penalty_ids, plan.penalty_counts);
    r.tokens = backend_.sample(rows, plan.sample_params, plan.sample_counters);
    if (raw.data) r.logprobs = backend_.logprobs(raw, backend_.gather_rows(r.tokens, plan.logprob_rows), plan.top_logprobs);
  }
}

StepOutput Dsv4Model::finish_step(StepPlan& plan, const StepResult& result, const std::vector<BatchItem>& batch) {
  const ModelConfig& c = config();
  release_step_plan(plan);
  StepOutput out;
  out.vocab = c.vocab_size;
  int64_t rows = 0;
  for (auto& item : batch) {
    out.row_of.push_back(rows);
    rows += item.all_logits ? int64_t(item.tokens.size()) : 1;
  }
  out.tokens.assign(batch.size(), -1);
  if (result.tokens.data && result.tokens.numel()) {
    std::vector<int32_t> picked(size_t(result.tokens.numel()));
    backend_.to_host(result.tokens, picked.data());
    std::vector<size_t> item_of_sample;
    for (size_t i = 0; i < batch.size(); ++i)
      if (batch[i].sampling) out.tokens[i] = picked[item_of_sample.size()], item_of_sample.push_back(i);
    const int64_t L = plan.logprob_rows.numel();
    if (L && result.logprobs.chosen.data) {
      const int top = plan.top_logprobs;
      std::vector<int32_t> rows(static_cast<size_t>(L)), top_ids(static_cast<size_t>(L * top));
      std::vector<float> chosen(static_cast<size_t>(L)), top_lp(static_cast<size_t>(L * top));
      backend_.to_host(plan.logprob_rows, rows.data());
      backend_.to_host(result.logprobs.chosen, chosen.data());
      if (top) backend_.to_host(result.logprobs.top_ids, top_ids.data()), backend_.to_host(result.logprobs.top, top_lp.data());
      out.logprobs.assign(batch.size(), std::nullopt);
      for (int64_t k = 0; k < L; ++k) {
        const size_t item = item_of_sample[size_t(rows[size_t(k)])];
        const int n = std::min(top, batch[item].logprobs);  // this row's own count of alternatives
        TokenLogprobs t;
        t.chosen = chosen[size_t(k)];
        t.top_ids.assign(top_ids.begin() + k * top, top_ids.begin() + k * top + n);
        t.top.assign(top_lp.begin() + k * top, top_lp.begin() + k * top + n);
        out.logprobs[item] = std::move(t);
      }
    }
  }
  if (std::any_of(batch.begin(), batch.end(), [](const BatchItem& b) { return b.return_logits; })) {
    out.logits.resize(size_t(result.logits.numel()));
    backend_.to_host(result.logits, out.logits.data());
  }
  for (size_t i = 0; i < batch.size(); ++i) seqs_[size_t(batch[i].seq)]->pos += int64_t(batch[i].tokens.size());
  return out;
}

std::pair<int, int64_t> Dsv4Model::fixed_shape(const std::vector<BatchItem>& batch) const {
  if (graph_mode_ == DecodeGraphs::Off || batch.empty()) return {0, 0};
  int64_t end = 0;
  for (auto& item : batch) {
    if (item.tokens.size() != 1 || item.seq < 0 || size_t(item.seq) >= seqs_.size() || !seqs_[size_t(item.seq)]->live)
      return {0, 0};  // a prefill chunk, or a bad item plan_step will name
    end = std::max(end, seqs_[size_t(item.seq)]->pos + 1);
  }
  int bucket = 0;
  for (int b : kDecodeBuckets)
    if (!bucket && size_t(b) >= batch.size()) bucket = b;
  const int64_t bound = std::max<int64_t>(1024, int64_t(std::bit_ceil(uint64_t(end))));
  if (!bucket || bound > config().max_position_embeddings) return {0, 0};
  return {bucket, bound};
}

StepOutput Dsv4Model::step(const std::vector<BatchItem>& batch) {
  if (auto [bucket, bound] = fixed_shape(batch); bucket) return step_fixed(batch, bucket, bound);
  StepPlan plan = plan_step(batch);
  StepResult r;
  try {
    r = run_step(plan);
  } catch (...) {
    release_step_plan(plan);
    throw;
  }
  return finish_step(plan, r, batch);
}

PlanRequest Dsv4Model::fixed_request(const std::vector<BatchItem>& batch, int bucket, int64_t bound, int64_t ahead) {
  const ModelConfig& c = config();
  PlanRequest rq = plan_request(batch, ahead);
  // Padding rows: token 0 at position 0 of a sequence that is never advanced (it completes no
  // compressed entry; its window is its own row), after the real rows, through the head too.
  if (pad_states_.empty())
    for (int l = 0; l < c.n_layers; ++l) pad_states_.push_back(make_layer_state(weights_->blocks[size_t(l)], *caches_[size_t(l)]));
  for (size_t s = batch.size(); s < size_t(bucket); ++s) {
    PlanRequest::Span sp{{0}, 0, {}};
    for (auto& st : pad_states_) sp.states.push_back(&st);
    rq.spans.push_back(std::move(sp));
  }
  rq.head_rows.clear();
  for (int r = 0; r < bucket; ++r) rq.head_rows.push_back(r);
  rq.context_capacity = bound;
  return rq;
}

StepOutput Dsv4Model::step_fixed(const std::vector<BatchItem>& batch, int bucket, int64_t bound) {
  const ModelConfig& c = config();
  PlanRequest rq = fixed_request(batch, bucket, bound);
  std::unique_ptr<DecodeGraph>& slot = graphs_[{bucket, bound}];
  if (!slot) slot = std::make_unique<DecodeGraph>();
  DecodeGraph& g = *slot;
  const bool recording = graph_mode_ == DecodeGraphs::Record && g.failures < 3;
  if (recording && g.warm_steps >= 1 && !g.descriptor.data) g.descriptor = backend_.alloc(DType::I32, {g.words});
  if (g.descriptor.data) rq.descriptor = g.descriptor;
  bool ahead = next_ && next_->bucket == bucket && next_->bound == bound && next_->seqs.size() == batch.size() &&
               (!rq.descriptor.data || next_->plan.descriptor.data == rq.descriptor.data);
  for (size_t i = 0; ahead && i < batch.size(); ++i)
    ahead = next_->seqs[i] == batch[i].seq && next_->pos[i] == seqs_[size_t(batch[i].seq)]->pos;
  StepPlan plan;
  if (ahead) {
    // Planned while the previous step ran: only the tokens and the sampling part are new.
    plan = std::move(next_->plan);
    next_.reset();
    std::vector<int32_t> tokens;
    for (auto& sp : rq.spans) tokens.push_back(sp.tokens[0]);
    replan_tokens(backend_, plan, tokens, c.hc_mult);
    replan_sampling(backend_, rq, plan);
    ++graph_stats_.planned_ahead;
  } else {
    drop_next_plan();
    plan = build_step_plan(backend_, rq);  // may grow cache pools: the epoch is read after
  }
  StepResult r;
  try {
    if (!recording || g.warm_steps < 2) {
      g.words = plan.descriptor_words;
      ++g.warm_steps;
      r.logits = run_forward(plan);
      ++graph_stats_.fixed_eager;
    } else {
      if (backend_.recording_epoch() != graphs_epoch_) {
        // Memory a recording addresses moved: every recording is stale.
        for (auto& [k, other] : graphs_) other->work.reset(), other->logits = Tensor{};
        graphs_epoch_ = backend_.recording_epoch();
      }
      if (!g.work) {
        backend_.begin_capture();
        try {
          g.logits = run_forward(plan);
          g.work = backend_.end_capture();
          ++graph_stats_.recorded;
        } catch (const std::exception& e) {
          try {
            (void)backend_.end_capture();
          } catch (...) {
          }
          g.logits = Tensor{};
          g.warm_steps = 1;  // the next step of this shape runs as called again, then records
          if (++g.failures == 3)
            log_info("warning: decode steps of {} sequences (positions < {}) could not be recorded; they run as called: {}",
                     bucket, bound, e.what());
        }
      }
      if (g.work) {
        backend_.replay(*g.work);
        r.logits = g.logits;
        ++graph_stats_.replayed;
      } else {
        r.logits = run_forward(plan);
        ++graph_stats_.fixed_eager;
      }
    }
    sample_head(plan, r);
  } catch (...) {
    release_step_plan(plan);
    throw;
  }
  // The step is enqueued: its scratch pages may go to the next plan (later work on the stream), and
  // the host plans the next step while the device runs this one, before the read-back waits.
  release_step_plan(plan);
  plan_next_step(batch, bucket);
  // Only the real rows are read back.
  r.logits.shape[0] = int64_t(batch.size());
  return finish_step(plan, r, batch);
}

StepPlan Dsv4Model::plan_block(const BlockWeights& block, LayerCaches& caches, LayerState& state,
                               const std::vector<int32_t>& tokens, int64_t pos0) {
  const ModelConfig& c = config();
  PlanRequest rq;
  rq.hc_mult = c.hc_mult;
  rq.window = c.window;
  rq.index_topk = c.index_topk;
  rq.layers.push_back({block.ratio, &caches});
  rq.spans.push_back({tokens, pos0, {&state}});
  return build_step_plan(backend_, rq);
}

Tensor Dsv4Model::head_logits(const Tensor& X, const HyperConnection& hc, const uint16_t* norm) {
  const ModelConfig& c = config();
  const Tensor h = backend_.hc_head(X, hc, c.hc_mult, float(c.norm_eps), float(c.hc_eps), norm);
  return backend_.logits(h, weights_->head, c.vocab_size);
}

Tensor Dsv4Model::run_block(const BlockWeights& block, const Tensor& X, const StepPlan& plan, size_t layer) {
  BlockOutput in;
  in.X = X;
  return settle(run_block_pending(block, std::move(in), plan, layer));
}

Tensor Dsv4Model::settle(BlockOutput out) {
  if (!out.y.data) return out.X;
  Tensor X = backend_.hc_post(out.y, out.Xa, out.post, out.comb);
  emit("hc_post_ffn", out.layer, X);
  return X;
}

Dsv4Model::BlockOutput Dsv4Model::run_block_pending(const BlockWeights& block, BlockOutput in, const StepPlan& plan,
                                                    size_t layer) {
  const ModelConfig& c = config();
  const int l = block.layer;
  const LayerPlan& lp = plan.layers.at(layer);
  DSV4_CHECK(lp.ratio == block.ratio, "run_block: layer {} planned with ratio {}, block has {}", l, lp.ratio, block.ratio);
  const float eps = float(c.norm_eps), hc_eps = float(c.hc_eps);
  // The previous block's last hc_post, if it is pending, goes with this block's first hc_pre.
  Tensor X, post, comb, x;
  if (in.y.data) {
    post = std::move(in.post), comb = std::move(in.comb);
    x = backend_.hc_post_pre(in.y, in.Xa, &X, block.hc_attn, c.hc_mult, c.hc_sinkhorn_iters, eps, hc_eps, &post, &comb,
                             block.attn_norm);
    emit("hc_post_ffn", in.layer, X);
  } else {
    X = std::move(in.X);
    x = backend_.hc_pre(X, block.hc_attn, c.hc_mult, c.hc_sinkhorn_iters, eps, hc_eps, &post, &comb, block.attn_norm);
  }
  Tensor a = attention(block, x, plan, lp);
  emit("attn_out", l, a);
  Tensor Xa;
  x = backend_.hc_post_pre(a, X, &Xa, block.hc_ffn, c.hc_mult, c.hc_sinkhorn_iters, eps, hc_eps, &post, &comb,
                           block.ffn_norm);
  emit("hc_post_attn", l, Xa);
  if (!split()) backend_.moe_begin(x, block.moe, float(c.swiglu_limit));  // the shared expert beside the router
  Routing r = backend_.route(x, block.moe, plan.tokens, c.n_active_experts, float(c.route_scale));
  Tensor m;
  if (!split()) {
    m = backend_.moe_experts(x, r, block.moe, float(c.swiglu_limit));
  } else {
    // Every rank routes alike and holds a part of each expert's product (tensor parallel) or
    // whole experts (expert parallel): the f32 per-pair partials are summed over the ranks, then
    // rounded and combined as the unsplit op does (docs/ARCHITECTURE.md "Tensor parallelism").
    Tensor partials = backend_.moe_expert_partials(x, r, block.moe, float(c.swiglu_limit));
    backend_.collective("all_reduce moe", partials, [&] { comm_->all_reduce_sum(partials); });
    m = backend_.moe_combine(partials, r);
  }
  emit("moe_out", l, m);
  BlockOutput out;
  out.y = std::move(m), out.Xa = std::move(Xa), out.post = std::move(post), out.comb = std::move(comb);
  out.layer = l;
  return out;
}

void Dsv4Model::compress_layer(const AttentionWeights& w, int ratio, const Tensor& x, const StepPlan& plan,
                               const LayerPlan& lp, const RopeTable& rope, std::vector<Tensor>& keep) {
  // Every projection of x the layer's compressors make (wkv and wgate; CSA: the indexer
  // compressor's too) in one call, then each compressor's update and cache write.
  const CompressorWeights &cw = w.compressor, &iw = w.indexer.compressor;
  std::vector<std::pair<const uint16_t*, int>> ws = {{cw.wkv, cw.coff * cw.head_dim}, {cw.wgate, cw.coff * cw.head_dim}};
  if (ratio == 4) ws.insert(ws.end(), {{iw.wkv, iw.coff * iw.head_dim}, {iw.wgate, iw.coff * iw.head_dim}});
  const std::vector<Tensor> p = backend_.linears_f32(x, ws, config().dim);
  compress(cw, p[0], p[1], plan, lp, false, rope, keep);
  if (ratio == 4) compress(iw, p[2], p[3], plan, lp, true, rope, keep);
}

void Dsv4Model::compress(const CompressorWeights& w, const Tensor& a, const Tensor& g, const StepPlan& plan,
                         const LayerPlan& lp, bool index_keys, const RopeTable& rope, std::vector<Tensor>& keep) {
  const ModelConfig& c = config();
  const int d = w.head_dim;
  // The entries this step completes, span by span, in one tensor (SPEC §3.4); a fixed-shape plan
  // pads it to its bound (entry id −1: not written).
  const int64_t e = lp.completed;
  StateSlots& states = index_keys ? lp.caches->index_compressor : lp.caches->compressor;
  Tensor pooled = backend_.compressor_update(a, g, plan.tables, index_keys ? lp.index_compressor_slots : lp.compressor_slots,
                                             e, lp.max_span_rows, w.ape, states.states());
  keep.insert(keep.end(), {a, g, pooled});
  if (!e) return;  // the states still took every row
  StepIndexArgs at;
  at.kind = StepIndexKind::CompressedPositions;
  at.step = &plan.tables;
  at.compressed = index_keys ? lp.keys : lp.compressed;
  at.ratio = w.ratio;
  at.count = e;
  StepIndexArgs entries = at;
  entries.kind = StepIndexKind::CompressedEntries;
  const std::vector<Tensor> idx = backend_.step_index_sets({at, entries});
  const Tensor &entry_pos = idx[0], &ids = idx[1];  // entry j starts at position ratio·j
  Tensor u = backend_.to_bf16(pooled);  // (between: norm_rope may read entry_pos before the op ahead ends)
  backend_.norm_rope(u, d, w.norm, float(c.norm_eps), c.rope_dim, entry_pos, rope, !w.rotate);
  if (w.rotate) backend_.hadamard_fp4_simulate(u, d);
  backend_.write_entries(u, ids, index_keys ? lp.caches->keys.pool() : lp.caches->kv.pool());
  keep.insert(keep.end(), {entry_pos, ids, u});
}

Tensor Dsv4Model::attention(const BlockWeights& block, const Tensor& x, const StepPlan& plan, const LayerPlan& lp) {
  const ModelConfig& c = config();
  const AttentionWeights& w = block.attn;
  const int l = block.layer, H = w.n_heads, hd = c.head_dim, win = c.window;  // H: this rank's heads
  const float eps = float(c.norm_eps);
  const RopeTable& rope = block.ratio ? rope_yarn_ : rope_plain_;
  const int64_t T = x.rows();
  const Tensor& positions = plan.tables.positions;
  EntryPool& kv_pool = lp.caches->kv.pool();

  // At decode sizes three pieces of the layer run as a branch beside the query path (Backend::
  // branch_begin; each is a chain of latency-bound kernels), joined where the indexer or attention
  // first reads what they write; `keep` holds the branch's tensors until then:
  //  - the compressors, which read only x and the step's tables (SPEC §3.4), and in CSA, first, the
  //    indexer's head weights, which read only x (behind the compressors they were the branch's
  //    last launches, and the indexer waited for them);
  //  - the KV row's norm and RoPE, the layer's index tables and the row's cache write, which read
  //    only wkv's output and the tables, beside q's norm, wq_b and q's norm and RoPE. In CSA the KV
  //    row's norm and write wait for the indexer's join and run beside the indexer's top-k instead:
  //    the indexer reads the index tables but not the KV row, and behind the compressors in the branch
  //    the row's kernels held it back by ~7 µs at one token (docs/perf/2026-12-06-attention-cluster.md).
  //    CSA's index tables are made on the main chain after the indexer query's Hadamard, where it
  //    waits for the compressors' branch anyway (docs/perf/2026-12-06-kv-row-placement.md).
  const bool beside = T <= kBranchMaxRows;
  std::vector<Tensor> keep;
  // CSA: the indexer's head weights, scaled (SPEC §3.5).
  const int Hi = c.index_n_heads, id = c.index_head_dim;
  const auto head_weights = [&] {
    Tensor h = backend_.linear_bf16(x, w.indexer.weights_proj, Hi, c.dim);
    keep.push_back(h);
    return backend_.scale(h, float(std::pow(double(id), -0.5) * std::pow(double(Hi), -0.5)));
  };
  Tensor hw;
  if (beside && block.ratio) {
    backend_.branch_begin();
    if (block.ratio == 4) hw = head_weights();
    compress_layer(w, block.ratio, x, plan, lp, rope, keep);
    backend_.branch_end();
  } else if (block.ratio) {
    compress_layer(w, block.ratio, x, plan, lp, rope, keep);
  }
  bool joined = !beside;
  const auto join_branch = [&] {
    if (!joined) backend_.branch_join();
    joined = true;
    keep.clear();
  };

  std::vector<Tensor> qa_kv = backend_.linears(x, {&w.wq_a, &w.wkv});
  Tensor kv = std::move(qa_kv[1]);
  // This step's new entries go to scratch pages first: a query sees the new entries of its own
  // chunk before the ring is updated (a chunk may be longer than the window).
  // The layer's index tables depend only on the step's tables: one call makes them (with the
  // indexer, the lists wait for its top-k).
  StepIndexArgs ix;
  ix.step = &plan.tables;
  ix.window = lp.window;
  ix.compressed = lp.compressed;
  ix.scratch = lp.scratch;
  ix.ratio = block.ratio;
  ix.window_size = win;
  StepIndexArgs ring = ix, li = ix, kc = ix;
  ring.kind = StepIndexKind::RingSlots;
  li.kind = StepIndexKind::AttentionLists;
  li.count = lp.comp_len;
  kc.kind = StepIndexKind::KeyCounts;
  const bool kv_beside_indexer = beside && block.ratio == 4;
  std::vector<Tensor> idx;  // new entries, ring slots, lists (CSA: key counts)
  const auto index_tables = [&] { idx = backend_.step_index_sets({ix, ring, block.ratio == 4 ? kc : li}); };
  if (!kv_beside_indexer) {
    if (beside) backend_.branch_begin();
    backend_.norm_rope(kv, hd, w.kv_norm, eps, c.rope_dim, positions, rope, true);
    index_tables();
    backend_.write_entries(kv, idx[0], kv_pool);
    if (beside) backend_.branch_end();
  }

  Tensor qr = backend_.rms_norm(qa_kv[0], w.q_norm, eps);
  // With the indexer (CSA), its query projection reads qr too: both in one call.
  std::vector<const LinearWeight*> q_weights = {&w.wq_b};
  if (block.ratio == 4) q_weights.push_back(&w.indexer.wq_b);
  std::vector<Tensor> qs = backend_.linears(qr, q_weights);
  Tensor q = view(qs[0], {T, H, hd});
  backend_.head_norm_rope(q, hd, eps, c.rope_dim, positions, rope);
  emit("q", l, q);

  // Indexer (CSA): choose compressed entries per query (SPEC §3.5).
  Tensor topk;
  if (block.ratio == 4) {
    Tensor qi = view(qs[1], {T, Hi, id});
    backend_.rope(qi, id, c.rope_dim, positions, rope, false);
    backend_.hadamard_fp4_simulate(qi, id);
    if (kv_beside_indexer) index_tables();
    if (!beside) hw = head_weights();
    join_branch();
    if (kv_beside_indexer) {
      backend_.branch_begin();
      backend_.norm_rope(kv, hd, w.kv_norm, eps, c.rope_dim, positions, rope, true);
      backend_.write_entries(kv, idx[0], kv_pool);
      backend_.branch_end();
      joined = false;
    }
    KeyTables keys{lp.keys, plan.tables.row_span, idx[2], std::max(lp.max_keys, 1)};
    topk = backend_.indexer_topk(qi, hw, Hi, lp.caches->keys.pool(), keys, c.index_topk);
    emit("index_topk", l, topk);
    // Joined here rather than just before the attention: a join there (an edge into the attention's
    // plan kernel) left its maximum pass ~5 µs slower (docs/perf/2026-12-06-attention-cluster.md, run 6).
    join_branch();
  }

  // Per-query entry lists: the window (oldest first, −1 padded to `win`), then the compressed part.
  Tensor lists = idx[2];
  if (block.ratio == 4) {
    li.topk = &topk;
    lists = backend_.step_indices(li);
  }
  const float scale = float(1.0 / std::sqrt(double(hd)));
  join_branch();
  emit("kv", l, kv);
  Tensor o = backend_.sparse_attention(q, H, hd, kv_pool, lists, w.sink, scale);

  // The ring keeps the last `win` positions of every sequence.
  backend_.copy_entries(idx[0], idx[1], kv_pool);

  backend_.rope(o, hd, c.rope_dim, positions, rope, true);  // de-rotate by the query position
  emit("attn_core", l, o);
  Tensor z = backend_.grouped_out_proj(view(o, {T, int64_t(H) * hd}), w.wo_a, w.o_groups, c.o_lora_rank);
  if (!split()) return backend_.linear(z, w.wo_b);
  // Row-parallel wo_b: the ranks' f32 sums are added, then rounded to bf16 once, as linear rounds.
  Tensor y = backend_.linear_partial(z, w.wo_b);
  backend_.collective("all_reduce attn.wo_b", y, [&] { comm_->all_reduce_sum(y); });
  return backend_.to_bf16(y);
}

Tensor Dsv4Model::mtp_logits(const Tensor& X, const std::vector<int32_t>& next_tokens, const std::vector<int32_t>& positions) {
  const ModelConfig& c = config();
  DSV4_CHECK(!weights_->mtp.empty(), "the checkpoint has no MTP block");
  const MtpWeights& m = weights_->mtp[0];
  const int64_t T = int64_t(next_tokens.size());
  const float eps = float(c.norm_eps);
  for (size_t i = 1; i < positions.size(); ++i)
    DSV4_CHECK(positions[i] == positions[0] + int32_t(i), "mtp_logits: positions must be consecutive");
  LayerCaches& caches = *caches_[size_t(m.block.layer)];
  LayerState st = make_layer_state(m.block, caches);
  StepPlan plan = plan_block(m.block, caches, st, next_tokens, positions.empty() ? 0 : positions[0]);
  // Xm[j] = e_proj(enorm(embed(next))) + h_proj(hnorm(X[j])) per stream (SPEC §3.9); the
  // embedding side is computed per stream row (row-wise ops: the same value on every stream).
  Tensor e = backend_.linear(backend_.rms_norm(backend_.embed(plan.stream_tokens, weights_->embed, c.dim), m.enorm, eps), m.e_proj);
  Tensor hs = backend_.linear(backend_.rms_norm(view(X, {T * c.hc_mult, c.dim}), m.hnorm, eps), m.h_proj);
  Tensor Xm = view(backend_.add(e, hs), {T, c.hc_mult, c.dim});
  Tensor Xo = run_block(m.block, Xm, plan, 0);
  release_step_plan(plan);
  release_layer_state(st, caches);
  return head_logits(Xo, m.hc_head, m.norm);
}

}  // namespace dsv4
