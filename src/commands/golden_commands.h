// Loading a model for a command, and the two commands the golden checks run with.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/dsv4.h"
#include "model/tensor_parallel_model.h"

namespace dsv4::commands {

struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Dsv4Model> model;
};
// Loads DIR on the named backend and logs what was detected for each weight class.
LoadedModel load_model(const std::string& dir, const std::string& backend_name);
// The same on a backend already made (a ProfilingBackend around one, say).
LoadedModel load_model(const std::string& dir, std::unique_ptr<Backend> backend);

// The same model split over `options.world` ranks (model/tensor_parallel_model.h; 1 = the
// plain model), with the same load log.
std::unique_ptr<TensorParallelModel> load_parallel_model(const std::string& dir, const std::string& backend_name,
                                                         TensorParallelModel::Options options,
                                                         const TensorParallelModel::BackendWrapper& wrap = {});

// `dsv4 logits`: all inputs in one batch; prefill logits for every prompt position, then one
// teacher-forced decode step at a time.
// With `dump_path`, every named intermediate of the prefill step (DESIGN §3.5: "embed_out-0",
// "q-3", "attn_out-3", "moe_out-3", ...) is written there as one safetensors file.
// `parallel`: --tensor-parallel-size / --expert-parallel.
void run_logits_command(const std::string& model_dir, const std::vector<std::string>& inputs,
                        const std::string& out_dir, const std::string& backend, const std::string& dump_path = "",
                        TensorParallelModel::Options parallel = {});

// `dsv4 layer-check`: every block teacher-forced on the golden streams (fresh state, chunks of
// `chunk` tokens, 0 = all), the head and MTP on the golden final streams; prints a table.
void run_layer_check_command(const std::string& model_dir, const std::string& golden_path, const std::string& output,
                             int chunk, const std::string& backend, TensorParallelModel::Options parallel = {});

}  // namespace dsv4::commands
