#pragma once
// Newton-Schulz orthogonalisation, as Muon uses it.
//
// For an M x N input G the iteration works along the smaller dimension s = min(M, N):
//   X = G / max(||G||_F, eps)   (the aol set then rescales X by AOL: CoefficientSet::input_scaling)
//   per step with coefficients (a, b, c):  A = X X^T (s x s),  B = b A + c A A,  X = a X + B X
//   (when c == 0: X = a X + b A X, without forming A A).
// A wide G (M <= N) is iterated as is. A tall G is iterated as X = G^T without any copy: with
// Y = G the same step reads A = Y^T Y, Y = a Y + Y B (B is symmetric), i.e. the Gram matrix is
// taken on the right. The caller may force either side.
//
// The same step is written once for local and distributed matrices: when a group is given, the
// local sum of squares and every Gram matrix are summed over the group before use. That is the
// `distributed` tensor-parallel mode; group size 1 is plain NS.

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/matrix.h"

namespace distmuon {

// The most Newton-Schulz steps a run accepts (every entry point: the CLI, the optimizer, the
// planner, Python): published schedules run 5 to 10 steps, and more than 100 are never useful
// (the iteration has converged in fp32 long before), while each costs a full step's work.
inline constexpr int kMaxNsSteps = 100;

struct NsCoefficients {
  double a = 0, b = 0, c = 0;
  friend bool operator==(const NsCoefficients&, const NsCoefficients&) = default;
};

// The band a custom schedule's result must land in (CoefficientSet::band_lo/band_hi). Any
// singular values within [lo, hi] give a cosine with the polar factor U V^T of at least
// (lo + hi) / sqrt(2 (lo^2 + hi^2)): 0.990 for this band (hi / lo <= 1.33). A custom table equal
// to a built-in set's (custom_coefficients) takes that set's band instead.
inline constexpr double kCustomBandLo = 0.86;
inline constexpr double kCustomBandHi = 1.14;

// A named schedule of coefficient tuples. Past the end of the table a schedule either cycles
// or repeats its last tuple.
struct CoefficientSet {
  enum class Tail { kCycle, kRepeatLast };
  std::string name;
  std::vector<NsCoefficients> table;
  Tail tail = Tail::kCycle;
  std::optional<int> required_steps;  // cubic5 must run exactly 5 steps
  // The band the schedule's result lands in: every singular value sigma in
  // [kScheduleSigmaFloor, 1] of the normalised input ends in [band_lo, band_hi]
  // (check_schedule; docs/optimizer.md lists each set's band and supported step counts).
  double band_lo = kCustomBandLo;
  double band_hi = kCustomBandHi;
  // How the input is scaled before the first step. kFrobenius: X / max(||X||_F, eps). kAol: that,
  // then AOL rescaling (Prach & Lampert 2022, as Turbo-Muon / flash-newton-schulz precondition
  // NS): with A = X X^T on the Gram side, row i of X (column i of a tall X) is multiplied by
  // 1 / sqrt(sum_j |A_ij|). The result has spectral norm <= 1 (for y = D x,
  // x^T A x <= sum_ij |A_ij| |x_i x_j| <= sum_i x_i^2 sum_j |A_ij|), so its singular values lie in
  // (0, 1] as after the Frobenius norm, and the check below holds for it; an orthogonal or rank-1
  // input lands exactly at 1, and most others closer to 1 than after the Frobenius norm. AOL is
  // scale-invariant, so the Frobenius step before it changes nothing but keeps the Gram matrix
  // in range and the non-finite check of the input. Only the aol set uses it.
  enum class InputScaling { kFrobenius, kAol };
  InputScaling input_scaling = InputScaling::kFrobenius;
  // A schedule that ends outside its band without reversing, diverging or blowing up a direction
  // (ScheduleCheck::refused false: it under- or over-converges) is warned about once per process
  // instead of refused (torch.optim.Muon runs any schedule; distmuon.torch.Muon sets this).
  bool warn_outside_band = false;

  // The coefficients of step `step` (0-based).
  const NsCoefficients& at(int step) const;
  // Throws distmuon::Error when `steps` is not valid for this set.
  void validate_steps(int steps) const;
  // Throws distmuon::Error naming the tuple when a coefficient is not finite or its magnitude
  // exceeds kMaxCoefficientMagnitude.
  void validate_values() const;
  // Throws distmuon::Error when the schedule run for `steps` steps at `precision` does not
  // orthogonalise (check_schedule), naming the set, the step count, the reason and the supported
  // step counts; with warn_outside_band, only when it is refused (ScheduleCheck::refused), else
  // logs a warning.
  void validate_schedule(int steps, Precision precision = Precision::kFp32) const;
};

// The schedule check (scalar work, once per options; src/ns/schedule_check.cpp). NS maps each
// singular value sigma of its normalised input (0 < sigma <= 1) through the composed odd
// polynomials p_k(x) = a_k x + b_k x^3 + c_k x^5 of its steps, with the singular vectors kept.
// A schedule orthogonalises at `steps` steps when, on a fine grid of sigma across (0, 1]:
//  - every intermediate p_k(...p_1(sigma)) is finite and > 0 (a value <= 0 reverses that
//    direction of the update, a non-finite one diverges);
//  - the final value lies in [band_lo, band_hi] for sigma >= kScheduleSigmaFloor, and in
//    (0, band_hi] below it (the smallest directions are amplified, never reversed or blown up).
inline constexpr double kScheduleSigmaFloor = 0.01;
// A final value above this blows that direction up (the update more than twice as large along it
// as an orthogonal update): refused even with warn_outside_band.
inline constexpr double kScheduleBlowUp = 2.0;
// At a reduced precision (tf32, bf16) the check also runs the schedule with each step's rounding:
// a step computes a x + b x^3 + c x^5 from operands rounded to the precision's format, and where
// the terms cancel (cans's first step at sigma = 1: 8.47 - 25.1 + 18.6 = 1.99) the result carries
// the rounding of the terms, not of the sum. So each step's upper end is raised by
// u (|a| x + |b| x^3 + |c| x^5), u the format's unit roundoff (schedule_rounding), and a schedule
// whose raised values diverge or end above kScheduleBlowUp is refused at that precision (even with
// warn_outside_band): cans at tf32 and bf16 (measured: finite garbage, ||X|| in the thousands, at
// 8 steps), aol past 4 steps at bf16. The band is still judged on the exact values. fp32 (u =
// 6e-8) is checked exactly, as before.
double schedule_rounding(Precision precision);  // 0 for fp32, 2^-11 tf32, 2^-9 bf16
// Step counts 1..kScheduleCheckedSteps are tried to list the ones a set supports.
inline constexpr int kScheduleCheckedSteps = 20;

struct ScheduleCheck {
  bool ok = false;
  Precision precision = Precision::kFp32;  // the precision it was checked for
  bool refused = false;  // reverses, cancels, diverges or blows up (> kScheduleBlowUp) a direction
  std::string problem;   // why not (empty when ok)
  double final_lo = 0, final_hi = 0;  // the final values for sigma in [kScheduleSigmaFloor, 1]
  // The largest final value for any sigma in (0, 1] with the precision's rounding
  // (schedule_rounding; the exact one at fp32): what the result's largest singular value stays
  // under.
  double rounded_hi = 0;
};
// The check at `steps` (>= 1) steps and `precision`. Does not throw.
ScheduleCheck check_schedule(const CoefficientSet& set, int steps,
                             Precision precision = Precision::kFp32);
// The step counts in 1..up_to at which check_schedule passes (and validate_steps accepts).
std::vector<int> supported_steps(const CoefficientSet& set, int up_to = kScheduleCheckedSteps,
                                 Precision precision = Precision::kFp32);

// The largest |a|, |b|, |c| a schedule may hold: about 40 times the largest of any published set
// (cans, b = -25.1). A larger value is a typo or a corrupt file; it makes the iterate overflow to
// Inf within a step or two. A schedule within the bound can still diverge (its values grow by
// up to |a| + |b| + |c| per step), which the commands that print or write a result check.
inline constexpr double kMaxCoefficientMagnitude = 1000;

// Built-in sets: simple, quintic, polar_express, cans, aol, deepseekv4, cubic5.
const CoefficientSet& coefficient_set(std::string_view name);  // throws, listing valid names
std::vector<std::string> coefficient_set_names();
// A user-defined schedule (cycles). Throws on an empty table and on a value refused by
// CoefficientSet::validate_values.
CoefficientSet custom_coefficients(std::vector<NsCoefficients> table);
// Parses "a,b,c;a,b,c;..." into a custom schedule.
CoefficientSet parse_custom_coefficients(std::string_view text);

// Which side the Gram matrix is taken on: kRows: A = X X^T (rows x rows), kCols: A = X^T X.
enum class GramSide { kAuto, kRows, kCols };

// How the iteration is run (docs/gram-newton-schulz.md):
//  kStandard: the steps above on the s x L iterate X; a distributed run all-reduces every step's
//             Gram matrix.
//  kGram:     the same polynomial run on s x s matrices only. Every iterate is X_k = Q_k X_0 with
//             Q_k a polynomial in G_0 = X_0 X_0^T, so with R = X_k X_k^T and P = a I + b R + c R^2
//             a step is Q <- P Q, R <- R P^2, and X = Q X_0 is formed once at the end. One Gram
//             matrix of X (one all-reduce with a group) per call, plus one per restart, where
//             X = Q X_0 is formed and R re-formed from it: every gram_restart steps, or with
//             gram_restart 0 (the default) automatically, when the growth of rounding errors in
//             R (the product of a_k^2 since R was formed) would pass kGramGrowthLimit.
//  kAuto:     not an algorithm: MuonOptions' "let tp_mode=auto pick standard or gram per weight"
//             (standard when the mode is fixed). NsOptions rejects it.
enum class NsAlgorithm { kStandard, kGram, kAuto };
NsAlgorithm parse_ns_algorithm(std::string_view name);  // "standard", "gram", "auto"; throws
const char* to_string(NsAlgorithm algorithm);

struct NsOptions {
  CoefficientSet coefficients = coefficient_set("quintic");
  int steps = 5;
  bool use_syrk = true;             // symmetric products with syrk (measured faster, see README)
  double eps = 1e-15;               // X / max(||X||_F, eps)
  bool norm_in_double = true;       // accumulate the Frobenius norm in double
  GramSide side = GramSide::kAuto;  // kAuto: the smaller dimension
  NsAlgorithm algorithm = NsAlgorithm::kStandard;
  int gram_restart = 0;  // kGram: 0 automatic restarts; N > 0 every N steps (>= 0)
  // The arithmetic of every product of the iteration (the Gram matrices, their squares, the
  // updates; precision.h). Normalisation, sums and the polynomial's elementwise terms stay fp32.
  // Gram NS restarts more often at tf32 and bf16 (gram_growth_limit).
  Precision precision = Precision::kFp32;

  // Throws distmuon::Error with the valid values; includes the schedule check
  // (CoefficientSet::validate_schedule), remembered per thread for the last schedules accepted.
  void validate() const;
};

// Reusable scratch for the iteration, in the backend's memory: each member is sized with
// DeviceMatrix::ensure, so calls of the same shape on the same backend do not allocate.
struct NsWorkspace {
  DeviceMatrix gram, poly, next;
  DeviceMatrix gram_q, gram_t, gram_u;  // NsAlgorithm::kGram: Q and two s x s scratch matrices
  DeviceMatrix bf16;   // standard NS at bf16 without a group: Compute::newton_schulz_bf16's scratch
  DeviceMatrix stage;  // a batch of scattered matrices, copied equally strided (batched NS)
};

// Orthogonalises x (compute's memory) in place. With a group, x is this rank's piece of a matrix
// split along the side that is NOT the Gram side, and the norm and Gram matrices are summed over
// the group (Compute::normalize: the norm on the CPU as a host scalar over the control plane, on
// a device backend in its memory over group->data()), the Gram matrices (compute's memory) over
// group->data(), which must move compute's memory (Compute::data_communicator).
// Non-finite input throws distmuon::Error (over a group on every rank) before the iteration, on
// every backend: a standalone call reads its norm on the host (one wait on a device backend; the
// optimizer's step keeps it on the device and checks its weights once per step instead). An
// all-zero input returns zeros.
void newton_schulz_inplace(MatrixView x, const NsOptions& opts, Compute& compute,
                           const Communicator* group = nullptr, NsWorkspace* ws = nullptr);

// Convenience on host memory: g (a host matrix) is copied to compute, orthogonalised there and
// the result copied back to a new host matrix. A result that is not finite (a device backend's
// non-finite input) throws distmuon::Error instead of being returned.
Matrix newton_schulz(ConstMatrixView g, const NsOptions& opts, Compute& compute);

// Standard Newton-Schulz by its definition, on the host in T (double: the float64 reference that
// precision errors are measured against, docs/precision.md; float: an independent fp32 one):
// the wide orientation (the transpose of a tall g), X = G / max(||G||_F, eps) (and the aol set's
// AOL rescaling, CoefficientSet::input_scaling), then per step
// A = X X^T, X = a X + (b A + c A^2) X with the step's coefficients. g and the result are
// row-major rows x cols. Plain loops, O(s^2 l) per step: for small matrices.
template <typename T>
std::vector<T> reference_newton_schulz(std::span<const T> g, Index rows, Index cols,
                                       const CoefficientSet& coefficients, int steps, double eps);

// FLOPs of one NS run of an m x n matrix as executed (Gram on the side given, syrk or gemm).
double ns_flops(Index m, Index n, int steps, bool use_syrk, GramSide side = GramSide::kAuto,
                const CoefficientSet* coefficients = nullptr);
// FLOPs of one NS run of an m x n matrix with opts (algorithm, steps, syrk, side, coefficients,
// restarts) as executed.
double ns_flops(Index m, Index n, const NsOptions& opts);
// NsAlgorithm::kGram. An eigenvalue of R that rounding left near zero grows by about a_k^2 per
// step (a negative one diverges), so an error of R must not grow past what the result can take:
// automatic restarts keep the product of a_k^2 since R was formed at most the precision's limit.
// fp32 (unit roundoff 6e-8): kGramGrowthLimit; the built-in quintic set at 5 steps (product
// 3.0e4) needs none; polar_express, cans and the 10-step deepseekv4 restart. tf32 and bf16 round
// each operand 2^13 and 2^16 times more coarsely; at the fp32 limit Gram NS in bf16 ends 52%
// (quintic, 96x96) away from float64 and polar_express's result is not finite. Their limit, 12,
// re-forms R once any step's a_k^2 would be compounded past it (simple, a^2 = 11.9: every 2 steps;
// quintic: after each of its first 3 steps, a^2 = 14..17), and keeps Gram NS within
// kGramReducedPrecisionRatio times standard NS's error at the same precision, measured against
// float64 on square, tall, wide and tiny matrices for the built-in sets (docs/precision.md;
// tests/ns/test_ns_precision.cpp). Limit 20 (quintic every 2 steps) let polar_express diverge in
// bf16 on a 32x32 matrix.
inline constexpr double kGramGrowthLimit = 5e4;
inline constexpr double kGramGrowthLimitTf32 = 12;
inline constexpr double kGramGrowthLimitBf16 = 12;
inline constexpr double kGramReducedPrecisionRatio = 10;
// The growth limit of automatic restarts at a precision.
double gram_growth_limit(Precision precision);
// Whether the Gram algorithm with opts re-forms R after step `step` (0-based) instead of
// updating it (never after the last step).
bool gram_restarts_after(const NsOptions& opts, int step);
// How many Gram matrices of the s x L iterate one Gram run with opts forms (1 + restarts, + 1 for
// the aol set's input scaling); with a group, each is one all-reduce of s x s elements.
int gram_ns_gram_count(const NsOptions& opts);
// The plain-GEMM count used for reporting GFLOP/s: steps * (4 s^2 L + 2 s^3).
double ns_gemm_flops(Index m, Index n, int steps);
// Bytes of the NsWorkspace an m x n NS fills (either algorithm: gram, poly and the Gram
// algorithm's three s x s matrices, next m x n, or standard bf16's scratch; float32), as a double
// so that no size wraps.
// For memory estimates (memory_check.h) before allocating.
double ns_workspace_bytes(Index m, Index n);

}  // namespace distmuon
