#include "model/weights.h"

#include <fmt/format.h>

#include <set>

#include "core/error.h"
#include "core/log.h"
#include "model/synthetic.h"

namespace dsv4 {

namespace {

// Looks tensors up by name in a source (a checkpoint, or the synthetic model's generator) and
// checks dtype and shape; remembers what was used. With a backend, every bound tensor is placed in
// backend memory (Backend::place_weight) as it is bound, and the structs point there; the routed
// experts keep their host views for Backend::prepare_experts.
class TensorBinder {
 public:
  TensorBinder(TensorSource& src, Backend* backend) : src_(src), backend_(backend) {}

  const TensorRef& get(const std::string& name, std::initializer_list<DType> dtypes, std::vector<int64_t> shape,
                       TensorUse use = TensorUse::Placed) {
    const TensorRef* t = src_.find(name, *dtypes.begin(), shape, backend_ ? use : TensorUse::HostRead);
    DSV4_CHECK(!t || !t->in_backend || use != TensorUse::HostRead, "{}: {} made in backend memory, read on the host",
               src_.where(), name);
    if (!t) fail("{}: tensor {} is missing (expected shape {})", src_.where(), name, shape_str(shape));
    bool ok = false;
    std::string want;
    for (auto d : dtypes) {
      ok |= t->dtype == d;
      want += (want.empty() ? "" : " or ") + std::string(dtype_name(d));
    }
    if (!ok) fail("{}: dtype {} expected, {} found in {}", name, want, dtype_name(t->dtype), t->file);
    if (t->shape != shape)
      fail("{}: shape {} expected, {} found in {}", name, shape_str(shape), shape_str(t->shape), t->file);
    if (used_.insert(name).second) bytes_ += double(t->nbytes);
    return *t;
  }
  // A window of a 2-D tensor made in backend memory (TensorSource::find_window), or nullptr.
  const TensorRef* get_window(const std::string& name, DType dtype, const std::vector<int64_t>& shape, TensorUse use,
                              const TensorSource::Window& w) {
    if (!backend_ || use == TensorUse::HostRead) return nullptr;
    const TensorRef* t = src_.find_window(name, dtype, shape, use, w);
    if (!t) return nullptr;
    DSV4_CHECK(t->in_backend && t->dtype == dtype && t->shape == (std::vector<int64_t>{w.rows, w.cols}),
               "{}: window of {} made as {} {}", src_.where(), name, dtype_name(t->dtype), shape_str(t->shape));
    if (used_.insert(name).second) bytes_ += double(t->nbytes);
    return t;
  }
  bool has(const std::string& name) const { return src_.has(name); }
  const void* place(const void* host, size_t bytes) {
    if (!backend_) return host;
    placed_bytes_ += double(bytes);
    const void* p = backend_->place_weight(host, bytes);
    copies_ |= p != host;
    return p;
  }
  // The backend keeps its own copies: host bytes bound so far may go once the layer is prepared.
  bool copies() const { return copies_; }
  TensorSource& source() { return src_; }
  double placed_bytes() const { return placed_bytes_; }
  void count_expert_bytes(const MoeWeights& m) {
    for (const auto& e : m.experts)
      for (const LinearWeight* l : {&e.w1, &e.w2, &e.w3})
        placed_bytes_ += double(l->out) * double(l->in) / 2 * (1.0 + 2.0 / (l->format == WeightFormat::NVFP4 ? 16 : 32));
  }
  const uint8_t* placed(const TensorRef& t) {
    if (t.in_backend) return placed_bytes_ += double(t.nbytes), t.data;  // made where it lives
    return static_cast<const uint8_t*>(place(t.data, t.nbytes));
  }
  const uint16_t* bf16(const std::string& name, std::vector<int64_t> shape) {
    return reinterpret_cast<const uint16_t*>(placed(get(name, {DType::BF16}, std::move(shape))));
  }
  const float* f32(const std::string& name, std::vector<int64_t> shape) {
    return reinterpret_cast<const float*>(placed(get(name, {DType::F32}, std::move(shape))));
  }
  // A scalar the loader itself reads (host view, not placed).
  float f32_scalar(const std::string& name) { return *get(name, {DType::F32}, {}, TensorUse::HostRead).as<float>(); }
  Backend* backend() const { return backend_; }
  const std::set<std::string>& used() const { return used_; }
  double bytes() const { return bytes_; }
  // Host bytes made here (a rank's column slices of a weight): ModelWeights keeps them alive.
  const uint8_t* keep(std::vector<uint8_t> bytes) {
    auto v = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
    kept_.push_back(v);
    return v->data();
  }
  std::vector<std::shared_ptr<void>> take_kept() { return std::move(kept_); }
  bool release_kept() {
    const bool any = !kept_.empty();
    kept_.clear();
    return any;
  }
  // Expert parallelism: the tensors under `prefix` ("layers.3.ffn.experts.7.") are another rank's,
  // not unused.
  void owned_elsewhere(std::string prefix) { elsewhere_.insert(std::move(prefix)); }
  bool is_elsewhere(const std::string& name) const {
    const size_t at = name.find(".ffn.experts.");
    if (at == std::string::npos || elsewhere_.empty()) return false;
    const size_t dot = name.find('.', at + 13);
    return dot != std::string::npos && elsewhere_.count(name.substr(0, dot + 1));
  }

 private:
  TensorSource& src_;
  Backend* backend_;
  bool copies_ = false;
  double placed_bytes_ = 0, bytes_ = 0;
  std::set<std::string> used_, elsewhere_;
  std::vector<std::shared_ptr<void>> kept_;
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A rank's part of one dimension of a weight: [begin, begin + count); count < 0 = all of it.
struct Span {
  int begin = 0, count = -1;
};

// One rank's share of a linear: rows `rows` of its output, columns `cols` of its input (tensor
// parallelism: an output slice is column-parallel, an input slice row-parallel). Whole rows are
// views into the source; a column slice is copied (the binder keeps the copy). Scale tensors are
// sliced with their weights, so a slice must cover whole scale blocks (parallel_layout_problem).
// Placed: in backend memory; Prepared: the views for Backend::prepare_experts (routed experts);
// HostRead: host views. A slice is made by the source in backend memory
// where it can (a generator: TensorSource::find_window), else cut on the host from the whole
// tensor; a whole tensor a generator made in backend memory is used where it is.
LinearWeight bind_linear(TensorBinder& b, const std::string& prefix, int out, int in, WeightFormat format,
                         TensorUse use = TensorUse::Placed, Span rows = {}, Span cols = {}) {
  const int r0 = rows.begin, nr = rows.count < 0 ? out : rows.count;
  const int c0 = cols.begin, nc = cols.count < 0 ? in : cols.count;
  // Tensor t stores the matrix with one stored row per `row_div` rows and one stored element (of
  // `elem_bytes`) per `col_div` columns.
  const bool sliced = nr != out || nc != in;
  const TensorUse read = sliced ? TensorUse::HostRead : use;
  auto check_split = [&](int row_div, int col_div) {
    if (nr != out) DSV4_CHECK(r0 % row_div == 0 && nr % row_div == 0, "{}: rows {}+{} split a block of {}", prefix, r0, nr, row_div);
    if (nc != in) DSV4_CHECK(c0 % col_div == 0 && nc % col_div == 0, "{}: columns {}+{} split a block of {}", prefix, c0, nc, col_div);
  };
  auto take = [&](const TensorRef& t, int row_div, int col_div, int elem_bytes) {
    if (t.in_backend) return t.data;  // whole (read == use), made where it lives
    check_split(row_div, col_div);
    const int64_t row_bytes = t.shape.size() == 2 ? t.shape[1] * elem_bytes : 0;
    const int64_t sr0 = r0 / row_div, snr = (nr + row_div - 1) / row_div;
    const int64_t sc0 = int64_t(c0 / col_div) * elem_bytes, snc = int64_t((nc + col_div - 1) / col_div) * elem_bytes;
    const uint8_t* data = t.data + sr0 * row_bytes;
    if (snc != row_bytes) {
      std::vector<uint8_t> copy(size_t(snr * snc));
      for (int64_t r = 0; r < snr; ++r) std::memcpy(copy.data() + r * snc, t.data + (sr0 + r) * row_bytes + sc0, size_t(snc));
      data = b.keep(std::move(copy));
    }
    return use == TensorUse::Placed ? static_cast<const uint8_t*>(b.place(data, size_t(snr * snc))) : data;
  };
  // A slice the source can make in backend memory is made there (a synthetic model's rank), else cut
  // from the whole tensor's host view.
  auto fetch = [&](const std::string& name, std::initializer_list<DType> dtypes, std::vector<int64_t> shape, int row_div,
                   int col_div, int elem_bytes) -> const uint8_t* {
    if (sliced) {
      check_split(row_div, col_div);
      const TensorSource::Window w{r0 / row_div, (nr + row_div - 1) / row_div, c0 / col_div, (nc + col_div - 1) / col_div};
      if (const TensorRef* t = b.get_window(name, *dtypes.begin(), shape, use, w)) return t->data;
    }
    return take(b.get(name, dtypes, std::move(shape), read), row_div, col_div, elem_bytes);
  };
  LinearWeight l;
  l.name = prefix;
  l.format = format;
  l.out = nr;
  l.in = nc;
  switch (format) {
    case WeightFormat::BF16:
      l.w = fetch(prefix + ".weight", {DType::BF16}, {out, in}, 1, 1, 2);
      break;
    case WeightFormat::FP8_BLOCK:
      l.w = fetch(prefix + ".weight", {DType::F8_E4M3}, {out, in}, 1, 1, 1);
      l.scale = fetch(prefix + ".scale", {DType::F8_E8M0}, {ceil_div(out, 128), ceil_div(in, 128)}, 128, 128, 1);
      break;
    case WeightFormat::MXFP4:
      if (in % 32) fail("{}: input width {} is not a multiple of 32 (MXFP4 blocks)", prefix, in);
      l.w = fetch(prefix + ".weight", {DType::I8, DType::U8}, {out, in / 2}, 1, 2, 1);
      l.scale = fetch(prefix + ".scale", {DType::F8_E8M0}, {out, in / 32}, 1, 32, 1);
      break;
    case WeightFormat::NVFP4:
      if (in % 16) fail("{}: input width {} is not a multiple of 16 (NVFP4 blocks)", prefix, in);
      l.w = fetch(prefix + ".weight", {DType::U8, DType::I8}, {out, in / 2}, 1, 2, 1);
      l.scale = fetch(prefix + ".weight_scale", {DType::F8_E4M3}, {out, in / 16}, 1, 16, 1);
      l.scale2 = b.f32_scalar(prefix + ".weight_scale_2");
      if (b.has(prefix + ".input_scale")) b.f32(prefix + ".input_scale", {});  // static act scale: unused (FP8/bf16 activations)
      break;
  }
  return l;
}

CompressorWeights bind_compressor(TensorBinder& b, const std::string& p, const ModelConfig& c, int ratio, int d, bool rotate) {
  CompressorWeights w;
  w.ratio = ratio;
  w.head_dim = d;
  w.coff = ratio == 4 ? 2 : 1;
  w.rotate = rotate;
  w.wkv = b.bf16(p + ".wkv.weight", {w.coff * d, c.dim});
  w.wgate = b.bf16(p + ".wgate.weight", {w.coff * d, c.dim});
  w.ape = b.f32(p + ".ape", {ratio, w.coff * d});
  w.norm = b.bf16(p + ".norm.weight", {d});
  return w;
}

BlockWeights bind_block(TensorBinder& b, const std::string& p, const ModelConfig& c, int layer, bool is_mtp,
                        const ParallelLayout& layout) {
  BlockWeights blk;
  blk.layer = layer;
  blk.ratio = c.compress_ratios[size_t(layer)];
  blk.hash_routed = !is_mtp && layer < c.n_hash_layers;
  const int D = c.dim, H = c.n_heads, hd = c.head_dim, hc = c.hc_mult, mix = (2 + hc) * hc;
  const WeightFormat lf = c.linear_format;
  blk.attn_norm = b.bf16(p + ".attn_norm.weight", {D});
  blk.ffn_norm = b.bf16(p + ".ffn_norm.weight", {D});
  blk.hc_attn = {b.f32(p + ".hc_attn_fn", {mix, hc * D}), b.f32(p + ".hc_attn_base", {mix}), b.f32(p + ".hc_attn_scale", {3})};
  blk.hc_ffn = {b.f32(p + ".hc_ffn_fn", {mix, hc * D}), b.f32(p + ".hc_ffn_base", {mix}), b.f32(p + ".hc_ffn_scale", {3})};

  // Tensor parallelism (parallel_layout.h): this rank's heads and output groups; wq_b's rows, the
  // sinks and wo_a's groups follow them, wo_b takes the matching inputs (row-parallel: the model
  // sums the ranks' partial outputs). The KV path, compressors and indexer are replicated.
  const int rank = layout.rank, world = layout.world;
  AttentionWeights& a = blk.attn;
  a.n_heads = H / world;
  a.o_groups = c.o_groups / world;
  const int group_rows = a.o_groups * c.o_lora_rank;
  const TensorRef& sink = b.get(p + ".attn.attn_sink", {DType::F32}, {H}, TensorUse::HostRead);
  a.sink = static_cast<const float*>(b.place(sink.as<float>() + rank * a.n_heads, size_t(a.n_heads) * 4));
  a.wq_a = bind_linear(b, p + ".attn.wq_a", c.q_lora_rank, D, lf);
  a.q_norm = b.bf16(p + ".attn.q_norm.weight", {c.q_lora_rank});
  a.wq_b = bind_linear(b, p + ".attn.wq_b", H * hd, c.q_lora_rank, lf, TensorUse::Placed, {rank * a.n_heads * hd, a.n_heads * hd});
  a.wkv = bind_linear(b, p + ".attn.wkv", hd, D, lf);
  a.kv_norm = b.bf16(p + ".attn.kv_norm.weight", {hd});
  a.wo_a = bind_linear(b, p + ".attn.wo_a", c.o_groups * c.o_lora_rank, H * hd / c.o_groups, lf, TensorUse::Placed,
                       {rank * group_rows, group_rows});
  a.wo_b = bind_linear(b, p + ".attn.wo_b", D, c.o_groups * c.o_lora_rank, lf, TensorUse::Placed, {}, {rank * group_rows, group_rows});
  if (blk.ratio) a.compressor = bind_compressor(b, p + ".attn.compressor", c, blk.ratio, hd, false);
  if (blk.ratio == 4) {
    a.indexer.wq_b = bind_linear(b, p + ".attn.indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank, lf);
    a.indexer.weights_proj = b.bf16(p + ".attn.indexer.weights_proj.weight", {c.index_n_heads, D});
    a.indexer.compressor = bind_compressor(b, p + ".attn.indexer.compressor", c, 4, c.index_head_dim, true);
  }

  MoeWeights& m = blk.moe;
  const int E = c.n_routed_experts, I = c.moe_inter_dim;
  // Experts split by intermediate dimension (w1 / w3 rows, w2 inputs), or whole experts by rank.
  const Span inter{rank * (I / world), I / world};
  const bool by_expert = layout.expert_parallel && layout.split();
  const int e_begin = by_expert ? rank * (E / world) : 0, e_end = by_expert ? e_begin + E / world : E;
  const Span expert_rows = by_expert ? Span{} : inter;
  m.n_routed = E;
  m.expert_begin = e_begin;
  m.gate = b.bf16(p + ".ffn.gate.weight", {E, D});
  if (blk.hash_routed) {
    const TensorRef& t = b.get(p + ".ffn.gate.tid2eid", {DType::I32, DType::I64}, {c.vocab_size, c.n_active_experts},
                                  TensorUse::HostRead);
    m.hash_table_host = std::make_shared<std::vector<int32_t>>(size_t(t.numel()));
    std::vector<int32_t>& table = *m.hash_table_host;
    for (size_t i = 0; i < table.size(); ++i) {
      int64_t v = t.dtype == DType::I32 ? t.as<int32_t>()[i] : t.as<int64_t>()[i];
      if (v < 0 || v >= E) fail("{}.ffn.gate.tid2eid: entry {} is {}, outside [0, {})", p, i, v, E);
      table[i] = int32_t(v);
    }
    m.hash_table = static_cast<const int32_t*>(b.place(table.data(), table.size() * 4));
  } else {
    m.bias = b.f32(p + ".ffn.gate.bias", {E});
  }
  const WeightFormat ef = c.expert_format[size_t(layer)];
  m.experts.resize(size_t(e_end - e_begin));
  for (int e = 0; e < E; ++e) {
    std::string ep = fmt::format("{}.ffn.experts.{}", p, e);
    if (e < e_begin || e >= e_end) {
      b.owned_elsewhere(ep + ".");
      continue;
    }
    m.experts[size_t(e - e_begin)] = {bind_linear(b, ep + ".w1", I, D, ef, TensorUse::Prepared, expert_rows),
                                      bind_linear(b, ep + ".w2", D, I, ef, TensorUse::Prepared, {}, expert_rows),
                                      bind_linear(b, ep + ".w3", I, D, ef, TensorUse::Prepared, expert_rows)};
  }
  if (b.backend()) {
    b.backend()->prepare_experts(m, float(c.swiglu_limit));
    b.count_expert_bytes(m);
    if (b.copies() && b.source().release_bound()) {  // generated host bytes are gone: no dangling views
      for (auto& e : m.experts)
        for (LinearWeight* l : {&e.w1, &e.w2, &e.w3}) l->w = l->scale = nullptr;
    }
  }
  m.shared = {bind_linear(b, p + ".ffn.shared_experts.w1", I, D, lf, TensorUse::Placed, inter),
              bind_linear(b, p + ".ffn.shared_experts.w2", D, I, lf, TensorUse::Placed, {}, inter),
              bind_linear(b, p + ".ffn.shared_experts.w3", I, D, lf, TensorUse::Placed, inter)};
  // A backend with its own copies (placed, experts prepared) no longer needs this layer's host
  // slices: on a GPU the routed experts' w2 slices alone would keep 1/N of them in host memory.
  if (b.copies() && b.release_kept()) {
    for (auto& e : m.experts)
      for (LinearWeight* l : {&e.w1, &e.w2, &e.w3}) l->w = l->scale = nullptr;
  }
  return blk;
}

}  // namespace

namespace {
class CheckpointSource final : public TensorSource {
 public:
  explicit CheckpointSource(const Checkpoint& c) : ckpt_(c) {}
  const TensorRef* find(const std::string& name, DType, const std::vector<int64_t>&, TensorUse) override {
    return ckpt_.find(name);
  }
  bool has(const std::string& name) const override { return ckpt_.has(name); }
  std::string where() const override { return ckpt_.dir(); }

 private:
  const Checkpoint& ckpt_;
};
}  // namespace

std::unique_ptr<ModelWeights> load_model_weights(const std::string& dir, Backend* backend, const ParallelLayout& layout) {
  if (dir.rfind("synthetic:", 0) == 0) {
    std::shared_ptr<SyntheticSource> src = make_synthetic_source(dir, backend);
    auto w = bind_model_weights(src->config(), *src, backend, nullptr, layout);
    w->source = src;
    return w;
  }
  auto ckpt = std::make_shared<Checkpoint>(dir);
  CheckpointSource src(*ckpt);
  return bind_model_weights(load_model_config(dir), src, backend, ckpt, layout);
}

std::unique_ptr<ModelWeights> bind_model_weights(const ModelConfig& config, TensorSource& src, Backend* backend,
                                                 std::shared_ptr<Checkpoint> checkpoint, const ParallelLayout& layout) {
  if (const std::string why = parallel_layout_problem(config, layout.world, layout.expert_parallel); !why.empty())
    fail("{}: {}", src.where(), why);
  DSV4_CHECK(layout.rank >= 0 && layout.rank < layout.world, "rank {} outside a tensor-parallel group of {}", layout.rank,
             layout.world);
  auto mw = std::make_unique<ModelWeights>();
  mw->config = config;
  mw->layout = layout;
  const ModelConfig& c = mw->config;
  mw->checkpoint = std::move(checkpoint);
  TensorBinder b(src, backend);
  const int D = c.dim, V = c.vocab_size, hc = c.hc_mult;
  mw->embed = b.bf16("embed.weight", {V, D});
  mw->head = b.bf16("head.weight", {V, D});
  mw->norm = b.bf16("norm.weight", {D});
  mw->hc_head = {b.f32("hc_head_fn", {hc, hc * D}), b.f32("hc_head_base", {hc}), b.f32("hc_head_scale", {1})};
  Progress progress(backend ? "placing weights" : "binding weights");
  const int total = c.n_layers + c.n_mtp_layers;
  for (int l = 0; l < c.n_layers; ++l) {
    const double before = b.bytes();
    mw->blocks.push_back(bind_block(b, fmt::format("layers.{}", l), c, l, false, layout));
    mw->block_bytes.push_back(b.bytes() - before);
    const LinearWeight& w1 = mw->blocks.back().moe.experts.front().w1;
    const double per32 = w1.format == WeightFormat::NVFP4 ? 2 : w1.format == WeightFormat::MXFP4 ? 1 : 0;
    const double w_bytes = w1.format == WeightFormat::BF16 ? 2.0 : w1.format == WeightFormat::FP8_BLOCK ? 1.0 : 0.5;
    mw->expert_bytes.push_back(3.0 * double(c.moe_inter_dim) * double(c.dim) * (w_bytes + per32 / 32));
    if (layout.rank == 0) progress.update(l + 1, total, b.placed_bytes());  // one bar for all ranks
  }
  for (int m = 0; m < c.n_mtp_layers; ++m) {
    std::string p = fmt::format("mtp.{}", m);
    MtpWeights w;
    w.block = bind_block(b, p, c, c.n_layers + m, true, layout);
    w.e_proj = bind_linear(b, p + ".e_proj", D, D, c.linear_format);
    w.h_proj = bind_linear(b, p + ".h_proj", D, D, c.linear_format);
    w.enorm = b.bf16(p + ".enorm.weight", {D});
    w.hnorm = b.bf16(p + ".hnorm.weight", {D});
    w.norm = b.bf16(p + ".norm.weight", {D});
    w.hc_head = {b.f32(p + ".hc_head_fn", {hc, hc * D}), b.f32(p + ".hc_head_base", {hc}), b.f32(p + ".hc_head_scale", {1})};
    mw->mtp.push_back(std::move(w));
    if (layout.rank == 0) progress.update(c.n_layers + m + 1, total, b.placed_bytes());
  }
  if (layout.rank == 0) progress.done();
  mw->tensors_bound = b.used().size();
  mw->bytes_bound = b.bytes();
  mw->shard_copies = b.take_kept();
  if (!mw->checkpoint) return mw;
  for (auto& [name, t] : mw->checkpoint->tensors()) {
    if (b.used().count(name) || b.is_elsewhere(name)) continue;
    // The MTP block's copies of the shared embedding and head (the reference's convert drops them).
    if (name.find(".emb.tok_emb.weight") != std::string::npos || (name.rfind("mtp.", 0) == 0 && name.find(".head.weight") != std::string::npos))
      continue;
    mw->unused_tensors.push_back(name);
  }
  return mw;
}

}  // namespace dsv4
