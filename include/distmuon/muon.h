#pragma once
// The Muon optimizer on sharded weights, for a C++ training loop.
//
// Each parameter is registered with this rank's shard (a view of the caller's buffer, updated in
// place by step()) and the metadata that says how the full weight is split:
//
//   full weight m x n (unpadded) --tp_pad_length zero rows/columns appended along
//   tp_partition_dim, TP along it over T ranks--> TP-local tensor
//   m_tp x n_tp --pad_length zero rows appended--> (m_tp + pad) x n_tp --GTP along dim 0 over
//   G ranks--> local shard of (m_tp + pad) / G rows.
//
// A parameter with TP partition dim 0 therefore carries pad_length zero rows after each TP
// block. Matrix ("hidden") parameters use Muon; embeddings, output heads, 1-D parameters
// (registered as k x 1 columns, role kOther) and use_muon = false go to AdamW (adamw.h).
//
// Muon step per parameter (mu = momentum):
//   weight decay  decoupled p <- p (1 - lr wd); independent p <- p (1 - wd); l2 g <- g + wd p
//   momentum      buf <- mu buf + (1 - mu) g
//   nesterov      u = (1 - mu) g + mu buf (else u = buf)
//   orthogonalise u over the shards (tp_mode): X = u / max(||u||_F, eps), NS steps,
//                 times scale(m, n) * extra_scale_factor
//   update        p <- p - lr u
// scale: spectral sqrt(max(m, n)), shape_scaling sqrt(max(1, m / n)), unit_rms_norm sqrt(m / n),
// of the full unpadded shape (blockwise: of the local unpadded shard, which it orthogonalises
// on its own; QKV split: of each block type's matrix).
//
// Collective calls: step(), save(), load() must be called by every rank of the world given to
// the constructor, with the same parameters registered in the same order (names included;
// expert parameters held by different expert-parallel ranks carry their expert_rank). A
// configuration that differs between ranks raises CollectiveError on every rank.

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distmuon/adamw.h"
#include "distmuon/auto_choice.h"
#include "distmuon/comm.h"
#include "distmuon/compute.h"
#include "distmuon/matrix.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/plan_mode.h"
#include "distmuon/precision.h"
#include "distmuon/tp_mode.h"

namespace distmuon {

enum class WeightDecayMethod { kDecoupled, kIndependent, kL2 };
enum class ScaleMode { kSpectral, kShapeScaling, kUnitRmsNorm };
// Where a replicated weight (ParamSpec::dp_group: data-parallel replicas holding the same shard)
// is orthogonalised. home: once, on one rank of its replicas (an LPT-balanced home; owner mode
// spanning the replicas, tp/owner_ns.h), the result sent to the others; every_rank: every replica
// runs the same NS on its own copy; auto: home for a fixed tp_mode, the cost model's choice per
// bucket of replicated weights with tp_mode auto. Every choice gives the same bits.
enum class ReplicaMode { kAuto, kHome, kEveryRank };
// How a home's result travels to the other replicas: fp32 (the default: bit-equal to every-rank
// NS), or bf16 (half the bytes; the home rounds its own copy too, so that the replicas stay
// equal: each element of the update within bf16's rounding, 2^-8 relative, of fp32's;
// docs/data-parallel.md).
enum class ReplicaWire { kFp32, kBf16 };
// Where Muon keeps a weight's momentum: fp32 (the default), or param: in the weight's own
// storage, bfloat16 for a bfloat16 weight (ParamSpec::bf16), as torch.optim.Muon keeps its
// momentum_buffer in the parameter's dtype (each step's momentum rounded to nearest even once).
enum class MomentumDtype { kFp32, kParam };

WeightDecayMethod parse_weight_decay_method(std::string_view name);  // throws, listing valid
ScaleMode parse_scale_mode(std::string_view name);                   // throws, listing valid
ReplicaMode parse_replica_mode(std::string_view name);               // throws, listing valid
const char* to_string(ReplicaMode mode);
ReplicaWire parse_replica_wire(std::string_view name);  // throws, listing valid
const char* to_string(ReplicaWire wire);
MomentumDtype parse_momentum_dtype(std::string_view name);  // throws, listing valid
const char* to_string(MomentumDtype dtype);
const char* to_string(WeightDecayMethod method);
const char* to_string(ScaleMode mode);
// The scale factor of an m x n update (without extra_scale_factor).
double muon_scale(ScaleMode mode, Index m, Index n);

struct MuonOptions {
  double lr = 0.02;
  double momentum = 0.95;
  bool nesterov = true;
  double weight_decay = 0.0;
  WeightDecayMethod weight_decay_method = WeightDecayMethod::kDecoupled;
  std::string coefficients = "quintic";  // a built-in set (coefficient_set_names()) or "custom"
  std::string custom_coefficients;       // "a,b,c;a,b,c;..." when coefficients == "custom"
  int steps = 5;                         // Newton-Schulz steps
  // JSON "schedule_check": "strict" (refuse a schedule that ends outside its band at `steps`) or
  // "warn" (refuse only one that reverses, diverges or blows up a direction; warn once about one
  // that under- or over-converges: CoefficientSet::warn_outside_band). distmuon.torch.Muon: warn.
  bool schedule_warns = false;
  double eps = 1e-15;  // NS normalisation: X / max(||X||_F, eps) (> 0)
  bool use_syrk = true;
  // JSON "ns_algorithm": standard (the default: every tp_mode, auto included, gives duplicated's
  // result; owner mode bit for bit), gram, or auto (opt-in speed-up: with tp_mode auto the cost
  // model picks standard or gram per weight, within Gram NS's fp32 error; with a fixed tp_mode
  // auto runs standard). gram and auto need cost_model refined when tp_mode is auto.
  NsAlgorithm ns_algorithm = NsAlgorithm::kStandard;
  int gram_restart = 0;  // gram: re-form the Gram matrix every N steps (0 = automatically)
  // The arithmetic of Newton-Schulz's products (precision.h); JSON "precision": "fp32", "tf32",
  // "bf16" or "auto" (unset: the backend's Compute::default_precision(), fp32 on the CPU, bf16 on
  // CUDA; docs/precision.md).
  std::optional<Precision> precision;
  ScaleMode scale_mode = ScaleMode::kSpectral;
  double extra_scale_factor = 1.0;
  TpMode tp_mode = TpMode::kAuto;
  // The mode of the expert weights (ParamSpec::expert), as Megatron-LM's --muon-expert-tp-mode:
  // JSON "expert_tp_mode", a mode name or "same" (unset: tp_mode, the default).
  std::optional<TpMode> expert_tp_mode;
  // Replicated weights (ParamSpec::dp_group): JSON "replica_mode" auto, home or every_rank.
  ReplicaMode replica_mode = ReplicaMode::kAuto;
  ReplicaWire replica_wire = ReplicaWire::kFp32;        // JSON "replica_wire": fp32 or bf16
  MomentumDtype momentum_dtype = MomentumDtype::kFp32;  // JSON "momentum_dtype": fp32 or param
  std::string cost_model = "refined";                   // auto: "refined" or "reference"
  std::string profile = "none";  // auto: "none", a built-in profile name or a JSON file
  // auto: plan by the cost model's estimate, or measure its leading candidates before the first
  // step (measure_plan.h); wisdom: the file measure mode reads and writes (empty: none).
  PlanMode plan = PlanMode::kEstimate;
  std::string wisdom;
  AdamWOptions adamw;  // for the parameters that do not use Muon
  // The step deadline in seconds (docs/reliability.md, "The step deadline"): every rank must reach
  // each step within it of rank 0, else every rank that did throws distmuon::Error naming the
  // late rank(s) (stopped or stuck; the CLI then ends the job). 0: DISTMUON_STEP_TIMEOUT when
  // set, else no deadline. Needs an MPI communicator; fixed once the optimizer is built.
  double step_timeout_s = 0;

  // The mode of a weight: expert_tp_mode (when set) for an expert weight, else tp_mode.
  TpMode mode_for(bool expert) const {
    return expert && expert_tp_mode ? *expert_tp_mode : tp_mode;
  }
  // Whether any weight's mode is auto (tp_mode or expert_tp_mode).
  bool any_auto() const { return tp_mode == TpMode::kAuto || expert_tp_mode == TpMode::kAuto; }

  // Throws distmuon::Error naming the field and listing its valid values.
  void validate() const;
  // The Newton-Schulz options these settings describe, at `precision` or, when it is unset, at
  // backend_default (the optimizer passes its backend's Compute::default_precision()).
  NsOptions ns_options(Precision backend_default = Precision::kFp32) const;
};

void to_json(nlohmann::json& j, const MuonOptions& o);
void from_json(const nlohmann::json& j, MuonOptions& o);

enum class ParamRole { kHidden, kEmbedding, kOutputHead, kOther };
ParamRole parse_param_role(std::string_view name);  // "hidden", ...; throws, listing valid
const char* to_string(ParamRole role);

struct ParamSpec {
  std::string name;
  // This rank's shard: (m_tp + pad_length) / G rows x n_tp columns, a view of the memory of the
  // optimizer's Compute (see the constructor).
  MatrixView local;
  // A bfloat16 weight kept without a float32 copy (a torch bfloat16 parameter, say): the shard's
  // elements in bf16, row-major and contiguous in `local`'s order, in the memory of the
  // optimizer's Compute, two to a float as Compute::pack_bf16 writes them. `local` then gives
  // only the shape (data null, ld = cols). Each step unpacks it into a float32 copy that lives for
  // the step, steps that, and packs the new weight back rounded to nearest even (the step's
  // checks bound the new weights by bfloat16's largest value, so nothing rounds to infinity).
  // nullptr: `local` is the weight.
  float* bf16 = nullptr;
  Index rows = 0;  // full, unpadded shape m x n
  Index cols = 0;
  ParamRole role = ParamRole::kHidden;
  bool use_muon = true;  // Muon only for role kHidden and use_muon

  int tp_partition_dim = kNoPartition;  // kNoPartition, 0 or 1
  std::optional<Communicator> tp_group;
  bool gtp_sharded = false;  // rows of the TP-local tensor split over gtp_group
  std::optional<Communicator> gtp_group;
  Index pad_length = 0;  // zero rows appended to the TP-local tensor before the GTP split
  // Zero rows (dim 0) or columns (dim 1) appended to the full weight before the TP split: uneven
  // TP shards (torch.chunk's: T shards of ceil(extent / T), the last ones short or empty, held
  // padded to that size by the caller, the padding zero).
  Index tp_pad_length = 0;

  // Data parallelism: the ranks that hold the same shard of this weight (replicas: DDP's world,
  // HSDP's replicate dimension), this one among them; their gradients are already reduced (equal).
  // With replica_mode home the weight is orthogonalised once over them. Unset or one rank: none.
  // The replicas are checked equal at every step (fingerprints: the sums of squares in double of
  // each replica's weight and NS input; CollectiveError on every rank naming the weight).
  std::optional<Communicator> dp_group;

  bool expert = false;  // an expert weight: pass the expert TP/GTP groups above
  int expert_rank = 0;  // expert-parallel rank holding it (tells same-named experts apart)

  // QKV split: rows per query group of each block type, {q, k, v} or {q, gate, k, v}. The rows
  // of the full weight are query groups of these blocks; each block type is orthogonalised as
  // its own matrix, gathered across the query groups. Empty: no split.
  std::vector<Index> qkv_split;

  // A batch of matrices in one parameter (a 3-D [batch, rows, cols] weight: a layer's experts):
  // `batch` matrices of the full shape rows x cols, each split as above (the same groups,
  // padding and QKV split), their shards stacked by rows in `local`: batch x
  // ((m_tp + pad_length) / G) rows, slice b's shard at rows b * shard_rows. Muon orthogonalises
  // each slice as its own matrix (scale and all, as `batch` parameters would be), the slices of
  // equal shape together (one batched product per NS step, Compute::gemm_batched); the momentum
  // and AdamW are elementwise on the whole. Agreed across ranks with the rest of the parameter.
  Index batch = 1;
};

// What the optimizer decided for a parameter (after the first step for tp_mode auto).
struct ParamInfo {
  std::string name;
  bool muon = false;
  Index rows = 0, cols = 0;
  int tp_size = 1, gtp_size = 1;
  std::optional<TpMode> mode;  // the mode used (auto: planned); empty until planned or AdamW
  NsAlgorithm algorithm = NsAlgorithm::kStandard;  // Muon: the NS algorithm used (once planned)
  // tp_mode auto, once planned: whether the weight's groups cross an NVLink domain (its key's).
  std::optional<bool> crosses_domain;
  int dp_size = 1;          // replicas (ParamSpec::dp_group)
  bool home = false;        // once planned: orthogonalised on one home of its replicas
  int owner = -1;           // owner mode or home, after a step: its owner index (t + T g + T G d)
                            // (a batched parameter: its first slice's)
  Index batch = 1;          // matrices in the parameter (ParamSpec::batch)
  std::vector<int> owners;  // after a step: each slice's owner index (-1: run on this rank)
};

// Seconds of the last step() on this rank: total, and waiting in the parameters' collectives.
struct MuonStepStats {
  double total_s = 0.0;
  double comm_s = 0.0;
};

class Muon {
 public:
  // compute runs every operation on the optimizer's matrices and owns their memory: the
  // registered shards (ParamSpec::local) and the gradients given to step() are views of
  // compute's memory (host memory for cpu_compute(); device memory for a device backend, where
  // host memory is refused), and the optimizer state is allocated by it. The groups' data moves
  // over compute.data_communicator(group), attached once per group on registration.
  Muon(MuonOptions options, Communicator world, Compute& compute);
  ~Muon();
  Muon(Muon&&) noexcept;
  Muon& operator=(Muon&&) noexcept;

  // Registers a parameter (rank-local; checks the shard shape). Returns its index: step()
  // takes gradients in registration order.
  std::size_t add_parameter(ParamSpec spec);

  // One optimizer step. grads[i] is the gradient of parameter i's local shard (same shape, the
  // Compute's memory). Collective over the world. After the first step a step allocates no
  // backend memory (its buffers are kept per shape).
  // Non-finite values: every gradient, weight and optimizer state is checked before any update
  // (CollectiveError on every rank naming it; nothing is updated, the weights keep their last
  // good values), and the coefficient schedule was checked when the options were set
  // (NsOptions::validate). What remains is an overflow of the momentum step itself (values near
  // the float maximum) or of an NS input's norm: on every backend such an input leaves that
  // weight's update NaN (NS over the weight's groups never throws for data), and one batched
  // check of every update at the end of the compute phase, agreed over the world, throws
  // CollectiveError on every rank naming the weight. Every update is computed before any is
  // written, so then too nothing is updated (weights, optimizer state, step count).
  void step(std::span<const ConstMatrixView> grads);
  // The same step for a caller with checks of its own (the Python bindings): a non-empty
  // failure on any rank makes every rank throw CollectiveError carrying the first failing
  // rank's text, agreed with the gradient checks (no extra collective), before any update; the
  // failing rank's grads are not read (pass none).
  void step(std::span<const ConstMatrixView> grads, std::string_view failure);
  // The same, skipping the parameters whose `active` entry is 0 (no gradient: neither their
  // weight nor their state changes; their grads entry is not read). active is empty (every
  // parameter steps) or has one entry per parameter. The options and `active` are agreed over
  // the world in the step's single agreement: ranks that differ raise CollectiveError on every
  // rank, before any update.
  void step(std::span<const ConstMatrixView> grads, std::string_view failure,
            std::span<const std::uint8_t> active);

  // Optimizer state to/from a directory (manifest.json + one file per rank). Collective.
  // load() accepts a checkpoint written with another GTP group size (it reshards).
  void save(const std::filesystem::path& dir);
  void load(const std::filesystem::path& dir);

  std::int64_t step_count() const;
  const MuonOptions& options() const;
  // Learning-rate schedules: new Muon and AdamW learning rates (>= 0) for the next steps.
  void set_learning_rates(double muon_lr, double adamw_lr);
  // Weight-decay schedules: new Muon and AdamW weight decays (>= 0) for the next steps.
  void set_weight_decays(double muon_wd, double adamw_wd);
  // Hyper-parameter schedules: new options for the next steps. Every field may change but those
  // that shape the plan, the collectives' structure or the state's storage (tp_mode,
  // expert_tp_mode, replica_mode, replica_wire, momentum_dtype, ns_algorithm, gram_restart,
  // use_syrk, precision, cost_model, profile, plan, wisdom, step_timeout_s): a change of one of
  // those is refused.
  // Validated first (nothing changes on a refusal). Rank-local; step() agrees the options over the
  // world.
  void set_options(const MuonOptions& options);

  // In-memory state (rank-local), for callers that keep the state themselves (the Python
  // bindings' state_dict): views of parameter i's state tensors, shard-shaped (Muon: momentum;
  // AdamW: exp_avg, exp_avg_sq), valid until the parameter list changes; writing through them
  // changes the state. set_step_count sets the step counter that AdamW's bias correction and
  // the checkpoints use. The views are of the optimizer's Compute's memory (the host for
  // cpu_compute(), which the Python bindings use): read and write them through that backend.
  std::vector<MatrixView> state_tensors(std::size_t i);
  // Parameter i's momentum when kept in bfloat16 (MuonOptions::momentum_dtype param on a
  // bfloat16 weight, ParamSpec::bf16; state_tensors then refuses it): the shard's elements,
  // row-major, two to a float in the optimizer's memory. Empty otherwise.
  struct Bf16State {
    float* data = nullptr;
    Index rows = 0, cols = 0;
  };
  std::optional<Bf16State> momentum_bf16(std::size_t i);
  // State tensor k of parameter i (the order of state_tensors) copied to or from host memory
  // in float32, whatever its storage: a bfloat16 momentum is unpacked exactly and, when set,
  // rounded to nearest even. Throws on a k or a shape that is not the tensor's.
  Matrix state_to_host(std::size_t i, std::size_t k);
  void state_from_host(std::size_t i, std::size_t k, ConstMatrixView host);
  void set_step_count(std::int64_t step);
  std::vector<ParamInfo> parameters() const;
  // tp_mode auto: the decisions of the cost model so far, per key.
  std::map<AutoKey, AutoChoice> auto_decisions() const;
  MuonStepStats last_step_stats() const;
  // plan measure: candidate runs timed by this rank so far (warm-up included; 0 when every time
  // came from the wisdom file).
  std::size_t plan_timed_runs() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace distmuon
