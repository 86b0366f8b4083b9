// `distmuon calibrate`'s measurements and the profile built from them.
#include "distmuon/calibrate.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>

#include "core/host.h"
#include "distmuon/agreement.h"
#include "distmuon/error.h"
#include "distmuon/topology.h"

namespace distmuon {
namespace {

// The host's name, or "unknown-host" when gethostname fails (on any rank: rank 0's is shared).
std::string host_name_or_unknown() {
  try {
    return detail::host_name();
  } catch (const Error&) {
    return "unknown-host";
  }
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32] = {};
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Payload sizes from min to max, factor apart, each rounded up to a whole number of f32 elements
// (times the group size for an all-gather).
std::vector<std::size_t> payloads(const CalibrateOptions& o, std::size_t unit) {
  std::vector<std::size_t> out;
  for (std::size_t b = o.min_bytes; b <= o.max_bytes; b *= static_cast<std::size_t>(o.factor)) {
    const std::size_t rounded = (b + unit - 1) / unit * unit;
    if (out.empty() || rounded > out.back()) out.push_back(rounded);
  }
  return out;
}

// Times of the elementwise passes NS makes, over a rows x 1024 matrix.
struct ElementwiseTimes {
  TimingSummary sum_squares, scale, axpby, fill;
  double elements = 0, fill_elements = 0;
};
ElementwiseTimes measure_elementwise(const Communicator& group, Index elements,
                                     const TimingOptions& timing, Compute& compute) {
  const Index cols = std::min<Index>(elements, 1024);
  const Index rows = (elements + cols - 1) / cols;
  Matrix x(rows, cols), y(rows, cols);
  std::fill(x.values().begin(), x.values().end(), 1.0f);
  std::fill(y.values().begin(), y.values().end(), 2.0f);
  ElementwiseTimes t;
  t.elements = static_cast<double>(rows * cols);
  t.fill_elements = t.elements;
  double sink = 0;
  t.sum_squares =
      time_on_group(group, timing, [&] { sink += compute.sum_squares(x.view(), true); });
  t.scale = time_on_group(group, timing, [&] { compute.scale(y.view(), 0.5f); });
  t.axpby = time_on_group(group, timing, [&] { compute.axpby(0.5f, x.view(), 2.0f, y.view()); });
  // Fresh buffers: NS and the optimizer allocate several large zero-filled matrices per call,
  // which the allocator serves from newly mapped pages, so each fill pays its page faults. Measured
  // on pages mapped for the purpose, independently of the allocator's state.
  const std::size_t fill_bytes = static_cast<std::size_t>(rows * cols) * sizeof(float);
  t.fill = time_on_group(group, timing, [&] {
    void* p = mmap(nullptr, fill_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      throw Error(fmt::format("calibrate: mmap of {} bytes failed on rank {}: {}", fill_bytes,
                              group.rank(), std::strerror(errno)));
    }
    std::memset(p, 0, fill_bytes);
    sink += static_cast<const float*>(p)[0] + 1;
    if (munmap(p, fill_bytes) != 0) {
      throw Error(fmt::format("calibrate: munmap failed on rank {}: {}", group.rank(),
                              std::strerror(errno)));
    }
  });
  DISTMUON_ASSERT(sink > 0, "sum of squares of ones");
  return t;
}

}  // namespace

double CalibrateOptions::memory_bytes(int group_size) const {
  const double s = sizes.empty() ? 0.0 : static_cast<double>(sizes.back());
  const double g = std::max(group_size, 1);
  // sgemm l x s times s x s into l x s, ssyrk of an s x l matrix into s x s: four s^2 matrices
  // at most; the all-gather's send buffer and g receive buffers; x and y of the elementwise pass.
  return sizeof(float) * (4 * s * s + 2 * static_cast<double>(elementwise_elements)) +
         (g + 1) * static_cast<double>(max_bytes);
}

void CalibrateOptions::validate() const {
  const auto bad = [](const std::string& why) { throw Error("calibrate: " + why); };
  if (name.empty()) bad("the profile name is empty");
  if (sizes.empty()) bad("no sgemm/ssyrk sizes");
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 1 || (i > 0 && sizes[i] <= sizes[i - 1]))
      bad(fmt::format("sizes must be positive and ascending, got [{}]", fmt::join(sizes, ", ")));
    if (sizes[i] > kMaxCalibrateSize)
      bad(fmt::format("size {} is larger than the largest calibrated, {}", sizes[i],
                      kMaxCalibrateSize));
  }
  if (min_bytes < 1 || max_bytes < min_bytes)
    bad(fmt::format("collective sizes {} .. {} bytes are not a range", min_bytes, max_bytes));
  if (max_bytes > kMaxCalibrateBytes)
    bad(fmt::format("the largest collective payload {} bytes is more than {} (1 GiB)", max_bytes,
                    kMaxCalibrateBytes));
  if (factor < 2) bad(fmt::format("the size factor must be >= 2, got {}", factor));
  if (elementwise_elements < 1) bad("the elementwise buffer must hold at least one element");
  for (const TimingOptions* t : {&compute_timing, &comm_timing}) {
    if (t->warmup < 0 || t->reps < 1)
      bad(fmt::format("warm-up {} must be >= 0 and reps {} >= 1", t->warmup, t->reps));
  }
}

LineFit fit_latency_bandwidth(const std::vector<CollectiveRate>& sweep) {
  if (sweep.empty()) throw Error("fit_latency_bandwidth: no measurements");
  // Weighted least squares with weights 1 / t^2 (relative error).
  double s0 = 0, s1 = 0, s2 = 0, t0 = 0, t1 = 0;
  for (const CollectiveRate& p : sweep) {
    const double x = static_cast<double>(p.bytes), t = p.time.median_s;
    if (!(t > 0)) throw Error(fmt::format("fit_latency_bandwidth: time {} s at {} B", t, p.bytes));
    const double w = 1.0 / (t * t);
    s0 += w;
    s1 += w * x;
    s2 += w * x * x;
    t0 += w * t;
    t1 += w * x * t;
  }
  LineFit f;
  const double det = s0 * s2 - s1 * s1;
  if (sweep.size() >= 2 && det > 0) {
    f.a_s = (t0 * s2 - s1 * t1) / det;
    f.b_s_per_byte = (s0 * t1 - s1 * t0) / det;
  }
  if (f.a_s < 0) {  // through the origin: minimise sum (b x_i / t_i - 1)^2
    f.a_s = 0;
    f.b_s_per_byte = t1 / s2;
  }
  if (!(f.b_s_per_byte > 0)) {
    f.fallback = true;
    double smallest = sweep.front().time.median_s;
    for (const CollectiveRate& p : sweep)
      smallest = std::min(smallest, p.time.median_s);
    f.a_s = smallest;
    f.b_s_per_byte = sweep.back().time.median_s / static_cast<double>(sweep.back().bytes);
  }
  for (const CollectiveRate& p : sweep) {
    const double fitted = f.a_s + f.b_s_per_byte * static_cast<double>(p.bytes);
    f.max_rel_error = std::max(f.max_rel_error, std::abs(fitted / p.time.median_s - 1));
  }
  return f;
}

CollectiveFit ring_terms(CollectiveKind kind, int group_size, const LineFit& line) {
  if (group_size < 2) throw Error("ring_terms: a collective needs a group of at least 2");
  const double g = group_size;
  const double factor = kind == CollectiveKind::kAllReduce ? 2.0 : 1.0;
  // a = factor (g - 1) alpha; b = factor (g - 1) / g / bw.
  return {line.a_s / (factor * (g - 1)) * 1e6, factor * (g - 1) / g / line.b_s_per_byte * 1e-9};
}

CalibrationReport calibrate(const Communicator& group, const CalibrateOptions& options,
                            Compute& compute) {
  std::string why;
  try {
    options.validate();
  } catch (const Error& e) {
    why = e.what();
  }
  agree_or_throw(group, why.empty(), "calibrate options", why);
  const int g = group.size();
  CalibrationReport rep;
  Calibration cal;
  cal.elem_size = 4;
  cal.group_size = g;
  cal.blas_threads = blas_threads();
  cal.crosses_domain = Topology::gather(group).crosses_world();
  cal.host = group.broadcast_string(host_name_or_unknown(), 0);
  cal.date = group.broadcast_string(utc_now(), 0);

  const std::size_t k = options.sizes.size();
  const std::vector<double> axis(options.sizes.begin(), options.sizes.end());
  cal.gram_syrk = {axis, axis, std::vector<std::vector<double>>(k, std::vector<double>(k))};
  cal.update_gemm = cal.gram_syrk;
  for (std::size_t i = 0; i < k; ++i) {
    for (std::size_t j = 0; j < k; ++j) {
      const Index s = options.sizes[i], l = options.sizes[j];
      if (options.progress)
        options.progress(
            fmt::format("calibrate: syrk and gemm, s {} l {} ({}/{})", s, l, i * k + j + 1, k * k));
      rep.gram_syrk.push_back(measure_ssyrk(group, s, l, options.compute_timing, compute));
      rep.update_gemm.push_back(measure_sgemm(group, l, s, s, options.compute_timing, compute));
      cal.gram_syrk.gflops[i][j] = rep.gram_syrk.back().flops_per_s * 1e-9;
      cal.update_gemm.gflops[i][j] = rep.update_gemm.back().flops_per_s * 1e-9;
    }
  }
  if (options.progress) options.progress("calibrate: element-wise passes");
  const ElementwiseTimes e =
      measure_elementwise(group, options.elementwise_elements, options.compute_timing, compute);
  rep.sum_squares = e.sum_squares;
  rep.scale = e.scale;
  rep.axpby = e.axpby;
  rep.fill = e.fill;
  cal.elementwise = {e.elements / e.sum_squares.median_s * 1e-9,
                     e.elements / e.scale.median_s * 1e-9, e.elements / e.axpby.median_s * 1e-9,
                     e.fill_elements / e.fill.median_s * 1e-9};

  if (g > 1) {
    for (CollectiveKind kind : {CollectiveKind::kAllGather, CollectiveKind::kAllReduce}) {
      CollectiveSweep sweep;
      sweep.kind = kind;
      const std::size_t unit = kind == CollectiveKind::kAllGather ? 4 * g : 4;
      for (std::size_t bytes : payloads(options, unit)) {
        if (options.progress)
          options.progress(fmt::format("calibrate: {} of {} bytes", to_string(kind), bytes));
        sweep.points.push_back(
            measure_collective(group, kind, DType::kF32, bytes, options.comm_timing));
      }
      sweep.line = fit_latency_bandwidth(sweep.points);
      sweep.fit = ring_terms(kind, g, sweep.line);
      (kind == CollectiveKind::kAllGather ? cal.all_gather : cal.all_reduce) = sweep.fit;
      rep.collectives.push_back(std::move(sweep));
    }
  }

  HardwareProfile& p = rep.profile;
  p.name = options.name;
  p.device = group.broadcast_string(detail::cpu_model(), 0);
  double best = 0;
  for (const auto& row : cal.update_gemm.gflops)
    best = std::max(best, *std::max_element(row.begin(), row.end()));
  p.peak_tflops_fp32 = best * 1e-3;
  p.peak_tflops_bf16 = p.peak_tflops_fp32;
  // The datasheet-style fields (used by the reference model and where the calibration does not
  // apply): the all-reduce's fit, or a memory rate (a scale pass reads and writes 8 bytes per
  // element) when no collective was measured.
  const double gbps = cal.all_reduce ? cal.all_reduce->gbps : 8 * cal.elementwise.scale;
  const double latency = cal.all_reduce ? cal.all_reduce->latency_us : 0.0;
  p.intra_domain_gbps = p.inter_domain_gbps = gbps;
  p.intra_domain_latency_us = p.inter_domain_latency_us = latency;
  p.domain_size = cal.crosses_domain ? 1 : g;
  p.source = fmt::format(
      "measured by distmuon calibrate on {} at {}: {} rank(s) at once, {} BLAS thread(s) each, "
      "fp32; ssyrk and sgemm over sizes {}..{}; {}; bf16 set to the fp32 rate (NS runs in fp32 "
      "here)",
      cal.host, cal.date, g, cal.blas_threads, options.sizes.front(), options.sizes.back(),
      g > 1 ? fmt::format("all-gather and all-reduce over {} .. {} bytes, relative least-squares "
                          "fit of latency + bytes / bandwidth",
                          options.min_bytes, options.max_bytes)
            : "no collectives (one rank): bandwidth fields hold the memory rate");
  p.calibration = std::move(cal);
  p.validate();
  return rep;
}

std::string format_calibration(const CalibrationReport& rep) {
  const HardwareProfile& p = rep.profile;
  const Calibration& c = *p.calibration;
  std::string out = fmt::format(
      "distmuon calibrate: {} ({}), {} rank(s) at once, {} BLAS thread(s) per rank, {}\n"
      "a run's time is the slowest rank's; medians\n\n",
      c.host, p.device, c.group_size, c.blas_threads,
      c.crosses_domain ? "crossing domains" : "one domain");
  for (const auto& [name, table, what] :
       {std::tuple{"gram_syrk", &c.gram_syrk, "syrk of an s x l matrix (Gram; l = s: A A)"},
        std::tuple{"update_gemm", &c.update_gemm, "gemm (l x s) x (s x s) (the update X B)"}}) {
    out += fmt::format("  {}: {}, GFLOP/s per rank\n  {:>8}", name, what, "s \\ l");
    for (double l : table->l)
      out += fmt::format(" {:>7g}", l);
    out += "\n";
    for (std::size_t i = 0; i < table->s.size(); ++i) {
      out += fmt::format("  {:>8g}", table->s[i]);
      for (double v : table->gflops[i])
        out += fmt::format(" {:>7.1f}", v);
      out += "\n";
    }
  }
  out += fmt::format(
      "  elementwise, G elements/s per rank: sum_squares {:.2f}, scale {:.2f}, axpby {:.2f}, fill "
      "of a fresh buffer {:.2f}\n",
      c.elementwise.sum_squares, c.elementwise.scale, c.elementwise.axpby, c.elementwise.fill);
  for (const CollectiveSweep& s : rep.collectives) {
    out += fmt::format("\n  {} (f32)\n  {:>12} {:>10} {:>10} {:>10} {:>10}\n", to_string(s.kind),
                       "bytes", "median_us", "fit_us", "algbw_GB/s", "busbw_GB/s");
    for (const CollectiveRate& r : s.points) {
      out += fmt::format("  {:>12} {:>10.2f} {:>10.2f} {:>10.3f} {:>10.3f}\n", r.bytes,
                         r.time.median_s * 1e6,
                         (s.line.a_s + s.line.b_s_per_byte * static_cast<double>(r.bytes)) * 1e6,
                         r.alg_bw * 1e-9, r.bus_bw * 1e-9);
    }
    out += fmt::format(
        "  fit: {:.2f} us + bytes / {:.3f} GB/s per call (max error {:.0f}%){}; ring terms: "
        "{:.2f} us per step, {:.3f} GB/s bus bandwidth\n",
        s.line.a_s * 1e6, 1e-9 / s.line.b_s_per_byte, s.line.max_rel_error * 100,
        s.line.fallback ? " [slope not positive: fallback]" : "", s.fit.latency_us, s.fit.gbps);
  }
  out += fmt::format(
      "\nprofile '{}': fp32 peak {:.3f} TFLOP/s (best sgemm), bandwidth {:.3f} GB/s, "
      "latency {:.2f} us per ring step\n",
      p.name, p.peak_tflops_fp32, p.intra_domain_gbps, p.intra_domain_latency_us);
  return out;
}

}  // namespace distmuon
