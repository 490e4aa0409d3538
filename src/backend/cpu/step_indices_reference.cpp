#include "backend/cpu/step_indices_reference.h"

#include <algorithm>

#include "backend/kv_cache_layout.h"
#include "core/error.h"

namespace dsv4::cpu {

namespace {
constexpr int64_t kPage = kv_layout::kEntriesPerPage;

int32_t table_entry(const int32_t* table, int64_t width, int64_t span, int64_t j) {
  DSV4_CHECK(j / kPage < width, "step_indices: entry {} beyond a block table of {} pages", j, width);
  return int32_t(int64_t(table[span * width + j / kPage]) * kPage + j % kPage);
}
}  // namespace

StepIndexArrays step_index_arrays(const StepIndexArgs& args) {
  DSV4_CHECK(args.step, "step_indices: no step tables");
  StepIndexArrays a;
  a.kind = args.kind;
  a.rows = args.step->positions.numel();
  a.spans = args.step->spans.rows();
  a.span_table = args.step->spans.ptr<int32_t>();
  a.row_span = args.step->row_span.ptr<int32_t>();
  a.positions = args.step->positions.ptr<int32_t>();
  a.window = args.window.ptr<int32_t>();
  a.window_width = args.window.rows() ? args.window.numel() / args.window.rows() : 0;
  a.compressed = args.compressed.ptr<int32_t>();
  a.compressed_width = args.compressed.rows() ? args.compressed.numel() / args.compressed.rows() : 0;
  a.scratch = args.scratch.ptr<int32_t>();
  a.topk = args.topk ? args.topk->ptr<int32_t>() : nullptr;
  a.ratio = args.ratio;
  a.window_size = args.window_size;
  a.count = args.count;
  return a;
}

int64_t step_indices_size(const StepIndexArrays& a) {
  switch (a.kind) {
    case StepIndexKind::AttentionLists: return a.rows * (a.window_size + a.count);
    case StepIndexKind::CompressedEntries:
    case StepIndexKind::CompressedPositions: return a.count;
    default: return a.rows;
  }
}

void step_indices_reference(const StepIndexArrays& a, int32_t* out) {
  const int W = a.window_size;
  auto span_of = [&](int64_t r, int64_t& row0, int64_t& n, int64_t& pos0) {
    const int64_t s = a.row_span[r];
    DSV4_CHECK(s >= 0 && s < a.spans, "step_indices: row {} in span {} of {}", r, s, a.spans);
    row0 = a.span_table[s * 3], n = a.span_table[s * 3 + 1], pos0 = a.span_table[s * 3 + 2];
    return s;
  };
  auto scratch_entry = [&](int64_t r) { return int32_t(int64_t(a.scratch[r / kPage]) * kPage + r % kPage); };
  switch (a.kind) {
    case StepIndexKind::NewEntries:
      for (int64_t r = 0; r < a.rows; ++r) out[r] = scratch_entry(r);
      return;
    case StepIndexKind::RingSlots:
      for (int64_t r = 0; r < a.rows; ++r) {
        int64_t row0, n, pos0;
        const int64_t s = span_of(r, row0, n, pos0), i = r - row0;
        out[r] = i >= n - W ? table_entry(a.window, a.window_width, s, (pos0 + i) % W) : -1;
      }
      return;
    case StepIndexKind::KeyCounts:
      for (int64_t r = 0; r < a.rows; ++r) out[r] = int32_t((int64_t(a.positions[r]) + 1) / a.ratio);
      return;
    case StepIndexKind::AttentionLists: {
      const int64_t C = a.count, L = W + C;
      for (int64_t r = 0; r < a.rows; ++r) {
        int64_t row0, n, pos0;
        const int64_t s = span_of(r, row0, n, pos0), pos = a.positions[r];
        int32_t* list = out + r * L;
        std::fill_n(list, L, -1);
        int slot = 0;
        for (int64_t p = std::max<int64_t>(0, pos - W + 1); p <= pos; ++p, ++slot)
          list[slot] = p >= pos0 ? scratch_entry(row0 + (p - pos0)) : table_entry(a.window, a.window_width, s, p % W);
        if (a.ratio == 4) {
          for (int64_t k = 0; k < C; ++k) {
            const int32_t j = a.topk[r * C + k];
            list[W + k] = j >= 0 ? table_entry(a.compressed, a.compressed_width, s, j) : -1;
          }
        } else if (a.ratio == 128) {
          const int64_t have = (pos + 1) / 128;
          DSV4_CHECK(have <= C, "step_indices: row {} sees {} compressed entries, lists hold {}", r, have, C);
          for (int64_t j = 0; j < have; ++j) list[W + j] = table_entry(a.compressed, a.compressed_width, s, j);
        }
      }
      return;
    }
    case StepIndexKind::CompressedEntries:
    case StepIndexKind::CompressedPositions: {
      int64_t e = 0;
      for (int64_t s = 0; s < a.spans; ++s) {
        const int64_t n = a.span_table[s * 3 + 1], pos0 = a.span_table[s * 3 + 2];
        for (int64_t j = pos0 / a.ratio; j < (pos0 + n) / a.ratio; ++j, ++e) {
          DSV4_CHECK(e < a.count, "step_indices: more than {} completed entries", a.count);
          out[e] = a.kind == StepIndexKind::CompressedPositions ? int32_t(a.ratio * j)
                                                                : table_entry(a.compressed, a.compressed_width, s, j);
        }
      }
      // A fixed-shape step pads: no entry, position 0.
      for (; e < a.count; ++e) out[e] = a.kind == StepIndexKind::CompressedPositions ? 0 : -1;
      return;
    }
  }
}

}  // namespace dsv4::cpu
