// Precision names and the operand rounding the CPU backends emulate (precision.h).
#include "distmuon/precision.h"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>

#include "compute/precision_names.h"
#include "distmuon/error.h"

namespace distmuon {

Precision parse_precision(std::string_view name) {
  return detail::parse_enum<Precision>(name, "precision");
}

const char* to_string(Precision precision) {
  return detail::name_of(precision);
}

const char* precision_names() {
  static const std::string names = detail::enum_name_list<Precision>();
  return names.c_str();
}

float round_to(Precision precision, float v) {
  if (precision == Precision::kFp32 || !std::isfinite(v)) return v;
  const auto bits = std::bit_cast<std::uint32_t>(v);
  std::uint32_t out = 0;
  if (precision == Precision::kBf16) {
    // Round to nearest even on the 16 dropped bits (what __float2bfloat16 does on the GPU). A
    // value that rounds past the largest bf16 becomes Inf, as on the GPU.
    out = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  } else {
    // TF32 keeps 10 of fp32's 23 stored mantissa bits. cuBLAS does not document its conversion;
    // CUTLASS's float -> tfloat32_t converter and the PTX instruction kernels use for it,
    // cvt.rna.tf32.f32, round to nearest with ties away from zero (PTX ISA, "cvt"): add half of
    // the last kept bit to the magnitude and clear the 13 dropped bits. (A kernel that feeds raw
    // fp32 bits to the tensor cores truncates instead, at most twice this error per operand.)
    out = (bits + 0x1000u) & 0xffffe000u;
  }
  return std::bit_cast<float>(out);
}

}  // namespace distmuon
