// The host's part of a step, all of it done before the step runs (DESIGN §3.2): the batch's rows
// and spans, the cache pages every layer will write reserved in advance, and one descriptor —
// uploaded once — holding everything the step's ops index by (token ids, positions, spans, block
// tables, sampling parameters). The step itself reads only the descriptor and what step_indices
// derives from it, so it never waits for the host and can be recorded once and replayed. The
// scheduler speaks the same language: a step is a set of spans with pages already reserved.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/kv_pool.h"

namespace dsv4 {

// What a step is asked to do, before planning.
struct PlanRequest {
  struct Span {
    std::vector<int32_t> tokens;
    int64_t pos0 = 0;
    std::vector<LayerState*> states;  // this sequence's state in each planned layer
  };
  struct Layer {
    int ratio = 0;  // 0 (SWA), 4 (CSA) or 128 (HCA)
    LayerCaches* caches = nullptr;
  };
  std::vector<Span> spans;
  std::vector<Layer> layers;       // the layers the step runs, in order
  std::vector<int32_t> head_rows;  // rows whose final streams go through the head
  // Rows of the head's output to sample from, with their parameters and draw counters.
  std::vector<int32_t> sample_rows;
  std::vector<SamplingParams> sample_params;
  std::vector<uint64_t> sample_counters;
  // Penalties on sampled rows (entries: sample row, token id, output count; ids distinct per row)
  // and the sample rows whose raw logprobs are wanted, with the most alternatives any asks for.
  std::vector<PenaltyParams> penalty_params;  // per sample row, when any entry exists
  std::vector<int32_t> penalty_rows, penalty_ids, penalty_counts;
  std::vector<int32_t> logprob_rows;
  int top_logprobs = 0;
  int hc_mult = 1, window = 0, index_topk = 0;
  // A fixed-shape plan (a recorded step replayed for other steps): every size the step's work is
  // laid out by — block-table widths, the compressed part of the lists, indexer keys, the rows of
  // completed entries — is a function of the spans' row counts and this bound on their positions
  // (every span ends at or below it), never of the positions themselves. 0: exact sizes.
  int64_t context_capacity = 0;
  // Where the forward part of the descriptor goes (a recording's own buffer, exactly the size a
  // plan of this shape needs); empty: a new upload. The sampling part is always a new upload: it
  // is read by the ops after the recorded part.
  Tensor descriptor;
};

// One planned layer: device views of its block tables and the sizes the host knows.
struct LayerPlan {
  int ratio = 0;
  Tensor window, compressed, keys;  // I32 [S, width]: ring pages, compressed-entry pages, indexer-key pages
  Tensor scratch;                   // I32 [pages]: where the step's new entries go before the ring update
  Tensor compressor_slots, index_compressor_slots;  // I32 [S]: each span's compressor state slots
  int64_t completed = 0;            // rows of completed compressed entries (and, CSA, indexer keys): exact,
                                    // or a fixed-shape plan's bound (the rows past the step's entries pad)
  int64_t max_span_rows = 0;        // the longest span
  int64_t comp_len = 0;             // compressed part of the attention lists
  int max_keys = 0;                 // most indexer keys a row sees
  std::vector<int32_t> scratch_pages;  // host copy, returned to the pool by release_step_plan
  LayerCaches* caches = nullptr;
  std::vector<LayerState*> states;     // per span (the compressors' running state lives there)
};

struct StepPlan {
  struct Span {
    int64_t row0 = 0, n = 0, pos0 = 0;
  };
  std::vector<Span> spans;
  int64_t rows = 0;
  Tensor descriptor;       // the forward's part of the upload (every Tensor below up to the
                           // layers is a view of it or of `sampling`)
  Tensor sampling;         // the sampling part (sample rows onwards): a separate upload when
                           // the forward part went to a given buffer, else a view of the one upload
  int64_t descriptor_words = 0;  // the forward part's size (a fixed shape's signature)
  StepTables tables;       // spans, row → span, positions
  Tensor tokens;           // I32 [T]
  Tensor stream_tokens;    // I32 [T · hc]: the token of each hyper-connection stream row
  Tensor head_rows;        // I32 [P]
  Tensor sample_rows;      // I32 [R]
  bool sample_all_rows = false;  // sample_rows is 0..P−1: the head's output is sampled as it is
  Tensor sample_params;    // SamplingParams [R] as bytes
  Tensor sample_counters;  // U64 [R] as bytes
  bool penalties = false;
  Tensor penalty_params, penalty_rows, penalty_ids, penalty_counts;  // PenaltyParams [R] as bytes; I32 [n]
  Tensor logprob_rows;     // I32 [L]: sample rows
  int top_logprobs = 0;
  std::vector<LayerPlan> layers;
};

// Reserves the pages the step will write (advancing each state's entry counts) and uploads the
// descriptor.
StepPlan build_step_plan(Backend& backend, const PlanRequest& request);
// For a plan made before its step's tokens and sampling were known (Dsv4Model plans the next decode
// step while the current one runs): the token ids (one per row; their hyper-connection stream copies
// follow), and a new sampling part from `request`'s sampling fields (its head rows must be the
// plan's). Both are uploads ordered after the work already enqueued.
void replan_tokens(Backend& backend, StepPlan& plan, const std::vector<int32_t>& tokens, int hc_mult);
void replan_sampling(Backend& backend, const PlanRequest& request, StepPlan& plan);
// Returns the step's scratch pages; call once the step's work is enqueued (pages are reused only
// by later work on the same stream).
void release_step_plan(StepPlan& plan);

}  // namespace dsv4
