#include "commands/golden_commands.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <set>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/log.h"

namespace dsv4::commands {

namespace fs = std::filesystem;

LoadedModel load_model(const std::string& dir, const std::string& backend_name) {
  return load_model(dir, make_backend(backend_name));
}

namespace {

// The load log: what was bound and detected (rank 0's share for a split model).
void log_loaded(const std::string& dir, const ModelWeights& weights, double secs, const std::string& backend) {
  log_info("loaded {} ({} tensors, {:.1f} MB) in {:.2f} s ({:.2f} GB/s)", dir, weights.tensors_bound, weights.bytes_bound / 1e6,
           secs, weights.bytes_bound / 1e9 / std::max(secs, 1e-9));
  const std::string& q = weights.config.quant_summary;
  for (size_t pos = 0; pos < q.size();) {
    size_t nl = std::min(q.find('\n', pos), q.size());
    log_info("  {}", q.substr(pos, nl - pos));
    pos = nl + 1;
  }
  if (!weights.unused_tensors.empty())
    log_info("  {} tensors not used by the model, e.g. {}", weights.unused_tensors.size(), weights.unused_tensors[0]);
  log_info("  backend: {}", backend);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

LoadedModel load_model(const std::string& dir, std::unique_ptr<Backend> backend) {
  auto t0 = std::chrono::steady_clock::now();
  LoadedModel m;
  m.backend = std::move(backend);
  auto weights = load_model_weights(dir, m.backend.get());
  log_loaded(dir, *weights, seconds_since(t0), m.backend->name());
  m.model = std::make_unique<Dsv4Model>(std::move(weights), *m.backend);
  return m;
}

std::unique_ptr<TensorParallelModel> load_parallel_model(const std::string& dir, const std::string& backend_name,
                                                         TensorParallelModel::Options options,
                                                         const TensorParallelModel::BackendWrapper& wrap) {
  auto t0 = std::chrono::steady_clock::now();
  auto m = std::make_unique<TensorParallelModel>(dir, backend_name, options, wrap);
  log_loaded(dir, m->rank_model(0).weights(), seconds_since(t0), m->rank_backend(0).name());
  if (options.world > 1) {
    const ModelConfig& c = m->config();
    log_info("  tensor parallel: {} ranks, {} of {} attention heads each, routed experts {}", options.world,
             c.n_heads / options.world, c.n_heads,
             options.expert_parallel ? fmt::format("by expert ({} of {} each)", c.n_routed_experts / options.world, c.n_routed_experts)
                                     : fmt::format("by intermediate dimension ({} of {} each)", c.moe_inter_dim / options.world,
                                                   c.moe_inter_dim));
  }
  return m;
}

namespace {

const TensorRef& need(const SafetensorsFile& f, const std::string& name, DType dtype) {
  auto it = f.tensors().find(name);
  if (it == f.tensors().end()) fail("{}: tensor {} is missing", f.path(), name);
  if (it->second.dtype != dtype) fail("{}: {} must be {}, found {}", f.path(), name, dtype_name(dtype), dtype_name(it->second.dtype));
  return it->second;
}

std::vector<int32_t> read_ids(const SafetensorsFile& f, const std::string& name, int vocab) {
  const TensorRef& t = need(f, name, DType::I32);
  if (t.shape.size() != 1) fail("{}: {} must be one-dimensional, found {}", f.path(), name, shape_str(t.shape));
  std::vector<int32_t> ids(t.as<int32_t>(), t.as<int32_t>() + t.numel());
  for (auto id : ids)
    if (id < 0 || id >= vocab) fail("{}: {} holds id {}, outside the vocabulary (0..{})", f.path(), name, id, vocab - 1);
  return ids;
}

std::vector<float> to_f32(const TensorRef& t) {
  std::vector<float> v(size_t(t.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = t.dtype == DType::BF16 ? bf16_to_f32(t.as<uint16_t>()[i]) : t.as<float>()[i];
  return v;
}

struct Diff {
  double rel_rms = 0, max_abs = 0, identical = 0;
};
Diff compare(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  size_t same = 0;
  Diff d;
  for (size_t i = 0; i < n; ++i) {
    double e = double(a[i]) - double(b[i]);
    num += e * e;
    den += double(b[i]) * b[i];
    d.max_abs = std::max(d.max_abs, std::fabs(e));
    same += a[i] == b[i];
  }
  d.rel_rms = std::sqrt(num / std::max(den, 1e-30));
  d.identical = n ? double(same) / double(n) : 1.0;
  return d;
}

double argmax_agreement(const float* a, const float* b, size_t rows, size_t V) {
  size_t agree = 0;
  for (size_t r = 0; r < rows; ++r) {
    auto am = std::max_element(a + r * V, a + (r + 1) * V) - (a + r * V);
    auto bm = std::max_element(b + r * V, b + (r + 1) * V) - (b + r * V);
    agree += am == bm;
  }
  return rows ? double(agree) / double(rows) : 1.0;
}

}  // namespace

void run_logits_command(const std::string& model_dir, const std::vector<std::string>& inputs, const std::string& out_dir,
                        const std::string& backend, const std::string& dump_path, TensorParallelModel::Options parallel) {
  auto tp = load_parallel_model(model_dir, backend, parallel);
  TensorParallelModel& model = *tp;
  Dsv4Model& rank0 = tp->rank_model(0);  // intermediates are rank 0's (its share of the heads)
  const int V = model.config().vocab_size;
  struct Input {
    std::string path;
    std::vector<int32_t> prompt, decode;
    SeqId seq = 0;
    std::vector<float> prefill_logits, decode_logits;
  };
  std::vector<Input> ins;
  for (auto& p : inputs) {
    SafetensorsFile f(p);
    Input in;
    in.path = p;
    in.prompt = read_ids(f, "prompt_ids", V);
    if (in.prompt.empty()) fail("{}: prompt_ids is empty", p);
    if (f.tensors().count("decode_ids")) in.decode = read_ids(f, "decode_ids", V);
    ins.push_back(std::move(in));
  }
  fs::create_directories(out_dir);
  auto t0 = std::chrono::steady_clock::now();
  std::vector<BatchItem> batch;
  for (auto& in : ins) {
    in.seq = model.new_sequence();
    batch.push_back({in.seq, in.prompt, true});
  }
  std::vector<TensorOut> dumped;
  if (!dump_path.empty())
    rank0.dump = [&](const std::string& name, const Tensor& t) {
      std::vector<uint8_t> host(t.nbytes());
      rank0.backend().to_host(t, host.data());
      dumped.push_back(make_tensor_out(name, t.dtype, t.shape, host.data()));
    };
  StepOutput out = model.step(batch);
  rank0.dump = nullptr;
  if (!dump_path.empty()) {
    write_safetensors(dump_path, dumped);
    log_info("wrote {} intermediates of the prefill step to {}", dumped.size(), dump_path);
  }
  for (size_t i = 0; i < ins.size(); ++i) {
    const float* first = out.logits.data() + out.row_of[i] * V;
    ins[i].prefill_logits.assign(first, first + ins[i].prompt.size() * size_t(V));
  }
  size_t steps = 0;
  for (auto& in : ins) steps = std::max(steps, in.decode.size());
  for (size_t k = 0; k < steps; ++k) {
    std::vector<Input*> live;
    batch.clear();
    for (auto& in : ins)
      if (k < in.decode.size()) {
        live.push_back(&in);
        batch.push_back({in.seq, {in.decode[k]}, false});
      }
    out = model.step(batch);
    for (size_t i = 0; i < live.size(); ++i) {
      const float* row = out.logits.data() + out.row_of[i] * V;
      live[i]->decode_logits.insert(live[i]->decode_logits.end(), row, row + V);
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& in : ins) {
    std::vector<TensorOut> t;
    t.push_back(make_tensor_out("prefill_logits", DType::F32, {int64_t(in.prompt.size()), V}, in.prefill_logits.data()));
    if (!in.decode.empty())
      t.push_back(make_tensor_out("decode_logits", DType::F32, {int64_t(in.decode.size()), V}, in.decode_logits.data()));
    write_safetensors((fs::path(out_dir) / fs::path(in.path).filename()).string(), t);
  }
  log_info("{} inputs: prefill + {} decode steps in {:.2f} s; wrote {}", ins.size(), steps, secs, out_dir);
}

namespace {

// layer-check on one rank of the model (every rank runs it at once; the split ops meet in their
// collectives): `report` = print the table, and `outs` receives what is written (rank 0).
void layer_check_on_rank(Dsv4Model& model, const SafetensorsFile& g, const std::string& golden_path, int chunk, bool report,
                         std::vector<TensorOut>& outs) {
  Backend& be = model.backend();
  const ModelConfig& c = model.config();
  const std::vector<int32_t> prompt = read_ids(g, "prompt_ids", c.vocab_size);
  const int64_t T = int64_t(prompt.size()), D = c.dim, hc = c.hc_mult, V = c.vocab_size;
  if (chunk <= 0) chunk = int(T);
  auto print = [report](const char* format, const auto&... args) {
    if (report) fmt::print(fmt::runtime(format), args...);
  };
  print("layer-check {} (T = {}, chunk = {})\n\n| check | rel RMS | max abs | bit-identical | other |\n|---|---|---|---|---|\n",
        golden_path, T, chunk);

  // Embedding.
  Tensor e = be.embed(upload_i32(be, prompt), model.weights().embed, c.dim);
  std::vector<uint16_t> e_host(size_t(T * D));
  be.to_host(e, e_host.data());
  outs.push_back(make_tensor_out("embed_out", DType::BF16, {T, D}, e_host.data()));
  {
    const TensorRef& ge = need(g, "embed_out", DType::BF16);
    if (ge.numel() != T * D) fail("{}: embed_out has shape {}, expected [{},{}]", golden_path, shape_str(ge.shape), T, D);
    std::vector<float> ours(e_host.size());
    for (size_t i = 0; i < ours.size(); ++i) ours[i] = bf16_to_f32(e_host[i]);
    Diff d = compare(ours.data(), to_f32(ge).data(), ours.size());
    print("| embed_out | {:.3e} | {:.3e} | {:.2f}% | |\n", d.rel_rms, d.max_abs, 100 * d.identical);
  }

  std::vector<uint16_t> stream_in(size_t(T * hc * D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < hc; ++j) std::copy_n(e_host.data() + t * D, D, stream_in.data() + (t * hc + j) * D);
  for (int i = 0; i < c.n_layers; ++i) {
    const BlockWeights& block = model.weights().blocks[size_t(i)];
    if (i > 0) {
      const TensorRef& prev = need(g, fmt::format("layer_out.{}", i - 1), DType::BF16);
      if (prev.numel() != T * hc * D) fail("{}: layer_out.{} has shape {}", golden_path, i - 1, shape_str(prev.shape));
      std::copy_n(prev.as<uint16_t>(), T * hc * D, stream_in.data());
    }
    LayerCaches& caches = model.caches(i);
    LayerState st = model.make_layer_state(block, caches);
    std::vector<uint16_t> ours(size_t(T * hc * D));
    std::vector<int32_t> topk(size_t(T) * size_t(c.index_topk), -1);
    std::string topk_name = fmt::format("index_topk-{}", i);
    for (int64_t c0 = 0; c0 < T; c0 += chunk) {
      const int64_t n = std::min<int64_t>(chunk, T - c0);
      Tensor Xc = be.from_host(DType::BF16, {n, hc, D}, stream_in.data() + c0 * hc * D);
      StepPlan plan = model.plan_block(block, caches, st, std::vector<int32_t>(prompt.begin() + c0, prompt.begin() + c0 + n), c0);
      model.dump = [&](const std::string& name, const Tensor& t) {
        if (name == topk_name) be.to_host(t, topk.data() + c0 * c.index_topk);
      };
      Tensor Y = model.run_block(block, Xc, plan, 0);
      release_step_plan(plan);
      be.to_host(Y, ours.data() + c0 * hc * D);
    }
    model.dump = nullptr;
    model.release_layer_state(st, caches);
    outs.push_back(make_tensor_out(fmt::format("layer_out.{}", i), DType::BF16, {T, hc, D}, ours.data()));
    std::string other;
    if (block.ratio == 4) {
      outs.push_back(make_tensor_out(fmt::format("index_topk.{}", i), DType::I32, {T, c.index_topk}, topk.data()));
      auto it = g.tensors().find(fmt::format("prefill_index_topk.{}", i));
      if (it != g.tensors().end() && it->second.numel() == T * c.index_topk) {
        int64_t same = 0;
        for (int64_t t = 0; t < T; ++t) {
          std::set<int32_t> a, b;
          for (int k = 0; k < c.index_topk; ++k) {
            int32_t x = topk[size_t(t * c.index_topk + k)], y = it->second.as<int32_t>()[t * c.index_topk + k];
            if (x >= 0) a.insert(x);
            if (y >= 0) b.insert(y);
          }
          same += a == b;
        }
        other = fmt::format("indexer sets equal on {}/{} rows", same, T);
      }
    }
    auto it = g.tensors().find(fmt::format("layer_out.{}", i));
    if (it != g.tensors().end() && it->second.numel() == T * hc * D) {
      std::vector<float> of(ours.size());
      for (size_t k = 0; k < of.size(); ++k) of[k] = bf16_to_f32(ours[k]);
      Diff d = compare(of.data(), to_f32(it->second).data(), of.size());
      print("| layer_out.{} ({}) | {:.3e} | {:.3e} | {:.2f}% | {} |\n", i,
            block.ratio == 0 ? "SWA" : block.ratio == 4 ? "CSA" : "HCA", d.rel_rms, d.max_abs, 100 * d.identical, other);
    }
  }

  // Head and MTP on the golden final streams.
  const TensorRef& fin = need(g, fmt::format("layer_out.{}", c.n_layers - 1), DType::BF16);
  Tensor Xf = be.from_host(DType::BF16, {T, hc, D}, fin.data);
  Tensor hl = model.head_logits(Xf, model.weights().hc_head, model.weights().norm);
  std::vector<float> head(size_t(T * V));
  be.to_host(hl, head.data());
  outs.push_back(make_tensor_out("head_logits", DType::F32, {T, V}, head.data()));
  if (g.tensors().count("prefill_logits")) {
    auto gl = to_f32(need(g, "prefill_logits", DType::F32));
    Diff d = compare(head.data(), gl.data(), head.size());
    print("| head_logits | {:.3e} | {:.3e} | {:.2f}% | argmax {:.1f}% |\n", d.rel_rms, d.max_abs, 100 * d.identical,
          100 * argmax_agreement(head.data(), gl.data(), size_t(T), size_t(V)));
  }
  if (g.tensors().count("mtp_logits") && !model.weights().mtp.empty()) {
    const TensorRef& gm = need(g, "mtp_logits", DType::F32);
    const int64_t rows = gm.shape.empty() ? 0 : gm.shape[0];
    // The fixture's convention: final streams of positions 0..T−2 with the next token's embedding.
    Tensor Xm = be.from_host(DType::BF16, {T - 1, hc, D}, fin.data);
    std::vector<int32_t> next(prompt.begin() + 1, prompt.end()), pos;
    for (int64_t p = 0; p < T - 1; ++p) pos.push_back(int32_t(p));
    Tensor ml = model.mtp_logits(Xm, next, pos);
    std::vector<float> mtp(size_t((T - 1) * V));
    be.to_host(ml, mtp.data());
    const float* last = mtp.data() + (T - 1 - rows) * V;
    outs.push_back(make_tensor_out("mtp_logits", DType::F32, {rows, V}, last));
    auto gv = to_f32(gm);
    Diff d = compare(last, gv.data(), size_t(rows * V));
    print("| mtp_logits | {:.3e} | {:.3e} | {:.2f}% | argmax {:.1f}% |\n", d.rel_rms, d.max_abs, 100 * d.identical,
          100 * argmax_agreement(last, gv.data(), size_t(rows), size_t(V)));
  }
}

}  // namespace

void run_layer_check_command(const std::string& model_dir, const std::string& golden_path, const std::string& output,
                             int chunk, const std::string& backend, TensorParallelModel::Options parallel) {
  auto tp = load_parallel_model(model_dir, backend, parallel);
  SafetensorsFile g(golden_path);
  std::vector<std::vector<TensorOut>> outs(size_t(tp->world_size()));
  tp->on_every_rank([&](int rank) { layer_check_on_rank(tp->rank_model(rank), g, golden_path, chunk, rank == 0, outs[size_t(rank)]); });
  write_safetensors(output, outs[0]);
}

}  // namespace dsv4::commands
