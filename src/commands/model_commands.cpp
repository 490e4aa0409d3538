// Model commands: inspect, make-tiny, generate, logits, layer-check.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <random>

#include "commands/commands.h"
#include "commands/golden_commands.h"
#include "core/error.h"
#include "core/log.h"
#include "model/dsv4.h"
#include "model/make_tiny.h"
#include "serve/tokenizer.h"

namespace dsv4::commands {

namespace fs = std::filesystem;

namespace {

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string part = text.substr(i, j - i);
    try {
      size_t used = 0;
      long v = std::stol(part, &used);
      if (used != part.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(part);
      ids.push_back(int32_t(v));
    } catch (const std::exception&) {
      fail("'{}' is not a token id (expected comma-separated non-negative integers)", part);
    }
    i = j + 1;
  }
  return ids;
}

void add_backend_option(CLI::App* cmd, std::string& backend) {
  cmd->add_option("--backend", backend, "Compute backend: cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
}

void cmd_inspect(const std::string& dir) {
  auto w = load_model_weights(dir);
  if (!w->checkpoint) fail("inspect reads a checkpoint directory; {} is generated", dir);
  const ModelConfig& c = w->config;
  int64_t params = 0;
  for (auto& [n, t] : w->checkpoint->tensors()) params += t.numel();
  int n_csa = 0, n_hca = 0, n_swa = 0;
  for (int l = 0; l < c.n_layers; ++l) (c.compress_ratios[size_t(l)] == 4 ? n_csa : c.compress_ratios[size_t(l)] ? n_hca : n_swa)++;
  fmt::print("model: {}\n", dir);
  fmt::print("layers: {} ({} SWA, {} CSA, {} HCA) + {} MTP; hidden {}; heads {}×{} (rope {}); vocab {}\n", c.n_layers, n_swa,
             n_csa, n_hca, c.n_mtp_layers, c.dim, c.n_heads, c.head_dim, c.rope_dim, c.vocab_size);
  fmt::print("experts: {} routed (top-{}) + {} shared, intermediate {}; hash-routed layers: {}\n", c.n_routed_experts,
             c.n_active_experts, c.n_shared_experts, c.moe_inter_dim, c.n_hash_layers);
  fmt::print("attention: window {}, q_lora {}, o_groups {}×{}, indexer {}×{} top-{}\n", c.window, c.q_lora_rank, c.o_groups,
             c.o_lora_rank, c.index_n_heads, c.index_head_dim, c.index_topk);
  std::string formats = c.quant_summary;
  for (size_t p = formats.find('\n'); p != std::string::npos; p = formats.find('\n', p + 3)) formats.replace(p, 1, "\n  ");
  fmt::print("formats:\n  {}\n", formats);
  fmt::print("tensors: {} ({} elements, {:.2f} MB on disk)\n", w->checkpoint->tensors().size(), params,
             double(w->checkpoint->total_bytes()) / 1e6);
  if (!w->unused_tensors.empty()) {
    fmt::print("not used by the model ({}):\n", w->unused_tensors.size());
    for (auto& n : w->unused_tensors) fmt::print("  {}\n", n);
  }
}

}  // namespace

void add_model_commands(CLI::App& app) {
  {
    auto* cmd = app.add_subcommand("inspect", "Validate a checkpoint and print its config, formats and sizes");
    auto dir = std::make_shared<std::string>();
    cmd->add_option("dir", *dir, "Checkpoint directory (config.json + safetensors)")->required();
    cmd->callback([dir] { cmd_inspect(*dir); });
  }
  {
    auto* cmd = app.add_subcommand("make-tiny", "Write a random-weight DeepSeek-V4 checkpoint in the official format");
    auto opts = std::make_shared<TinyModelOptions>();
    auto sets = std::make_shared<std::vector<std::string>>();
    auto no_tok = std::make_shared<bool>(false);
    cmd->add_option("--out", opts->out_dir, "Output directory")->required();
    cmd->add_option("--experts-format", opts->experts_format, "Routed experts: mxfp4 (DeepSeek) or nvfp4 (ModelOpt)")
        ->check(CLI::IsMember({"mxfp4", "nvfp4"}));
    cmd->add_option("--seed", opts->seed, "Random seed");
    cmd->add_flag("--bf16", opts->bf16, "Write a plain BF16 checkpoint (no FP8 linears, no FP4 experts)");
    cmd->add_option("--set", *sets, "Config override KEY=VALUE (JSON value), e.g. --set num_hidden_layers=3");
    cmd->add_flag("--no-tokenizer", *no_tok, "Do not write tokenizer.json next to the weights");
    cmd->callback([opts, sets, no_tok] {
      for (auto& s : *sets) {
        auto eq = s.find('=');
        if (eq == std::string::npos || eq == 0) fail("--set expects KEY=VALUE, got '{}'", s);
        opts->overrides[s.substr(0, eq)] = s.substr(eq + 1);
      }
      int n = make_tiny_model(*opts);
      if (!*no_tok) write_default_tokenizer(opts->out_dir);
      log_info("wrote {} tensors to {}{}", n, opts->out_dir, *no_tok ? "" : " (with tokenizer.json)");
    });
  }
  {
    auto* cmd = app.add_subcommand("generate", "Generate tokens from a prompt (prints ids, text and tokens/s)");
    struct Args {
      std::string model, prompt_ids, prompt, backend = "cpu";
      int n = 32;
      SamplingParams sampling;
      bool ignore_eos = false;
    };
    auto a = std::make_shared<Args>();
    cmd->add_option("--model", a->model, "Checkpoint directory")->required();
    auto* ids_opt = cmd->add_option("--prompt-ids", a->prompt_ids, "Prompt token ids, e.g. 1,2,3");
    cmd->add_option("--prompt", a->prompt, "Prompt text (needs tokenizer.json in the model directory)")->excludes(ids_opt);
    cmd->add_option("-n", a->n, "Tokens to generate")->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--temperature", a->sampling.temperature, "Sampling temperature (0 = greedy)")
        ->check(CLI::Range(0.0, 100.0))->capture_default_str();
    cmd->add_option("--top-p", a->sampling.top_p, "Nucleus sampling mass (1 = off)")->check(CLI::Range(0.0, 1.0))->capture_default_str();
    cmd->add_option("--top-k", a->sampling.top_k, "Keep the k most likely tokens (0 = off)")->check(CLI::Range(0, 1 << 24))->capture_default_str();
    cmd->add_option("--min-p", a->sampling.min_p, "Drop tokens below min-p × the top probability (0 = off)")
        ->check(CLI::Range(0.0, 1.0))->capture_default_str();
    cmd->add_option("--seed", a->sampling.seed, "Sampling seed")->capture_default_str();
    cmd->add_flag("--ignore-eos", a->ignore_eos, "Keep generating after the end-of-sequence token");
    add_backend_option(cmd, a->backend);
    cmd->callback([a] {
      std::optional<Tokenizer> tok;
      if (fs::exists(fs::path(a->model) / "tokenizer.json")) tok = Tokenizer::load(a->model);
      std::vector<int32_t> prompt;
      if (!a->prompt_ids.empty()) prompt = parse_ids(a->prompt_ids);
      else if (!a->prompt.empty()) {
        if (!tok) fail("--prompt needs {}/tokenizer.json; use --prompt-ids instead", a->model);
        prompt = tok->encode(a->prompt);
      } else fail("give --prompt-ids or --prompt");
      if (prompt.empty()) fail("the prompt is empty");
      auto m = load_model(a->model, a->backend);
      SeqId s = m.model->new_sequence();
      // The backend samples (no logits come back to the host); the draw counter is the index of the
      // generated token, so a seed gives the same text on every backend.
      auto item = [&](std::vector<int32_t> tokens, uint64_t counter) {
        BatchItem b{s, std::move(tokens)};
        b.return_logits = false;
        b.sampling = a->sampling;
        b.sample_counter = counter;
        return b;
      };
      auto t0 = std::chrono::steady_clock::now();
      StepOutput out = m.model->step({item(prompt, 0)});
      auto t1 = std::chrono::steady_clock::now();
      std::vector<int32_t> gen;
      const int32_t eos = m.model->config().eos_token_id;
      for (int i = 0; i < a->n; ++i) {
        const int32_t next = out.tokens[0];
        gen.push_back(next);
        if (next == eos && !a->ignore_eos) break;
        if (i + 1 < a->n) out = m.model->step({item({next}, uint64_t(i + 1))});
      }
      auto t2 = std::chrono::steady_clock::now();
      double prefill = std::chrono::duration<double>(t1 - t0).count(), decode = std::chrono::duration<double>(t2 - t1).count();
      fmt::print("ids: {}\n", fmt::join(gen, ","));
      if (tok) {
        std::vector<int32_t> known;
        for (auto id : gen)
          if (tok->is_known(id)) known.push_back(id);
        fmt::print("text: {}\n", tok->decode(known));
      }
      fmt::print("prefill: {} tokens in {:.3f} s ({:.1f} tok/s); decode: {} tokens in {:.3f} s ({:.1f} tok/s)\n", prompt.size(),
                 prefill, double(prompt.size()) / prefill, gen.size(), decode,
                 gen.size() > 1 ? double(gen.size() - 1) / decode : 0.0);
      if (gen.back() == eos && !a->ignore_eos) fmt::print("stopped at the end-of-sequence token\n");
    });
  }
  {
    auto* cmd = app.add_subcommand("logits", "Write prefill and teacher-forced decode logits for input files (one batch)");
    struct Args {
      std::string model, out_dir, backend = "cpu", dump;
      std::vector<std::string> inputs;
    };
    auto a = std::make_shared<Args>();
    cmd->add_option("--model", a->model, "Checkpoint directory")->required();
    cmd->add_option("--input", a->inputs, "safetensors with prompt_ids I32 [T] and optional decode_ids I32 [N]")->required();
    cmd->add_option("--output-dir", a->out_dir, "Where to write <input name> with prefill_logits / decode_logits")->required();
    cmd->add_option("--dump", a->dump, "Write every named intermediate of the prefill step to this safetensors file");
    add_backend_option(cmd, a->backend);
    cmd->callback([a] { run_logits_command(a->model, a->inputs, a->out_dir, a->backend, a->dump); });
  }
  {
    auto* cmd = app.add_subcommand("layer-check", "Run each block teacher-forced on golden streams and compare per layer");
    struct Args {
      std::string model, golden, output, backend = "cpu";
      int chunk = 0;
    };
    auto a = std::make_shared<Args>();
    cmd->add_option("--model", a->model, "Checkpoint directory")->required();
    cmd->add_option("--golden", a->golden, "Golden safetensors (prompt_ids, embed_out, layer_out.{i}, ...)")->required();
    cmd->add_option("--output", a->output, "Output safetensors")->required();
    cmd->add_option("--chunk", a->chunk, "Prefill chunk size (default: the whole prompt)")->check(CLI::Range(1, 1 << 24));
    add_backend_option(cmd, a->backend);
    cmd->callback([a] { run_layer_check_command(a->model, a->golden, a->output, a->chunk, a->backend); });
  }
}

}  // namespace dsv4::commands
