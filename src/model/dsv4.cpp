// The DeepSeek-V4 forward, SPEC §3, over a batch of sequences. Only backend ops touch tensor data.
#include "model/dsv4.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

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

Dsv4Model::Dsv4Model(std::unique_ptr<ModelWeights> weights, Backend& backend)
    : weights_(std::move(weights)), backend_(backend) {
  const ModelConfig& c = config();
  rope_plain_ = make_rope_table(c, false);
  rope_yarn_ = make_rope_table(c, true);
  for (RopeTable* t : {&rope_plain_, &rope_yarn_})
    t->device = static_cast<const float*>(backend_.place_weight(t->inv_freq.data(), t->inv_freq.size() * 4));
  for (int l = 0; l < c.total_layers(); ++l) caches_.push_back(std::make_unique<LayerCaches>(backend_));
}

Dsv4Model::~Dsv4Model() = default;

LayerState Dsv4Model::make_layer_state(const BlockWeights& block, LayerCaches& caches) {
  const ModelConfig& c = config();
  LayerState s;
  for (int p = 0; p < (c.window + kPageEntries - 1) / kPageEntries; ++p) s.window_pages.push_back(caches.kv.alloc());
  if (block.ratio) backend_.compressor_state_init(s.compressor, block.ratio, c.head_dim);
  if (block.ratio == 4) backend_.compressor_state_init(s.index_compressor, 4, c.index_head_dim);
  return s;
}

void Dsv4Model::release_layer_state(LayerState& s, LayerCaches& caches) {
  for (auto p : s.window_pages) caches.kv.free(p);
  for (auto p : s.comp_pages) caches.kv.free(p);
  for (auto p : s.key_pages) caches.keys.free(p);
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
  Sequence& s = *seqs_[size_t(id)];
  for (int l = 0; l < config().n_layers; ++l) release_layer_state(s.layers[size_t(l)], *caches_[size_t(l)]);
  s.live = false;
}

int64_t Dsv4Model::position(SeqId id) const { return seqs_.at(size_t(id))->pos; }

Tensor Dsv4Model::embed_streams(const std::vector<int32_t>& tokens) {
  const ModelConfig& c = config();
  Tensor e = backend_.embed(tokens, weights_->embed, c.dim);
  const int64_t T = int64_t(tokens.size());
  Tensor X = backend_.alloc(DType::BF16, {T, c.hc_mult, c.dim});
  Tensor rows = view(X, {T * c.hc_mult, c.dim});
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < c.hc_mult; ++j) backend_.copy_rows(e, t, rows, t * c.hc_mult + j, 1);
  return X;
}

StepOutput Dsv4Model::step(const std::vector<BatchItem>& batch) {
  const ModelConfig& c = config();
  StepRows rows;
  std::vector<Sequence*> seqs;
  for (auto& item : batch) {
    DSV4_CHECK(item.seq >= 0 && size_t(item.seq) < seqs_.size() && seqs_[size_t(item.seq)]->live, "step: no sequence {}", item.seq);
    DSV4_CHECK(!item.tokens.empty(), "step: sequence {} has no tokens", item.seq);
    for (auto& s : seqs) DSV4_CHECK(s != seqs_[size_t(item.seq)].get(), "step: sequence {} appears twice", item.seq);
    Sequence& s = *seqs_[size_t(item.seq)];
    DSV4_CHECK(s.pos + int64_t(item.tokens.size()) <= c.max_position_embeddings,
               "step: sequence {} would reach position {}, beyond max_position_embeddings {}", item.seq,
               s.pos + int64_t(item.tokens.size()), c.max_position_embeddings);
    seqs.push_back(&s);
    rows.spans.push_back({nullptr, int64_t(rows.tokens.size()), int64_t(item.tokens.size()), s.pos});
    for (size_t i = 0; i < item.tokens.size(); ++i) {
      DSV4_CHECK(item.tokens[i] >= 0 && item.tokens[i] < c.vocab_size, "step: token id {} outside the vocabulary (0..{})",
                 item.tokens[i], c.vocab_size - 1);
      rows.tokens.push_back(item.tokens[i]);
      rows.positions.push_back(int32_t(s.pos + int64_t(i)));
    }
  }
  Tensor X = embed_streams(rows.tokens);
  emit("embed_out", 0, X);
  for (int l = 0; l < c.n_layers; ++l) {
    for (size_t i = 0; i < seqs.size(); ++i) rows.spans[i].state = &seqs[i]->layers[size_t(l)];
    X = run_block(weights_->blocks[size_t(l)], *caches_[size_t(l)], X, rows);
  }
  // Only the rows whose logits were asked for go through the head.
  StepOutput out;
  out.vocab = c.vocab_size;
  std::vector<int64_t> pick;
  for (size_t i = 0; i < batch.size(); ++i) {
    out.row_of.push_back(int64_t(pick.size()));
    const auto& sp = rows.spans[i];
    for (int64_t r = batch[i].all_logits ? 0 : sp.n - 1; r < sp.n; ++r) pick.push_back(sp.row0 + r);
  }
  Tensor Xp = backend_.alloc(DType::BF16, {int64_t(pick.size()), c.hc_mult, c.dim});
  for (size_t i = 0; i < pick.size(); ++i) backend_.copy_rows(X, pick[i], Xp, int64_t(i), 1);
  Tensor logits = head_logits(Xp, weights_->hc_head, weights_->norm);
  // Sampling reads each sampling item's last logits row, on the backend.
  std::vector<SamplingParams> params;
  std::vector<uint64_t> counters;
  std::vector<int64_t> sample_rows;
  for (size_t i = 0; i < batch.size(); ++i)
    if (batch[i].sampling) {
      params.push_back(*batch[i].sampling);
      counters.push_back(batch[i].sample_counter);
      sample_rows.push_back(out.row_of[i] + (batch[i].all_logits ? rows.spans[i].n - 1 : 0));
    }
  out.tokens.assign(batch.size(), -1);
  if (!params.empty()) {
    Tensor last = backend_.alloc(DType::F32, {int64_t(params.size()), c.vocab_size});
    for (size_t j = 0; j < sample_rows.size(); ++j) backend_.copy_rows(logits, sample_rows[j], last, int64_t(j), 1);
    std::vector<const BatchItem*> sampled;
    for (const BatchItem& b : batch)
      if (b.sampling) sampled.push_back(&b);
    // Logprobs are of the raw rows (vLLM's default), so penalties rewrite `last` only after the
    // rows that need logprobs have been copied out.
    std::vector<int64_t> logprob_rows;
    int top_n = 0;
    for (size_t j = 0; j < sampled.size(); ++j)
      if (sampled[j]->logprobs >= 0) logprob_rows.push_back(int64_t(j)), top_n = std::max(top_n, sampled[j]->logprobs);
    Tensor raw;
    if (!logprob_rows.empty()) {
      raw = backend_.alloc(DType::F32, {int64_t(logprob_rows.size()), c.vocab_size});
      for (size_t k = 0; k < logprob_rows.size(); ++k) backend_.copy_rows(last, logprob_rows[k], raw, int64_t(k), 1);
    }
    if (std::any_of(sampled.begin(), sampled.end(), [](const BatchItem* b) { return b->penalty_tokens != nullptr; })) {
      std::vector<PenaltyParams> penalties;
      std::vector<const PenaltyTokens*> penalty_tokens;
      for (const BatchItem* b : sampled) penalties.push_back(b->penalties), penalty_tokens.push_back(b->penalty_tokens);
      backend_.apply_penalties(last, penalties, penalty_tokens);
    }
    std::vector<int32_t> picked = backend_.sample(last, params, counters);
    for (size_t i = 0, j = 0; i < batch.size(); ++i)
      if (batch[i].sampling) out.tokens[i] = picked[j++];
    if (!logprob_rows.empty()) {
      std::vector<int32_t> chosen;
      for (int64_t j : logprob_rows) chosen.push_back(picked[size_t(j)]);
      std::vector<TokenLogprobs> lp = backend_.logprobs(raw, chosen, top_n);
      out.logprobs.assign(batch.size(), std::nullopt);
      std::vector<size_t> item_of_sampled;
      for (size_t i = 0; i < batch.size(); ++i)
        if (batch[i].sampling) item_of_sampled.push_back(i);
      for (size_t k = 0; k < logprob_rows.size(); ++k) {
        TokenLogprobs& t = lp[k];
        const size_t n = size_t(sampled[size_t(logprob_rows[k])]->logprobs);  // this row's own top count
        t.top_ids.resize(std::min(n, t.top_ids.size()));
        t.top.resize(t.top_ids.size());
        out.logprobs[item_of_sampled[size_t(logprob_rows[k])]] = std::move(t);
      }
    }
  }
  if (std::any_of(batch.begin(), batch.end(), [](const BatchItem& b) { return b.return_logits; })) {
    out.logits.resize(size_t(logits.numel()));
    backend_.to_host(logits, out.logits.data());
  }
  for (size_t i = 0; i < seqs.size(); ++i) seqs[i]->pos += rows.spans[i].n;
  return out;
}

Tensor Dsv4Model::head_logits(const Tensor& X, const HyperConnection& hc, const uint16_t* norm) {
  const ModelConfig& c = config();
  Tensor h = backend_.hc_head(X, hc, c.hc_mult, float(c.norm_eps), float(c.hc_eps));
  h = backend_.rms_norm(h, norm, float(c.norm_eps));
  return backend_.logits(h, weights_->head, c.vocab_size);
}

Tensor Dsv4Model::run_block(const BlockWeights& block, LayerCaches& caches, const Tensor& X, const StepRows& rows) {
  const ModelConfig& c = config();
  const int l = block.layer;
  const float eps = float(c.norm_eps), hc_eps = float(c.hc_eps);
  Tensor post, comb;
  Tensor x = backend_.hc_pre(X, block.hc_attn, c.hc_mult, c.hc_sinkhorn_iters, eps, hc_eps, &post, &comb);
  x = backend_.rms_norm(x, block.attn_norm, eps);
  Tensor a = attention(block, caches, x, rows);
  emit("attn_out", l, a);
  Tensor Xa = backend_.hc_post(a, X, post, comb);
  emit("hc_post_attn", l, Xa);
  x = backend_.hc_pre(Xa, block.hc_ffn, c.hc_mult, c.hc_sinkhorn_iters, eps, hc_eps, &post, &comb);
  x = backend_.rms_norm(x, block.ffn_norm, eps);
  Tensor m = moe(block, x, rows);
  emit("moe_out", l, m);
  Tensor Xf = backend_.hc_post(m, Xa, post, comb);
  emit("hc_post_ffn", l, Xf);
  return Xf;
}

Tensor Dsv4Model::moe(const BlockWeights& block, const Tensor& x, const StepRows& rows) {
  const ModelConfig& c = config();
  Routing r = backend_.route(x, block.moe, rows.tokens, c.n_active_experts, float(c.route_scale));
  return backend_.moe_experts(x, r, block.moe, float(c.swiglu_limit));
}

void Dsv4Model::compress(const CompressorWeights& w, LayerCaches& caches, const Tensor& x, const StepRows& rows,
                         bool index_keys, const RopeTable& rope) {
  const ModelConfig& c = config();
  const int d = w.head_dim, width = w.coff * d;
  Tensor a = backend_.linear_f32(x, w.wkv, width, c.dim);
  Tensor g = backend_.linear_f32(x, w.wgate, width, c.dim);
  for (auto& sp : rows.spans) {
    LayerState& st = *sp.state;
    CompressorState& cs = index_keys ? st.index_compressor : st.compressor;
    Tensor pooled = backend_.compressor_update(a, g, sp.row0, sp.n, sp.pos0, w.ape, w.ratio, d, cs);
    if (pooled.rows() == 0) continue;
    // Entries completed by this chunk, in order; entry j starts at position ratio·j (SPEC §3.4).
    std::vector<int32_t> entry_pos;
    for (int64_t i = 0; i < sp.n; ++i)
      if ((sp.pos0 + i + 1) % w.ratio == 0) entry_pos.push_back(int32_t(sp.pos0 + i + 1 - w.ratio));
    Tensor u = backend_.rms_norm(backend_.to_bf16(pooled), w.norm, float(c.norm_eps));
    backend_.rope(u, d, c.rope_dim, entry_pos, rope, false);
    if (w.rotate) backend_.hadamard_fp4_simulate(u, d);
    else backend_.fp8_simulate(u, d, d - c.rope_dim);
    int64_t& count = index_keys ? st.n_keys : st.n_comp;
    std::vector<int32_t>& pages = index_keys ? st.key_pages : st.comp_pages;
    PagePool& pool = index_keys ? caches.keys : caches.kv;
    std::vector<int64_t> src_rows, ids;
    for (size_t e = 0; e < entry_pos.size(); ++e) {
      const int64_t j = entry_pos[e] / w.ratio;
      DSV4_CHECK(j == count, "compressor: entry {} out of order (have {})", j, count);
      while (int64_t(pages.size()) * kPageEntries <= j) pages.push_back(pool.alloc());
      src_rows.push_back(int64_t(e));
      ids.push_back(entry_id(pages, j));
      ++count;
    }
    backend_.write_entries(u, src_rows, ids, pool.pool());
  }
}

Tensor Dsv4Model::attention(const BlockWeights& block, LayerCaches& caches, const Tensor& x, const StepRows& rows) {
  const ModelConfig& c = config();
  const AttentionWeights& w = block.attn;
  const int l = block.layer, H = c.n_heads, hd = c.head_dim, win = c.window;
  const float eps = float(c.norm_eps);
  const RopeTable& rope = block.ratio ? rope_yarn_ : rope_plain_;
  const int64_t T = x.rows();

  Tensor qr = backend_.rms_norm(backend_.linear(x, w.wq_a), w.q_norm, eps);
  Tensor q = view(backend_.linear(qr, w.wq_b), {T, H, hd});
  backend_.head_rms_norm(q, hd, eps);
  backend_.rope(q, hd, c.rope_dim, rows.positions, rope, false);
  emit("q", l, q);
  Tensor kv = backend_.rms_norm(backend_.linear(x, w.wkv), w.kv_norm, eps);
  backend_.rope(kv, hd, c.rope_dim, rows.positions, rope, false);
  backend_.fp8_simulate(kv, hd, hd - c.rope_dim);
  emit("kv", l, kv);

  // This step's new entries go to scratch pages first: a query sees the new entries of its own
  // chunk before the ring is updated (a chunk may be longer than the window).
  std::vector<int32_t> scratch;
  for (int64_t p = 0; p < (T + kPageEntries - 1) / kPageEntries; ++p) scratch.push_back(caches.kv.alloc());
  {
    std::vector<int64_t> src(static_cast<size_t>(T)), ids(static_cast<size_t>(T));
    for (int64_t r = 0; r < T; ++r) src[size_t(r)] = r, ids[size_t(r)] = entry_id(scratch, r);
    backend_.write_entries(kv, src, ids, caches.kv.pool());
  }
  if (block.ratio) compress(w.compressor, caches, x, rows, false, rope);

  // Indexer (CSA): choose compressed entries per query (SPEC §3.5).
  Tensor topk;
  if (block.ratio == 4) {
    const IndexerWeights& iw = w.indexer;
    const int Hi = c.index_n_heads, id = c.index_head_dim;
    Tensor qi = view(backend_.linear(qr, iw.wq_b), {T, Hi, id});
    backend_.rope(qi, id, c.rope_dim, rows.positions, rope, false);
    backend_.hadamard_fp4_simulate(qi, id);
    Tensor hw = backend_.linear_bf16(x, iw.weights_proj, Hi, c.dim);
    hw = backend_.scale(hw, float(std::pow(double(id), -0.5) * std::pow(double(Hi), -0.5)));
    compress(iw.compressor, caches, x, rows, true, rope);
    int max_keys = 1;
    for (auto& sp : rows.spans) max_keys = std::max<int>(max_keys, int((sp.pos0 + sp.n) / 4));
    std::vector<int64_t> key_lists(size_t(T) * size_t(max_keys), -1);
    std::vector<int32_t> key_counts(static_cast<size_t>(T));
    for (auto& sp : rows.spans)
      for (int64_t i = 0; i < sp.n; ++i) {
        const int64_t r = sp.row0 + i, avail = (sp.pos0 + i + 1) / 4;
        key_counts[size_t(r)] = int32_t(avail);
        for (int64_t j = 0; j < avail; ++j) key_lists[size_t(r * max_keys + j)] = entry_id(sp.state->key_pages, j);
      }
    topk = backend_.indexer_topk(qi, hw, Hi, caches.keys.pool(), key_lists, key_counts, max_keys, c.index_topk);
    emit("index_topk", l, topk);
  }

  // Per-query entry lists: the window (oldest first, −1 padded to `win`), then the compressed part.
  int comp_len = 0;
  if (block.ratio == 4) comp_len = c.index_topk;
  if (block.ratio == 128)
    for (auto& sp : rows.spans) comp_len = std::max<int>(comp_len, int((sp.pos0 + sp.n) / 128));
  const int list_len = win + comp_len;
  std::vector<int64_t> lists(size_t(T) * size_t(list_len), -1);
  std::vector<int32_t> chosen;
  if (topk.data) {
    chosen.resize(size_t(topk.numel()));
    backend_.to_host(topk, chosen.data());
  }
  for (auto& sp : rows.spans) {
    const LayerState& st = *sp.state;
    for (int64_t i = 0; i < sp.n; ++i) {
      const int64_t r = sp.row0 + i, pos = sp.pos0 + i;
      int64_t* list = lists.data() + r * list_len;
      int slot = 0;
      for (int64_t p = std::max<int64_t>(0, pos - win + 1); p <= pos; ++p, ++slot)
        list[slot] = p >= sp.pos0 ? entry_id(scratch, sp.row0 + (p - sp.pos0)) : entry_id(st.window_pages, p % win);
      if (block.ratio == 4) {
        for (int k = 0; k < c.index_topk; ++k) {
          int32_t j = chosen[size_t(r) * size_t(c.index_topk) + size_t(k)];
          list[win + k] = j >= 0 ? entry_id(st.comp_pages, j) : -1;
        }
      } else if (block.ratio == 128) {
        for (int64_t j = 0; j < (pos + 1) / 128; ++j) list[win + j] = entry_id(st.comp_pages, j);
      }
    }
  }
  const float scale = float(1.0 / std::sqrt(double(hd)));
  Tensor o = backend_.sparse_attention(q, H, hd, caches.kv.pool(), lists, list_len, w.sink, scale);

  // The ring keeps the last `win` positions of every sequence.
  std::vector<int64_t> src, dst;
  for (auto& sp : rows.spans)
    for (int64_t i = std::max<int64_t>(0, sp.n - win); i < sp.n; ++i) {
      src.push_back(entry_id(scratch, sp.row0 + i));
      dst.push_back(entry_id(sp.state->window_pages, (sp.pos0 + i) % win));
    }
  backend_.copy_entries(src, dst, caches.kv.pool());
  for (auto p : scratch) caches.kv.free(p);

  backend_.rope(o, hd, c.rope_dim, rows.positions, rope, true);  // de-rotate by the query position
  emit("attn_core", l, o);
  Tensor z = backend_.grouped_out_proj(view(o, {T, int64_t(H) * hd}), w.wo_a, c.o_groups, c.o_lora_rank);
  return backend_.linear(z, w.wo_b);
}

Tensor Dsv4Model::mtp_logits(const Tensor& X, const std::vector<int32_t>& next_tokens, const std::vector<int32_t>& positions) {
  const ModelConfig& c = config();
  DSV4_CHECK(!weights_->mtp.empty(), "the checkpoint has no MTP block");
  const MtpWeights& m = weights_->mtp[0];
  const int64_t T = int64_t(next_tokens.size());
  const float eps = float(c.norm_eps);
  // Xm[j] = e_proj(enorm(embed(next))) + h_proj(hnorm(X[j])) per stream (SPEC §3.9).
  Tensor e = backend_.linear(backend_.rms_norm(backend_.embed(next_tokens, weights_->embed, c.dim), m.enorm, eps), m.e_proj);
  Tensor hs = backend_.linear(backend_.rms_norm(view(X, {T * c.hc_mult, c.dim}), m.hnorm, eps), m.h_proj);
  Tensor e_rows = backend_.alloc(DType::BF16, {T * c.hc_mult, c.dim});
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < c.hc_mult; ++j) backend_.copy_rows(e, t, e_rows, t * c.hc_mult + j, 1);
  Tensor Xm = view(backend_.add(e_rows, hs), {T, c.hc_mult, c.dim});
  LayerCaches& caches = *caches_[size_t(m.block.layer)];
  LayerState st = make_layer_state(m.block, caches);
  StepRows rows;
  rows.tokens = next_tokens;
  rows.positions = positions;
  rows.spans.push_back({&st, 0, T, positions.empty() ? 0 : positions[0]});
  Tensor Xo = run_block(m.block, caches, Xm, rows);
  release_layer_state(st, caches);
  return head_logits(Xo, m.hc_head, m.norm);
}

}  // namespace dsv4
