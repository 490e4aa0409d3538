// cuBLASLt GEMMs of the dense linears (linear_gemm.h: layouts, scale formats, numerics).
#include "backend/cuda/linear_gemm.h"

#include "backend/cuda/linear.h"

#include <cublasLt.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "backend/cuda/act_quant_fp8.h"
#include "core/error.h"
#include "core/log.h"

namespace dsv4::cuda {

// Descriptors of one shape and the heuristic's first (estimated fastest) algorithm.
struct LinearGemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

namespace {

// Hopper's recommended cuBLASLt workspace; the heuristic is told this is all there is.
constexpr size_t kWorkspaceBytes = size_t(32) << 20;
// Pointer alignment every algorithm we take must accept (the default preference, 256, would let the
// heuristic pick algorithms a 16-byte-aligned view could not run).
constexpr uint32_t kMinAlignment = 16;

cublasLtHandle_t lt(void* h) { return static_cast<cublasLtHandle_t>(h); }

// Building a plan: any failing status means "no cuBLASLt for this shape" (the caller falls back).
struct PlanBuilder {
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  const char* step = "";
  bool ok(cublasStatus_t s, const char* what) {
    if (status == CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_SUCCESS) status = s, step = what;
    return status == CUBLAS_STATUS_SUCCESS;
  }
  template <typename T>
  void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& v, const char* what) {
    if (status == CUBLAS_STATUS_SUCCESS) ok(cublasLtMatmulDescSetAttribute(desc, attr, &v, sizeof(v)), what);
  }
  void layout(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld, int32_t batch,
              int64_t batch_stride, const char* what) {
    if (status != CUBLAS_STATUS_SUCCESS) return;
    if (!ok(cublasLtMatrixLayoutCreate(l, type, rows, cols, ld), what) || batch == 1) return;
    ok(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)), what);
    ok(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride,
                                        sizeof(batch_stride)),
       what);
  }
};

// The heuristic's best algorithm for `plan` (C = D: beta is 0), or false. `reductions` limits
// split-K to reductions that keep f32 partials.
bool choose_algorithm(cublasLtHandle_t handle, LinearGemm::Plan& plan, uint32_t reductions, PlanBuilder& pb) {
  cublasLtMatmulPreference_t pref = nullptr;
  if (!pb.ok(cublasLtMatmulPreferenceCreate(&pref), "preference")) return false;
  const uint64_t ws = kWorkspaceBytes;
  pb.ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
        "workspace preference");
  pb.ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions,
                                             sizeof(reductions)),
        "reduction preference");
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    pb.ok(cublasLtMatmulPreferenceSetAttribute(pref, attr, &kMinAlignment, sizeof(kMinAlignment)),
          "alignment preference");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (pb.status == CUBLAS_STATUS_SUCCESS)
    pb.ok(cublasLtMatmulAlgoGetHeuristic(handle, plan.desc, plan.a, plan.b, plan.d, plan.d, pref, 1, &result, &found),
          "heuristic");
  cublasLtMatmulPreferenceDestroy(pref);
  if (pb.status != CUBLAS_STATUS_SUCCESS) return false;
  if (found < 1 || result.state != CUBLAS_STATUS_SUCCESS) {
    pb.status = found < 1 ? CUBLAS_STATUS_NOT_SUPPORTED : result.state;
    pb.step = "heuristic (no algorithm)";
    return false;
  }
  plan.algo = result.algo;
  return true;
}

// One line the first time a kind of GEMM falls back, then only at debug level (a shape list can be long).
void log_fallback(bool& logged, const std::string& what, const PlanBuilder& pb) {
  const std::string line = fmt::format("  cuBLASLt cannot run {} ({}: {}): the CUDA-core kernel runs it", what, pb.step,
                                       cublasLtGetStatusString(pb.status));
  if (!logged) log_info("{}", line);
  else log_debug("{}", line);
  logged = true;
}

// ue8m0 [nb, kb] → f32 [nb, kb4] (zero beyond kb): 2^(e − 127), 0 → 2^-127, 255 → NaN, as the kernels'
// e8m0_to_f32_dev and core/dtypes.h e8m0_to_f32.
__global__ void e8m0_to_f32_padded(const uint8_t* __restrict__ in, int nb, int kb, int kb4, float* __restrict__ out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= nb * kb4) return;
  const int p = i / kb4, b = i % kb4;
  float v = 0.f;
  if (b < kb) {
    const uint8_t e = in[p * kb + b];
    v = e == 255 ? __uint_as_float(0x7fc00000u) : e == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(uint32_t(e) << 23);
  }
  out[i] = v;
}

bool fp8_logged = false, bf16_logged = false;

}  // namespace

LinearPathMode linear_path_mode_from_env() {
  const char* p = std::getenv("DSV4_LINEAR_PATH");
  const std::string v = p ? p : "";
  if (v.empty() || v == "auto") return LinearPathMode::Auto;
  if (v == "kernel") return LinearPathMode::Kernel;
  if (v == "cublaslt") return LinearPathMode::CublasLt;
  fail("DSV4_LINEAR_PATH={}: expected auto, kernel or cublaslt", v);
}

const char* linear_path_mode_name(LinearPathMode mode) {
  switch (mode) {
    case LinearPathMode::Auto: return "auto";
    case LinearPathMode::Kernel: return "kernel";
    case LinearPathMode::CublasLt: return "cublaslt";
  }
  return "?";
}

LinearGemm::LinearGemm() : workspace_(kWorkspaceBytes) {
  cublasLtHandle_t h = nullptr;
  const cublasStatus_t st = cublasLtCreate(&h);
  if (st != CUBLAS_STATUS_SUCCESS) {
    fp8_why_not_ = fmt::format("cublasLtCreate failed ({})", cublasLtGetStatusString(st));
    return;
  }
  handle_ = h;
  int device = 0, major = 0, minor = 0;
  DSV4_CUDA_CHECK(cudaGetDevice(&device));
  DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  // "128-element 1D and 128x128 2D block scaling": compute capability 9.0 only (Blackwell has MX
  // formats instead), from cuBLAS 12.9.
  if (major != 9 || minor != 0)
    fp8_why_not_ = fmt::format("cuBLASLt's 128-block FP8 scaling runs on sm_90 only (this GPU is sm_{}{})", major, minor);
  else if (cublasLtGetVersion() < 120900)
    fp8_why_not_ = fmt::format("cuBLASLt {} predates 128-block FP8 scaling (12.9)", cublasLtGetVersion());
}

LinearGemm::~LinearGemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(lt(handle_));
}

// ---- FP8 block scaling ----

LinearGemm::Plan* LinearGemm::fp8_plan(int64_t rows, int K, int N) {
  if (!fp8_supported() || rows <= 0 || K <= 0 || K % 128 || N <= 0 || N % 8) return nullptr;
  const int64_t m4 = fp8_padded_rows(rows);
  if (m4 > INT_MAX) return nullptr;
  auto [it, inserted] = plans_.try_emplace({0, m4, K, K, 1, N});
  if (!inserted) return it->second.get();
  auto plan = std::make_unique<Plan>();
  PlanBuilder pb;
  if (pb.ok(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor")) {
    pb.set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(CUBLAS_OP_T), "transa");
    pb.set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(CUBLAS_OP_N), "transb");
    pb.set(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F),
           "A scale mode (128x128)");
    pb.set(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F),
           "B scale mode (1x128)");
    // Placeholders for the heuristic (it reads no data): each call sets the real scale pointers.
    const void* placeholder = workspace_.get();
    pb.set(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, placeholder, "A scale pointer");
    pb.set(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, placeholder, "B scale pointer");
  }
  pb.layout(&plan->a, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(N), K, 1, 0, "A layout (weights)");
  pb.layout(&plan->b, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(m4), K, 1, 0, "B layout (activations)");
  pb.layout(&plan->d, CUDA_R_16BF, uint64_t(N), uint64_t(m4), N, 1, 0, "D layout");
  // bf16 output: split-K partials only in f32 (workspace), never reduced in bf16.
  if (pb.status == CUBLAS_STATUS_SUCCESS &&
      choose_algorithm(lt(handle_), *plan, CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE, pb))
    it->second = std::move(plan);
  else
    log_fallback(fp8_logged, fmt::format("FP8 block-scaled [{} × {}] at {} rows", N, K, m4), pb);
  return it->second.get();
}

bool LinearGemm::fp8_block_available(int64_t rows, int K, int N) { return fp8_plan(rows, K, N) != nullptr; }

const float* LinearGemm::fp8_weight_scales(const uint8_t* w_scale, int K, int N, cudaStream_t stream) {
  auto it = weight_scales_.find(w_scale);
  if (it != weight_scales_.end()) return it->second.get();
  // The f32 copy is a device allocation: a recording would fail on it, so say why here.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  DSV4_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
  if (capturing != cudaStreamCaptureStatusNone)
    fail("FP8 linear [{} × {}]: its first cuBLASLt use is inside a CUDA-graph recording (the f32 block scales are "
         "made on first use; a step shape must run once eagerly before it is recorded)",
         N, K);
  const int nb = (N + 127) / 128, kb = K / 128, kb4 = (kb + 3) / 4 * 4;
  DeviceBuffer<float> f32(size_t(nb) * size_t(kb4));
  const int n = nb * kb4;
  e8m0_to_f32_padded<<<(n + 255) / 256, 256, 0, stream>>>(w_scale, nb, kb, kb4, f32.get());
  DSV4_CUDA_CHECK_LAUNCH();
  return weight_scales_.emplace(w_scale, std::move(f32)).first->second.get();
}

void LinearGemm::fp8_block(const uint16_t* x, int64_t rows, int K, const uint8_t* w, const uint8_t* w_scale, int N,
                           uint8_t* act_q, float* act_scale, uint16_t* y, cudaStream_t stream) {
  Plan* plan = fp8_plan(rows, K, N);
  DSV4_CHECK(plan, "LinearGemm::fp8_block: no cuBLASLt plan for [{} × {}] at {} rows (check fp8_block_available)", N,
             K, rows);
  const float* sw = fp8_weight_scales(w_scale, K, N, stream);
  const int64_t m4 = fp8_padded_rows(rows);
  act_quant_fp8_mn_major(x, int(rows), int(m4), K, act_q, act_scale, stream);
  DSV4_CUDA_CHECK_LAUNCH();
  PlanBuilder pb;
  const void* a_scale = sw;
  const void* b_scale = act_scale;
  pb.set(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale, "A scale pointer");
  pb.set(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale, "B scale pointer");
  const float alpha = 1.f, beta = 0.f;
  if (pb.status == CUBLAS_STATUS_SUCCESS)
    pb.ok(cublasLtMatmul(lt(handle_), plan->desc, &alpha, w, plan->a, act_q, plan->b, &beta, y, plan->d, y, plan->d,
                         &plan->algo, workspace_.get(), workspace_.bytes(), stream),
          "cublasLtMatmul");
  if (pb.status != CUBLAS_STATUS_SUCCESS)
    fail("FP8 linear [{} × {}] at {} rows: cuBLASLt {} failed: {}", N, K, rows, pb.step,
         cublasLtGetStatusString(pb.status));
}

// ---- bf16 ----

bool LinearGemm::bf16_aligned(const void* x, const void* w, const void* y) {
  auto a16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return a16(x) && a16(w) && a16(y);
}

LinearGemm::Plan* LinearGemm::bf16_plan(int64_t rows, int K, int64_t x_row_stride, int groups, int N, bool y_f32) {
  if (!handle_ || rows <= 0 || rows > INT_MAX || K <= 0 || groups <= 0 || N <= 0 || N % groups) return nullptr;
  const int R = N / groups;  // outputs per group
  // 16-byte columns and group offsets (8 bf16; the f32 output's R·4 bytes then too).
  if (K % 8 || x_row_stride % 8 || R % 8 || x_row_stride < int64_t(groups) * K) return nullptr;
  auto [it, inserted] = plans_.try_emplace({y_f32 ? 2 : 1, rows, K, x_row_stride, groups, N});
  if (!inserted) return it->second.get();
  auto plan = std::make_unique<Plan>();
  PlanBuilder pb;
  if (pb.ok(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor")) {
    pb.set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(CUBLAS_OP_T), "transa");
    pb.set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(CUBLAS_OP_N), "transb");
  }
  // Group g: A = rows g·R … of w (K × R, ld K), B = columns g·K … of each x row (K × M, ld = the row
  // stride), D = columns g·R … of y (R × M, ld N): a strided batch of `groups` GEMMs.
  pb.layout(&plan->a, CUDA_R_16BF, uint64_t(K), uint64_t(R), K, groups, int64_t(R) * K, "A layout (weights)");
  pb.layout(&plan->b, CUDA_R_16BF, uint64_t(K), uint64_t(rows), x_row_stride, groups, K, "B layout (activations)");
  pb.layout(&plan->d, y_f32 ? CUDA_R_32F : CUDA_R_16BF, uint64_t(R), uint64_t(rows), N, groups, R, "D layout");
  // A bf16 output must not receive split-K partials reduced in bf16 (in place or in the output type).
  const uint32_t reductions = y_f32 ? uint32_t(CUBLASLT_REDUCTION_SCHEME_MASK) : uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
  if (pb.status == CUBLAS_STATUS_SUCCESS && choose_algorithm(lt(handle_), *plan, reductions, pb))
    it->second = std::move(plan);
  else
    log_fallback(bf16_logged,
                 fmt::format("bf16 [{} × {}]{} → {} at {} rows", N, K, groups > 1 ? fmt::format(" in {} groups", groups) : "",
                             y_f32 ? "f32" : "bf16", rows),
                 pb);
  return it->second.get();
}

bool LinearGemm::bf16_available(int64_t rows, int K, int64_t x_row_stride, int groups, int N, bool y_f32) {
  return bf16_plan(rows, K, x_row_stride, groups, N, y_f32) != nullptr;
}

void LinearGemm::bf16(const uint16_t* x, int64_t rows, int K, int64_t x_row_stride, int groups, const uint16_t* w,
                      int N, void* y, bool y_f32, cudaStream_t stream) {
  Plan* plan = bf16_plan(rows, K, x_row_stride, groups, N, y_f32);
  DSV4_CHECK(plan, "LinearGemm::bf16: no cuBLASLt plan for [{} × {}] at {} rows (check bf16_available)", N, K, rows);
  DSV4_CHECK(bf16_aligned(x, w, y), "LinearGemm::bf16: x, w and y must be 16-byte aligned");
  const float alpha = 1.f, beta = 0.f;
  const cublasStatus_t st = cublasLtMatmul(lt(handle_), plan->desc, &alpha, w, plan->a, x, plan->b, &beta, y, plan->d,
                                           y, plan->d, &plan->algo, workspace_.get(), workspace_.bytes(), stream);
  if (st != CUBLAS_STATUS_SUCCESS)
    fail("bf16 linear [{} × {}] at {} rows: cublasLtMatmul failed: {}", N, K, rows, cublasLtGetStatusString(st));
}

void LinearGemm::fp8_via_bf16(const uint16_t* x, int64_t rows, int K, const uint8_t* w, const uint8_t* w_scale, int N,
                              uint8_t* act_q, float* act_scale, uint16_t* x_bf16, uint16_t* w_bf16, void* y,
                              cudaStream_t stream, bool y_f32) {
  DSV4_CHECK(rows > 0 && rows <= INT_MAX && K % 128 == 0, "LinearGemm::fp8_via_bf16: {} rows, K {}", rows, K);
  act_quant_fp8(x, int(rows), K, act_q, act_scale, stream);
  DSV4_CUDA_CHECK_LAUNCH();
  fp8_rows_to_bf16(act_q, act_scale, rows, K, x_bf16, stream);
  fp8_weight_via_bf16(x_bf16, rows, K, w, w_scale, N, w_bf16, y, stream, y_f32);
}

void LinearGemm::fp8_weight_via_bf16(const uint16_t* x_bf16, int64_t rows, int K, const uint8_t* w,
                                     const uint8_t* w_scale, int N, uint16_t* w_bf16, void* y, cudaStream_t stream,
                                     bool y_f32) {
  fp8_weight_to_bf16(w, w_scale, N, K, w_bf16, stream);
  bf16(x_bf16, rows, K, K, 1, w_bf16, N, y, y_f32, stream);
}

}  // namespace dsv4::cuda
