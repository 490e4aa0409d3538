// Model commands: inspect, make-tiny, logits, layer-check (generate and chat have files of their own).
#include <fmt/format.h>

#include <filesystem>

#include "commands/cli_options.h"
#include "commands/commands.h"
#include "commands/golden_commands.h"
#include "core/error.h"
#include "core/log.h"
#include "model/dsv4.h"
#include "model/make_tiny.h"
#include "model/synthetic.h"
#include "serve/tokenizer.h"

namespace dsv4::commands {

namespace fs = std::filesystem;

namespace {

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

// make-tiny --force replaces these (and only these) in a non-empty directory, so no file of an
// earlier checkpoint (an hf_quant_config.json of another format) survives to change what is read.
constexpr const char* kTinyFiles[] = {"config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                      "model.safetensors.index.json", "hf_quant_config.json", "tokenizer.json",
                                      "tokenizer_config.json"};

void prepare_tiny_out_dir(const std::string& dir, bool force) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  if (!fs::is_directory(dir, ec)) fail("--out {}: a file is in the way (give a directory)", dir);
  if (fs::is_empty(dir, ec)) return;
  if (!force) fail("--out {} is not empty: give --force to replace the checkpoint in it, or a new or empty directory", dir);
  for (const char* name : kTinyFiles) fs::remove(fs::path(dir) / name);
  // The shards of a --like checkpoint (model-0000i-of-0000n.safetensors).
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("model-", 0) == 0 && n.find("-of-") != std::string::npos && n.size() > 12 &&
        n.compare(n.size() - 12, 12, ".safetensors") == 0)
      fs::remove(e.path());
  }
}

void add_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Validate a checkpoint and print its config, formats and sizes");
  auto dir = std::make_shared<std::string>();
  auto positional = std::make_shared<std::string>();
  cmd->add_option("--model", *dir, "Checkpoint directory (config.json + safetensors)");
  cmd->add_option("dir", *positional, "The old form of --model (deprecated), kept working");
  cmd->callback([dir, positional, cmd] {
    const bool by_option = cmd->count("--model") > 0, by_position = cmd->count("dir") > 0;
    if (by_option && by_position) usage_error("give the checkpoint once: --model DIR");
    if (!by_option && !by_position) usage_error("inspect needs --model DIR");
    if (by_position) log_info("note: 'dsv4 inspect DIR' is deprecated; use 'dsv4 inspect --model DIR'");
    const std::string& path = by_option ? *dir : *positional;
    check_model_dir(path);
    cmd_inspect(path);
  });
}

void add_make_tiny(CLI::App& app) {
  auto* cmd = app.add_subcommand("make-tiny", "Write a random-weight DeepSeek-V4 checkpoint in the official format");
  auto opts = std::make_shared<TinyModelOptions>();
  auto sets = std::make_shared<std::vector<std::string>>();
  auto no_tok = std::make_shared<bool>(false);
  auto force = std::make_shared<bool>(false);
  auto like = std::make_shared<std::string>();
  cmd->add_option("--out", opts->out_dir, "Output directory (new or empty, unless --force)")->required();
  cmd->add_option("--like", *like,
                  "Write the synthetic model SPEC instead (synthetic:flash[,layers=N,experts=mxfp4|nvfp4,seed=K,...]): "
                  "full-size shapes in shards of 4 GB, to measure loading on");
  cmd->add_flag("--force", *force, "Write into a non-empty directory, replacing the checkpoint files there");
  cmd->add_option("--experts-format", opts->experts_format, "Routed experts: mxfp4 (DeepSeek) or nvfp4 (ModelOpt)")
      ->check(one_of({"mxfp4", "nvfp4"}))
      ->capture_default_str();
  cmd->add_option("--seed", opts->seed, "Random seed of the weights")->check(unsigned_64())->capture_default_str();
  cmd->add_flag("--bf16", opts->bf16, "Write a plain BF16 checkpoint (no FP8 linears, no FP4 experts)");
  cmd->add_option("--set", *sets, "Config override KEY=VALUE (JSON value), e.g. --set num_hidden_layers=3");
  cmd->add_flag("--no-tokenizer", *no_tok, "Do not write tokenizer.json next to the weights");
  cmd->callback([opts, sets, no_tok, force, like, cmd] {
    if (!like->empty()) {
      if (like->rfind("synthetic:", 0) != 0) usage_error("--like {}: expected synthetic:NAME[,key=value...]", *like);
      for (const char* o : {"--set", "--bf16", "--experts-format", "--seed"})
        if (cmd->count(o)) usage_error("--like takes its options in the spec ({} → ,key=value)", o);
      prepare_tiny_out_dir(opts->out_dir, *force);
      const int n = write_synthetic_checkpoint(*like, opts->out_dir);
      if (!*no_tok) write_default_tokenizer(opts->out_dir);
      log_info("wrote {} tensors of {} to {}", n, *like, opts->out_dir);
      return;
    }
    for (auto& s : *sets) {
      auto eq = s.find('=');
      if (eq == std::string::npos || eq == 0) usage_error("--set expects KEY=VALUE, got '{}'", s);
      opts->overrides[s.substr(0, eq)] = s.substr(eq + 1);
    }
    prepare_tiny_out_dir(opts->out_dir, *force);
    int n = make_tiny_model(*opts);
    if (!*no_tok) write_default_tokenizer(opts->out_dir);
    log_info("wrote {} tensors to {}{}", n, opts->out_dir, *no_tok ? "" : " (with tokenizer.json)");
  });
}

}  // namespace

void add_model_commands(CLI::App& app) {
  add_inspect(app);
  add_make_tiny(app);
  add_generate_command(app);
  add_chat_command(app);
  {
    auto* cmd = app.add_subcommand("logits", "Write prefill and teacher-forced decode logits for input files (one batch)");
    struct Args {
      std::string model, out_dir, backend = "cpu", dump;
      std::vector<std::string> inputs;
      ParallelOptions parallel;
    };
    auto a = std::make_shared<Args>();
    add_model_option(cmd, a->model);
    cmd->add_option("--input", a->inputs, "safetensors with prompt_ids I32 [T] and optional decode_ids I32 [N]")->required();
    cmd->add_option("--output-dir", a->out_dir, "Where to write <input name> with prefill_logits / decode_logits")->required();
    cmd->add_option("--dump", a->dump, "Write every named intermediate of the prefill step to this safetensors file");
    add_backend_option(cmd, a->backend);
    add_parallel_options(cmd, a->parallel);
    cmd->callback([a] {
      check_model_dir(a->model);
      check_parallel_options(a->model, a->parallel);
      run_logits_command(a->model, a->inputs, a->out_dir, a->backend, a->dump,
                         {a->parallel.tensor_parallel_size, a->parallel.expert_parallel});
    });
  }
  {
    auto* cmd = app.add_subcommand("layer-check", "Run each block teacher-forced on golden streams and compare per layer");
    struct Args {
      std::string model, golden, output, backend = "cpu";
      int chunk = 0;
      ParallelOptions parallel;
    };
    auto a = std::make_shared<Args>();
    add_model_option(cmd, a->model);
    cmd->add_option("--golden", a->golden, "Golden safetensors (prompt_ids, embed_out, layer_out.{i}, ...)")->required();
    cmd->add_option("--output", a->output, "Output safetensors")->required();
    cmd->add_option("--chunk", a->chunk, "Prefill chunk size (0: the whole prompt)")
        ->check(integer_in(0, 1 << 24, "0 = the whole prompt"))
        ->capture_default_str();
    add_backend_option(cmd, a->backend);
    add_parallel_options(cmd, a->parallel);
    cmd->callback([a] {
      check_model_dir(a->model);
      check_parallel_options(a->model, a->parallel);
      run_layer_check_command(a->model, a->golden, a->output, a->chunk, a->backend,
                              {a->parallel.tensor_parallel_size, a->parallel.expert_parallel});
    });
  }
}

}  // namespace dsv4::commands
