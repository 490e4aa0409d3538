// The DeepSeek-V4 forward (SPEC §3), composed of backend ops over a batch of sequences, each with
// its own positions: prefill chunks and single decode tokens mix freely in one step.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "model/weights.h"
#include "model/kv_pool.h"
#include "model/serving_model.h"
#include "model/step_plan.h"

namespace dsv4 {

// RoPE frequencies for one layer kind (SPEC §2.8): YaRN only for compressed layers.
RopeTable make_rope_table(const ModelConfig& c, bool compressed_layer);

// One sequence's part of a step: `tokens` at positions start_pos, start_pos + 1, ...
struct BatchItem {
  BatchItem() = default;
  BatchItem(SeqId s, std::vector<int32_t> t, bool all = false) : seq(s), tokens(std::move(t)), all_logits(all) {}
  SeqId seq = 0;
  std::vector<int32_t> tokens;
  bool all_logits = false;     // logits for every token (else only the last)
  bool return_logits = true;   // copy this item's logits rows to the host (StepOutput::logits)
  std::optional<SamplingParams> sampling;  // sample the next token from the last row, on the backend
  uint64_t sample_counter = 0;             // tokens this sequence has sampled so far (the draw's counter)
  // With sampling: penalties on the sampled row first (tokens: the sequence's prompt and output
  // ids, read during the step only; null = no penalties), and the sampled token's logprob plus
  // the top `logprobs` alternatives from the raw row (−1: none).
  PenaltyParams penalties;
  const PenaltyTokens* penalty_tokens = nullptr;
  int logprobs = -1;
};

struct StepOutput {
  // f32 logits, one row per requested position, in batch order; row_of[i] = first row of item i.
  // Empty when no item asked for them (return_logits).
  std::vector<float> logits;
  std::vector<int64_t> row_of;
  int vocab = 0;
  std::vector<int32_t> tokens;  // per item: the sampled token, −1 where the item did not sample
  // Per item when any item asked for logprobs (else empty): that item's, nullopt for the others.
  std::vector<std::optional<TokenLogprobs>> logprobs;
};

// What a step leaves on the backend: the head's logits rows and the sampled tokens.
struct StepResult {
  Tensor logits;  // F32 [P, V]
  Tensor tokens;  // I32 [R]: one per sampling item, in batch order
  LogprobRows logprobs;  // for the plan's logprob rows
};

// How decode steps (every item one token) run. Record: at a fixed shape — the batch padded to a
// bucket of 1, 2, 4, … 256 sequences, positions bounded by a power of two ≥ 1024 — recorded by the
// backend once per (bucket, bound) and replayed for every later step of that shape (CUDA graphs;
// the sampling after the head runs as it is called). Pad: the same fixed-shape steps, run as
// they are called (what a recording computes, on any backend: tests). Off: exact shapes.
enum class DecodeGraphs { Off, Pad, Record };
inline constexpr int kDecodeBuckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};

class Dsv4Model : public ServingModel {
 public:
  // With a communicator of world > 1 this is one rank of a tensor-parallel model
  // (model/tensor_parallel_model.h): `weights` are the rank's share (weights->layout), and the
  // forward sums the ranks' partial outputs where a split op ends. Null = the whole model.
  Dsv4Model(std::unique_ptr<ModelWeights> weights, Backend& backend, Communicator* comm = nullptr);
  ~Dsv4Model() override;

  const ModelConfig& config() const override { return weights_->config; }
  int layer_ratio(int layer) const override { return weights_->blocks.at(size_t(layer)).ratio; }
  void set_cache_capacity(int64_t kv_pages, int64_t key_pages) override;
  const LayerCaches& layer_caches(int layer) const override { return *caches_.at(size_t(layer)); }
  const ModelWeights& weights() const { return *weights_; }
  Backend& backend() { return backend_; }

  SeqId new_sequence() override;
  void free_sequence(SeqId id) override;
  int64_t position(SeqId id) const;

  // One forward step over the batch; every item's start position is its sequence's position.
  // = finish_step(plan_step(batch), run_step(plan), batch).
  StepOutput step(const std::vector<BatchItem>& batch) override;
  // Its three parts: the host's work before (validation, pages, the descriptor upload), the
  // backend's work (enqueued only: no host read, no synchronisation — it can be recorded and
  // replayed), and the host's work after (reading tokens and logits, advancing positions).
  StepPlan plan_step(const std::vector<BatchItem>& batch);
  StepResult run_step(const StepPlan& plan);  // = run_forward, then sample_head
  StepOutput finish_step(StepPlan& plan, const StepResult& result, const std::vector<BatchItem>& batch);

  // The head's logits of the plan's head rows (F32 [P, V]), and the sampling on them.
  Tensor run_forward(const StepPlan& plan);
  void sample_head(const StepPlan& plan, StepResult& result);

  // Decode graphs (the default: Record where the backend can record, else Off; DSV4_DECODE_GRAPHS
  // = off | pad | record overrides it). Changing the mode drops the recordings.
  void set_decode_graphs(DecodeGraphs mode);
  // Drops the recordings (and the step planned ahead): what they captured is gone, such as the
  // communicators a group reset replaced. The next steps of each shape record anew.
  void drop_recordings();
  // Whether decode steps can be recorded: the backend records, and so do the collectives in them.
  bool can_record() const { return backend_.can_capture() && (!comm_ || comm_->can_record()); }
  DecodeGraphs decode_graphs() const { return graph_mode_; }
  struct GraphStats {
    int64_t recorded = 0, replayed = 0, fixed_eager = 0;  // steps recorded, replayed, run padded as called
    int64_t planned_ahead = 0;  // fixed-shape steps whose plan was made while the step before ran
    int64_t recordings = 0;     // held now
  };
  GraphStats graph_stats() const;

  // Pieces used by layer-check and the MTP path (same code as step()).
  // A plan for one layer and one ad-hoc sequence state (layer-check); release with release_step_plan.
  StepPlan plan_block(const BlockWeights& block, LayerCaches& caches, LayerState& state,
                      const std::vector<int32_t>& tokens, int64_t pos0);
  // Layer `layer` of the plan (its index among the plan's layers).
  Tensor run_block(const BlockWeights& block, const Tensor& X, const StepPlan& plan, size_t layer);
  Tensor head_logits(const Tensor& X, const HyperConnection& hc, const uint16_t* norm);
  // MTP block (SPEC §3.9) on main-model final streams X with the next tokens' ids.
  Tensor mtp_logits(const Tensor& X, const std::vector<int32_t>& next_tokens, const std::vector<int32_t>& positions);

  // Fresh per-layer state for an ad-hoc sequence (layer-check); release with release_layer_state.
  LayerState make_layer_state(const BlockWeights& block, LayerCaches& caches);
  void release_layer_state(LayerState& s, LayerCaches& caches);
  LayerCaches& caches(int layer) { return *caches_[size_t(layer)]; }

  // Debug: called with every named intermediate ("attn_out-3", ...) when set (DESIGN §3.5).
  std::function<void(const std::string&, const Tensor&)> dump;
  // Profiling: run_step calls it before the embedding (−1), before each block (its layer) and
  // before the head and sampling (n_layers), so a profile can attribute ops to layers.
  std::function<void(int)> on_block;

 private:
  struct Sequence;
  // A block's output state X = hc_post(y, Xa, post, comb), or (y set) that hc_post not yet run: the
  // next block runs it fused with its first hc_pre (Backend::hc_post_pre), the last one alone.
  struct BlockOutput {
    Tensor X, y, Xa, post, comb;
    int layer = -1;  // of a pending hc_post (its "hc_post_ffn" emit)
  };
  BlockOutput run_block_pending(const BlockWeights& block, BlockOutput in, const StepPlan& plan, size_t layer);
  Tensor settle(BlockOutput out);  // X, running a pending hc_post
  Tensor attention(const BlockWeights& block, const Tensor& x, const StepPlan& plan, const LayerPlan& lp);
  // The layer's compressors (CSA: the indexer's too) over this step's rows; every tensor they make
  // goes to `keep` (the caller may run them as a Backend branch).
  void compress_layer(const AttentionWeights& w, int ratio, const Tensor& x, const StepPlan& plan, const LayerPlan& lp,
                      const RopeTable& rope, std::vector<Tensor>& keep);
  // One compressor's update and cache write from its projections a (wkv) and g (wgate) of x.
  void compress(const CompressorWeights& w, const Tensor& a, const Tensor& g, const StepPlan& plan, const LayerPlan& lp, bool index_keys,
                const RopeTable& rope, std::vector<Tensor>& keep);
  // Steps of up to this many rows run the compressors as a branch beside the query path.
  static constexpr int64_t kBranchMaxRows = 64;
  Tensor embed_streams(const StepPlan& plan);  // [T, hc, D]
  bool split() const { return comm_ && comm_->world_size() > 1; }
  void emit(const std::string& name, int layer, const Tensor& t) {
    if (dump) dump(name + "-" + std::to_string(layer), t);
  }

  struct DecodeGraph;
  // The next decode step's plan, made while this one runs (step_fixed): the same sequences one
  // position on, tokens and sampling filled in when that step comes; undone (entry counts and pages
  // given back) when the next step is anything else.
  struct NextPlan;
  void plan_next_step(const std::vector<BatchItem>& batch, int bucket);
  void drop_next_plan();
  // ahead: plan for each sequence's position + ahead (the next step, before this one advanced them).
  PlanRequest plan_request(const std::vector<BatchItem>& batch, int64_t ahead = 0);
  PlanRequest fixed_request(const std::vector<BatchItem>& batch, int bucket, int64_t bound, int64_t ahead = 0);
  // A decode batch's fixed shape: its bucket and position bound (bucket 0: not a decode batch).
  std::pair<int, int64_t> fixed_shape(const std::vector<BatchItem>& batch) const;
  StepOutput step_fixed(const std::vector<BatchItem>& batch, int bucket, int64_t bound);

  std::unique_ptr<ModelWeights> weights_;
  Backend& backend_;
  Communicator* comm_;
  DecodeGraphs graph_mode_ = DecodeGraphs::Off;
  std::map<std::pair<int, int64_t>, std::unique_ptr<DecodeGraph>> graphs_;
  uint64_t graphs_epoch_ = 0;  // the backend's recording epoch the recordings were made under
  GraphStats graph_stats_;
  std::vector<LayerState> pad_states_;  // the padding rows' sequence: position 0, never advanced
  std::unique_ptr<NextPlan> next_;
  RopeTable rope_plain_, rope_yarn_;
  std::vector<std::unique_ptr<LayerCaches>> caches_;  // main layers, then MTP layers
  std::vector<std::unique_ptr<Sequence>> seqs_;
};

}  // namespace dsv4
