// Storage formats of the checkpoint's weight classes (DESIGN §3.7). In core because both the
// checkpoint reader (which detects them) and the backend (whose ops take them) name them.
#pragma once

namespace dsv4 {

enum class WeightFormat { BF16, FP8_BLOCK, MXFP4, NVFP4 };

inline const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::BF16: return "bf16";
    case WeightFormat::FP8_BLOCK: return "fp8 e4m3 (128x128 ue8m0 block scales)";
    case WeightFormat::MXFP4: return "mxfp4 (e2m1 + ue8m0 per 32)";
    case WeightFormat::NVFP4: return "nvfp4 (e2m1 + e4m3 per 16 + f32 global scale)";
  }
  return "?";
}

}  // namespace dsv4
