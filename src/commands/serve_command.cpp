// `dsv4 serve`: the OpenAI-compatible HTTP server (serve/http/server.h) on a model directory.
#include <CLI/CLI.hpp>

#include "commands/cli_options.h"
#include "commands/commands.h"
#include "commands/golden_commands.h"
#include "serve/http/server.h"

namespace dsv4::commands {

void add_serve_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  auto o = std::make_shared<serve::ServerOptions>();
  auto backend = std::make_shared<std::string>("cpu");
  auto parallel = std::make_shared<ParallelOptions>();
  cmd->add_option("--model", o->model_dir, "Checkpoint directory (config.json + safetensors, tokenizer.json)")->required();
  cmd->add_option("--host", o->host, "Address to listen on (loopback by default; 0.0.0.0 for every interface)")
      ->capture_default_str();
  cmd->add_option("--port", o->port, "Port to listen on (0: any free port, printed in the log)")
      ->check(CLI::Range(0, 65535))->capture_default_str();
  cmd->add_option("--api-key", o->api_key, "Require 'Authorization: Bearer KEY' on /v1 routes (default: none)");
  cmd->add_option("--served-model-name", o->served_model_name, "Model name in the API (default: the --model path)");
  cmd->add_option("--max-model-len", o->engine.max_model_len, "Context length, prompt + completion (default 0: the model's max_position_embeddings)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40))->capture_default_str();
  cmd->add_option("--max-num-seqs", o->engine.max_num_seqs, "Requests running at once")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", o->engine.max_num_batched_tokens, "Tokens per engine step (decode and prefill chunks)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30))->capture_default_str();
  cmd->add_option("--kv-cache-pages", o->engine.kv_cache_pages,
                  "Cache pages per layer pool, 64 entries each (default 0: room for max-num-seqs requests of max-model-len)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40))->capture_default_str();
  cmd->add_option("--tokenizer", o->engine.tokenizer, "tokenizer.json or its directory (default: the model directory's)");
  cmd->add_option("--backend", *backend, "Compute backend: cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  add_parallel_options(cmd, *parallel);
  cmd->add_option("--max-request-bytes", o->max_request_bytes, "Largest request body; larger ones get 413")
      ->check(CLI::Range(size_t(1024), size_t(1) << 34))->capture_default_str();
  cmd->add_option("--http-threads", o->http_threads, "Connections served at once (each holds a thread while open)")
      ->check(CLI::Range(1, 1 << 14))->capture_default_str();
  // Tests of the loading state (GET /health is 503 until the model is loaded); not for users.
  cmd->add_option("--startup-delay", o->startup_delay_seconds, "Seconds to wait before loading the model")
      ->check(CLI::Range(0.0, 3600.0))->group("");
  cmd->callback([o, backend, parallel] {
    o->engine.model_dir = o->model_dir;
    check_parallel_options(o->model_dir, *parallel);
    const int rc = serve::run_server(*o, [o, backend, parallel]() -> serve::ServedModel {
      // Split: the ranks are threads of this process, each with its backend; the engine (on this
      // thread) drives them as one model.
      if (parallel->tensor_parallel_size > 1)
        return {nullptr, load_parallel_model(o->model_dir, *backend,
                                             {parallel->tensor_parallel_size, parallel->expert_parallel})};
      LoadedModel loaded = load_model(o->model_dir, *backend);
      return {std::move(loaded.backend), std::move(loaded.model)};
    });
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace dsv4::commands
