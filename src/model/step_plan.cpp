#include "model/step_plan.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4 {

namespace {
int64_t pages_for(int64_t entries) { return (entries + kPageEntries - 1) / kPageEntries; }

// The descriptor under construction: I32 words, and where each section starts.
struct Words {
  std::vector<int32_t> w;
  size_t add(const int32_t* p, size_t n, size_t align = 1) {
    while (w.size() % align) w.push_back(0);
    const size_t at = w.size();
    w.insert(w.end(), p, p + n);
    return at;
  }
  size_t add(const std::vector<int32_t>& v) { return add(v.data(), v.size()); }
  size_t add_bytes(const void* p, size_t bytes) {  // 8-byte aligned (SamplingParams, U64)
    return add(static_cast<const int32_t*>(p), bytes / 4, 2);
  }
};

Tensor view(const Tensor& base, size_t word, DType dtype, std::vector<int64_t> shape) {
  Tensor v = base;
  v.dtype = dtype;
  v.shape = std::move(shape);
  v.data = base.ptr<int32_t>() + word;
  return v;
}

// A block table [S, width] of one kind of page list, padded with page 0 (never read: every
// index the ops derive stays below the span's own entry count). width 0: the longest list's.
std::vector<int32_t> table(const std::vector<const std::vector<int32_t>*>& lists, int64_t& width) {
  if (!width) {
    width = 1;
    for (auto* l : lists) width = std::max<int64_t>(width, int64_t(l->size()));
  }
  std::vector<int32_t> t(lists.size() * size_t(width), 0);
  for (size_t s = 0; s < lists.size(); ++s) {
    DSV4_CHECK(int64_t(lists[s]->size()) <= width, "step plan: span {} holds {} pages, the plan's tables {}", s,
               lists[s]->size(), width);
    std::copy(lists[s]->begin(), lists[s]->end(), t.begin() + int64_t(s) * width);
  }
  return t;
}

void check_sampling(const PlanRequest& rq) {
  for (int32_t r : rq.sample_rows) DSV4_CHECK(r >= 0 && r < int64_t(rq.head_rows.size()), "step plan: sample row {}", r);
  DSV4_CHECK(rq.sample_params.size() == rq.sample_rows.size() && rq.sample_counters.size() == rq.sample_rows.size(),
             "step plan: {} sample rows, {} parameter sets, {} counters", rq.sample_rows.size(), rq.sample_params.size(),
             rq.sample_counters.size());
  const bool penalties = !rq.penalty_ids.empty();
  DSV4_CHECK(rq.penalty_rows.size() == rq.penalty_ids.size() && rq.penalty_counts.size() == rq.penalty_ids.size() &&
                 (!penalties || rq.penalty_params.size() == rq.sample_rows.size()),
             "step plan: penalty entries inconsistent");
  for (int32_t r : rq.penalty_rows) DSV4_CHECK(r >= 0 && r < int32_t(rq.sample_rows.size()), "step plan: penalty row {}", r);
  for (int32_t r : rq.logprob_rows) DSV4_CHECK(r >= 0 && r < int32_t(rq.sample_rows.size()), "step plan: logprob row {}", r);
}

// Where each section of the sampling part starts (words from the part's own start).
struct SamplingWords {
  size_t sample, params, counters, pparams, prows, pids, pcounts, lrows;
};

SamplingWords add_sampling_words(Words& d, const PlanRequest& rq) {
  const bool penalties = !rq.penalty_ids.empty();
  SamplingWords at;
  at.sample = d.add(rq.sample_rows);
  at.params = d.add_bytes(rq.sample_params.data(), rq.sample_params.size() * sizeof(SamplingParams));
  at.counters = d.add_bytes(rq.sample_counters.data(), rq.sample_counters.size() * 8);
  at.pparams = d.add_bytes(rq.penalty_params.data(), penalties ? rq.penalty_params.size() * sizeof(PenaltyParams) : 0);
  at.prows = d.add(rq.penalty_rows), at.pids = d.add(rq.penalty_ids), at.pcounts = d.add(rq.penalty_counts);
  at.lrows = d.add(rq.logprob_rows);
  return at;
}

// The plan's sampling views into plan.sampling.
void set_sampling_views(StepPlan& plan, const PlanRequest& rq, const SamplingWords& at) {
  const bool penalties = !rq.penalty_ids.empty();
  auto sview = [&](size_t word, DType dtype, std::vector<int64_t> shape) { return view(plan.sampling, word, dtype, std::move(shape)); };
  plan.sample_rows = sview(at.sample, DType::I32, {int64_t(rq.sample_rows.size())});
  plan.sample_all_rows = rq.sample_rows.size() == rq.head_rows.size();
  for (size_t i = 0; i < rq.sample_rows.size() && plan.sample_all_rows; ++i) plan.sample_all_rows = rq.sample_rows[i] == int32_t(i);
  plan.sample_params = sview(at.params, DType::U8, {int64_t(rq.sample_params.size() * sizeof(SamplingParams))});
  plan.sample_counters = sview(at.counters, DType::U8, {int64_t(rq.sample_counters.size() * 8)});
  plan.penalties = penalties;
  const int64_t np = int64_t(rq.penalty_ids.size());
  plan.penalty_params = sview(at.pparams, DType::U8, {penalties ? int64_t(rq.penalty_params.size() * sizeof(PenaltyParams)) : 0});
  plan.penalty_rows = sview(at.prows, DType::I32, {np});
  plan.penalty_ids = sview(at.pids, DType::I32, {np});
  plan.penalty_counts = sview(at.pcounts, DType::I32, {np});
  plan.logprob_rows = sview(at.lrows, DType::I32, {int64_t(rq.logprob_rows.size())});
  plan.top_logprobs = rq.top_logprobs;
}
}  // namespace

StepPlan build_step_plan(Backend& be, const PlanRequest& rq) {
  StepPlan plan;
  const size_t S = rq.spans.size();
  const int64_t cap = rq.context_capacity;
  std::vector<int32_t> tokens, positions, row_span, spans;
  for (size_t s = 0; s < S; ++s) {
    const auto& sp = rq.spans[s];
    DSV4_CHECK(sp.states.size() == rq.layers.size(), "step plan: span {} has {} layer states for {} layers", s,
               sp.states.size(), rq.layers.size());
    DSV4_CHECK(!cap || sp.pos0 + int64_t(sp.tokens.size()) <= cap, "step plan: span {} ends at {}, past the plan's bound {}",
               s, sp.pos0 + int64_t(sp.tokens.size()), cap);
    plan.spans.push_back({int64_t(tokens.size()), int64_t(sp.tokens.size()), sp.pos0});
    spans.insert(spans.end(), {int32_t(tokens.size()), int32_t(sp.tokens.size()), int32_t(sp.pos0)});
    for (size_t i = 0; i < sp.tokens.size(); ++i) {
      tokens.push_back(sp.tokens[i]);
      positions.push_back(int32_t(sp.pos0 + int64_t(i)));
      row_span.push_back(int32_t(s));
    }
  }
  const int64_t T = int64_t(tokens.size());
  plan.rows = T;
  for (int32_t r : rq.head_rows) DSV4_CHECK(r >= 0 && r < T, "step plan: head row {} of {}", r, T);
  check_sampling(rq);

  // The forward's part: rows and spans, then per layer its tables.
  Words d;
  const size_t at_pos = d.add(positions), at_span_of = d.add(row_span), at_spans = d.add(spans), at_tokens = d.add(tokens);
  std::vector<int32_t> stream_tokens;
  for (int32_t t : tokens) stream_tokens.insert(stream_tokens.end(), size_t(rq.hc_mult), t);
  const size_t at_streams = d.add(stream_tokens), at_head = d.add(rq.head_rows);

  // Pages: every entry the step completes gets its page now (SPEC §3.4: entry j completes at
  // position ratio·(j+1) − 1), and each layer takes scratch pages for the step's new entries.
  struct LayerWords {
    size_t window, compressed, keys, scratch, slots, index_slots;
    int64_t ww, cw, kw;
  };
  std::vector<LayerWords> lw;
  for (const auto& layer : rq.layers) {
    LayerPlan lp;
    lp.ratio = layer.ratio;
    lp.caches = layer.caches;
    const size_t li = plan.layers.size();
    std::vector<const std::vector<int32_t>*> win, comp, keys;
    std::vector<int32_t> slots, index_slots;
    for (size_t s = 0; s < S; ++s) {
      LayerState& st = *rq.spans[s].states[li];
      const int64_t n = plan.spans[s].n, end = plan.spans[s].pos0 + n;
      lp.max_span_rows = std::max(lp.max_span_rows, n);
      if (layer.ratio) {
        const int64_t have = end / layer.ratio;
        DSV4_CHECK(st.n_comp == plan.spans[s].pos0 / layer.ratio, "step plan: span {} holds {} compressed entries at position {}",
                   s, st.n_comp, plan.spans[s].pos0);
        // n consecutive positions complete at most n / ratio + 1 entries (and at most n).
        lp.completed += cap ? std::min(n, n / layer.ratio + 1) : have - st.n_comp;
        while (int64_t(st.comp_pages.size()) < pages_for(have)) st.comp_pages.push_back(layer.caches->kv.alloc());
        st.n_comp = have;
        if (layer.ratio == 4) {
          while (int64_t(st.key_pages.size()) < pages_for(have)) st.key_pages.push_back(layer.caches->keys.alloc());
          st.n_keys = have;
          lp.max_keys = std::max<int>(lp.max_keys, int(have));
        }
        lp.comp_len = layer.ratio == 4 ? rq.index_topk : std::max<int64_t>(lp.comp_len, have);
      }
      lp.states.push_back(&st);
      win.push_back(&st.window_pages);
      comp.push_back(&st.comp_pages);
      keys.push_back(&st.key_pages);
      slots.push_back(st.compressor_slot);
      index_slots.push_back(st.index_compressor_slot);
    }
    LayerWords w{};
    if (cap) {
      w.ww = pages_for(rq.window);
      w.cw = layer.ratio ? std::max<int64_t>(1, pages_for(cap / layer.ratio)) : 1;
      w.kw = layer.ratio == 4 ? w.cw : 1;
      if (layer.ratio == 4) lp.max_keys = int(cap / 4);
      if (layer.ratio == 128) lp.comp_len = cap / 128;
    }
    for (int64_t p = 0; p < pages_for(T); ++p) lp.scratch_pages.push_back(layer.caches->kv.alloc());
    w.window = d.add(table(win, w.ww));
    w.compressed = d.add(table(comp, w.cw));
    w.keys = d.add(table(keys, w.kw));
    w.scratch = d.add(lp.scratch_pages);
    w.slots = d.add(slots);
    w.index_slots = d.add(index_slots);
    lw.push_back(w);
    plan.layers.push_back(std::move(lp));
  }

  // The sampling part (its words counted from its own start).
  while (d.w.size() % 2) d.w.push_back(0);  // the sampling part's 8-byte alignment holds in either upload
  const size_t forward_words = d.w.size();
  Words sw;
  const SamplingWords at = add_sampling_words(sw, rq);

  plan.descriptor_words = int64_t(forward_words);
  if (rq.descriptor.data) {
    DSV4_CHECK(rq.descriptor.dtype == DType::I32 && rq.descriptor.numel() == int64_t(forward_words),
               "step plan: a descriptor buffer of {} words for a plan of {}", rq.descriptor.numel(), forward_words);
    plan.descriptor = rq.descriptor;
    be.upload(plan.descriptor, d.w.data());
    plan.sampling = be.from_host(DType::I32, {int64_t(sw.w.size())}, sw.w.data());
  } else {
    d.w.insert(d.w.end(), sw.w.begin(), sw.w.end());
    plan.descriptor = be.from_host(DType::I32, {int64_t(d.w.size())}, d.w.data());
    plan.sampling = view(plan.descriptor, forward_words, DType::I32, {int64_t(sw.w.size())});
  }
  set_sampling_views(plan, rq, at);
  const Tensor& b = plan.descriptor;
  plan.tables.positions = view(b, at_pos, DType::I32, {T});
  plan.tables.row_span = view(b, at_span_of, DType::I32, {T});
  plan.tables.spans = view(b, at_spans, DType::I32, {int64_t(S), 3});
  plan.tokens = view(b, at_tokens, DType::I32, {T});
  plan.stream_tokens = view(b, at_streams, DType::I32, {T * rq.hc_mult});
  plan.head_rows = view(b, at_head, DType::I32, {int64_t(rq.head_rows.size())});
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    LayerPlan& lp = plan.layers[l];
    lp.window = view(b, lw[l].window, DType::I32, {int64_t(S), lw[l].ww});
    lp.compressed = view(b, lw[l].compressed, DType::I32, {int64_t(S), lw[l].cw});
    lp.keys = view(b, lw[l].keys, DType::I32, {int64_t(S), lw[l].kw});
    lp.scratch = view(b, lw[l].scratch, DType::I32, {int64_t(lp.scratch_pages.size())});
    lp.compressor_slots = view(b, lw[l].slots, DType::I32, {int64_t(S)});
    lp.index_compressor_slots = view(b, lw[l].index_slots, DType::I32, {int64_t(S)});
  }
  return plan;
}

void replan_tokens(Backend& be, StepPlan& plan, const std::vector<int32_t>& tokens, int hc_mult) {
  const int64_t T = plan.rows;
  DSV4_CHECK(int64_t(tokens.size()) == T, "step plan: {} tokens for a plan of {} rows", tokens.size(), T);
  // The token ids and their stream copies are one run of words (build_step_plan adds them in turn).
  DSV4_CHECK(plan.stream_tokens.ptr<int32_t>() == plan.tokens.ptr<int32_t>() + T && plan.stream_tokens.numel() == T * hc_mult,
             "step plan: token words not laid out as planned");
  std::vector<int32_t> words(tokens);
  for (int32_t t : tokens) words.insert(words.end(), size_t(hc_mult), t);
  Tensor run = plan.tokens;
  run.shape = {T * (1 + hc_mult)};
  be.upload(run, words.data());
}

void replan_sampling(Backend& be, const PlanRequest& rq, StepPlan& plan) {
  DSV4_CHECK(int64_t(rq.head_rows.size()) == plan.head_rows.numel(), "step plan: {} head rows for a plan of {}",
             rq.head_rows.size(), plan.head_rows.numel());
  check_sampling(rq);
  Words sw;
  const SamplingWords at = add_sampling_words(sw, rq);
  plan.sampling = be.from_host(DType::I32, {int64_t(sw.w.size())}, sw.w.data());
  set_sampling_views(plan, rq, at);
}

void release_step_plan(StepPlan& plan) {
  for (auto& lp : plan.layers) {
    for (int32_t p : lp.scratch_pages) lp.caches->kv.free(p);
    lp.scratch_pages.clear();
  }
}

}  // namespace dsv4
