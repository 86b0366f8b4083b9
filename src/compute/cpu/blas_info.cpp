// Which OpenBLAS kernels run, whether they suit this CPU, and a numerical self-check of them.
#include "distmuon/blas_info.h"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "distmuon/compute.h"
#include "distmuon/matrix.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace distmuon {
namespace {

// What a core's kernels use, in order; kUnknown for names distmuon does not rank.
enum class Isa { kUnknown, kBase, kAvx, kAvx2, kAvx512 };

struct CoreIsa {
  std::string_view name;
  Isa isa;
};

// OpenBLAS's x86-64 core names (driver/others/dynamic.c, OPENBLAS_CORETYPE), by the widest
// instructions their sgemm kernels use.
constexpr std::array kCores = {
    CoreIsa{"Katmai", Isa::kBase},       CoreIsa{"Coppermine", Isa::kBase},
    CoreIsa{"Northwood", Isa::kBase},    CoreIsa{"Prescott", Isa::kBase},
    CoreIsa{"Banias", Isa::kBase},       CoreIsa{"Atom", Isa::kBase},
    CoreIsa{"Core2", Isa::kBase},        CoreIsa{"Penryn", Isa::kBase},
    CoreIsa{"Dunnington", Isa::kBase},   CoreIsa{"Nehalem", Isa::kBase},
    CoreIsa{"Athlon", Isa::kBase},       CoreIsa{"Opteron", Isa::kBase},
    CoreIsa{"Opteron_SSE3", Isa::kBase}, CoreIsa{"Barcelona", Isa::kBase},
    CoreIsa{"Nano", Isa::kBase},         CoreIsa{"Bobcat", Isa::kBase},
    CoreIsa{"Sandybridge", Isa::kAvx},   CoreIsa{"Bulldozer", Isa::kAvx},
    CoreIsa{"Piledriver", Isa::kAvx},    CoreIsa{"Steamroller", Isa::kAvx},
    CoreIsa{"Excavator", Isa::kAvx},     CoreIsa{"Haswell", Isa::kAvx2},
    CoreIsa{"Zen", Isa::kAvx2},          CoreIsa{"SkylakeX", Isa::kAvx512},
    CoreIsa{"Cooperlake", Isa::kAvx512}, CoreIsa{"SapphireRapids", Isa::kAvx512},
};

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

Isa core_isa(std::string_view core) {
  for (const CoreIsa& c : kCores) {
    if (iequals(c.name, core)) return c.isa;
  }
  return Isa::kUnknown;
}

Isa cpu_isa(const CpuFeatures& cpu) {
  if (cpu.vendor.empty()) return Isa::kUnknown;
  if (cpu.avx512f && cpu.avx512vl && cpu.avx512bw && cpu.avx512dq && cpu.avx512cd)
    return Isa::kAvx512;
  if (cpu.avx2 && cpu.fma) return Isa::kAvx2;
  if (cpu.avx) return Isa::kAvx;
  return Isa::kBase;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "AVX-512";
    case Isa::kAvx2:
      return "AVX2";
    case Isa::kAvx:
      return "AVX";
    default:
      return "SSE";
  }
}

CpuFeatures probe_cpu() {
  CpuFeatures f;
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return f;
  char id[13] = {};
  std::memcpy(id, &b, 4);
  std::memcpy(id + 4, &d, 4);
  std::memcpy(id + 8, &c, 4);
  const std::string_view vendor(id);
  f.vendor = vendor == "GenuineIntel"   ? "intel"
             : vendor == "AuthenticAMD" ? "amd"
             : vendor == "HygonGenuine" ? "hygon"
                                        : "other";
  if (__get_cpuid(1, &a, &b, &c, &d) != 0) {
    f.family = static_cast<int>((a >> 8) & 0xf);
    f.model = static_cast<int>((a >> 4) & 0xf);
    if (f.family == 6 || f.family == 15) f.model += static_cast<int>((a >> 16) & 0xf) << 4;
    if (f.family == 15) f.family += static_cast<int>((a >> 20) & 0xff);
  }
  // libgcc's probe: a feature is reported only when XGETBV shows the OS saving its state.
  __builtin_cpu_init();
  f.avx = __builtin_cpu_supports("avx");
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512cd = __builtin_cpu_supports("avx512cd");
#endif
  return f;
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// The marker's CORE ("done:Prescott" -> "Prescott") and, for "failed", its reason.
std::string_view marker_field(std::string_view marker, int field) {
  for (int i = 0; i < field; ++i) {
    const auto colon = marker.find(':');
    if (colon == std::string_view::npos) return {};
    marker.remove_prefix(colon + 1);
  }
  return field < 2 ? marker.substr(0, marker.find(':')) : marker;
}

// n deterministic values in [-1, 1) (a 64-bit LCG), so that the self-check is the same everywhere.
std::vector<float> pseudo_random(Index n, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::uint64_t s = seed;
  for (float& x : v) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    x = static_cast<float>(static_cast<double>(s >> 40) / static_cast<double>(1ULL << 23) - 1.0);
  }
  return v;
}

// C = alpha op(A) op(B) + beta C0 (or alpha op(A) op(A)^T + beta C0 for syrk, m == n) against
// double, per element within 2 (k + 2) u (|alpha| (|A||B|)_ij + |beta| |C0_ij|).
std::optional<std::string> check_product(bool syrk, Trans ta, Trans tb, Index m, Index n, Index k,
                                         float alpha, float beta) {
  const Index ar = ta == Trans::kYes ? k : m, ac = ta == Trans::kYes ? m : k;
  const Index br = tb == Trans::kYes ? n : k, bc = tb == Trans::kYes ? k : n;
  const Matrix a(ar, ac, pseudo_random(ar * ac, 1));
  const Matrix b(br, bc, pseudo_random(br * bc, 2));
  Matrix c(m, n, pseudo_random(m * n, 3));
  if (syrk) {  // a symmetric start: syrk reads and writes one triangle, distmuon mirrors it
    for (Index i = 0; i < m; ++i)
      for (Index j = 0; j < i; ++j)
        c(i, j) = c(j, i);
  }
  const Matrix c0 = Matrix::from(c.view());
  auto at = [&](const Matrix& x, Trans t, Index i, Index j) {
    return static_cast<double>(t == Trans::kYes ? x(j, i) : x(i, j));
  };
  if (syrk) {
    cpu_compute().syrk(ta, alpha, a.view(), beta, c.view());
  } else {
    cpu_compute().gemm(ta, tb, alpha, a.view(), b.view(), beta, c.view());
  }
  constexpr double kUnit = 1.0 / (1 << 24);
  for (Index i = 0; i < m; ++i) {
    for (Index j = 0; j < n; ++j) {
      double ref = 0, mag = 0;
      for (Index p = 0; p < k; ++p) {
        const double x = at(a, ta, i, p);
        const double y = syrk ? at(a, ta, j, p) : at(b, tb, p, j);
        ref += x * y;
        mag += std::abs(x * y);
      }
      ref = alpha * ref + beta * static_cast<double>(c0(i, j));
      const double bound =
          2.0 * static_cast<double>(k + 2) * kUnit *
          (std::abs(alpha) * mag + std::abs(beta) * std::abs(static_cast<double>(c0(i, j))));
      const double err = std::abs(static_cast<double>(c(i, j)) - ref);
      if (!(err <= bound)) {
        return fmt::format(
            "{}(op(a) {}, {}{}alpha {}, beta {}): element ({}, {}) is {}, expected {} "
            "(error {:.3g} > bound {:.3g})",
            syrk ? "ssyrk" : "sgemm", shape_str(m, k), ta == Trans::kYes ? "a transposed, " : "",
            !syrk && tb == Trans::kYes ? "b transposed, " : "", alpha, beta, i, j, c(i, j), ref,
            err, bound);
      }
    }
  }
  return std::nullopt;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = probe_cpu();
  return features;
}

std::optional<std::string> recommended_blas_core(std::string_view core, const CpuFeatures& cpu) {
  const Isa have = core_isa(core), can = cpu_isa(cpu);
  if (have == Isa::kUnknown || can == Isa::kUnknown || have >= can) return std::nullopt;
  switch (can) {
    case Isa::kAvx512:
      return "SkylakeX";
    case Isa::kAvx2:
      return cpu.vendor == "amd" || cpu.vendor == "hygon" ? "Zen" : "Haswell";
    case Isa::kAvx:
      return "Sandybridge";
    default:
      return std::nullopt;
  }
}

std::string blas_core() {
  const char* name = openblas_get_corename();
  return name ? name : "unknown";
}

BlasInfo blas_info() {
  BlasInfo info;
  const char* config = openblas_get_config();
  info.config = config ? config : "";
  const auto first_space = info.config.find(' ');
  const auto second_space =
      first_space == std::string::npos ? first_space : info.config.find(' ', first_space + 1);
  info.library = info.config.substr(0, second_space);
  if (info.library.empty()) info.library = "OpenBLAS";
  info.dynamic_arch = info.config.find("DYNAMIC_ARCH") != std::string::npos;
  info.core = blas_core();
  info.threads = blas_threads();
  return info;
}

std::string blas_summary() {
  const BlasInfo info = blas_info();
  std::string out = fmt::format("{}, core {}, {} thread{}", info.library, info.core, info.threads,
                                info.threads == 1 ? "" : "s");
  const std::string marker = env_or_empty(kBlasFixMarker);
  if (marker.starts_with("done:") && iequals(env_or_empty("OPENBLAS_CORETYPE"), info.core)) {
    out += fmt::format(" (OPENBLAS_CORETYPE set by distmuon; OpenBLAS chose {})",
                       marker_field(marker, 1));
  }
  return out;
}

std::optional<std::string> blas_core_warning() {
  const BlasInfo info = blas_info();
  const CpuFeatures& cpu = cpu_features();
  const auto better = recommended_blas_core(info.core, cpu);
  if (!better) return std::nullopt;
  std::string out = fmt::format(
      "{} runs its {} kernels on this CPU ({} family {} model {}, {}): sgemm runs several times "
      "slower than with its {} kernels",
      info.library, info.core, cpu.vendor, cpu.family, cpu.model, isa_name(cpu_isa(cpu)), *better);
  const std::string marker = env_or_empty(kBlasFixMarker);
  const std::string user = env_or_empty("OPENBLAS_CORETYPE");
  if (!info.dynamic_arch) {
    out +=
        "; this OpenBLAS build cannot switch kernels (no DYNAMIC_ARCH): install one built for "
        "this CPU";
  } else if (marker.starts_with("failed:")) {
    out += fmt::format(
        "; distmuon tried them and their self-check failed ({}), so it kept these; "
        "OPENBLAS_CORETYPE={} forces them",
        marker_field(marker, 2), *better);
  } else if (!user.empty()) {
    out +=
        fmt::format("; OPENBLAS_CORETYPE={} is set: OPENBLAS_CORETYPE={} selects the faster ones",
                    user, *better);
  } else {
    out += fmt::format(
        "; set OPENBLAS_CORETYPE={} in the environment before the program starts (the distmuon "
        "command does so itself after a self-check unless {}=1)",
        *better, kBlasFixOff);
  }
  return out;
}

std::optional<std::string> blas_self_check() {
  // Sizes not multiples of any kernel's register block, and k above the usual k-blocking (256..512)
  // so that the packed panels and the edge kernels all run.
  for (const Trans ta : {Trans::kNo, Trans::kYes}) {
    for (const Trans tb : {Trans::kNo, Trans::kYes}) {
      if (auto failure = check_product(false, ta, tb, 67, 45, 129, 1.0f, 0.0f)) return failure;
    }
    if (auto failure = check_product(true, ta, ta, 83, 83, 131, 1.0f, 0.0f)) return failure;
  }
  if (auto failure = check_product(false, Trans::kNo, Trans::kYes, 97, 161, 1031, -0.5f, 2.0f))
    return failure;
  if (auto failure = check_product(true, Trans::kNo, Trans::kNo, 150, 150, 777, 0.25f, -1.0f))
    return failure;
  return std::nullopt;
}

}  // namespace distmuon
