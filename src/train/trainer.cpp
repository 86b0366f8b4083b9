// The trainer: setup (data, sharded model, optimizer registration), the training step, the
// validation loss and the modes per Muon shape.
#include "distmuon/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <utility>

#include "distmuon/agreement.h"
#include "distmuon/error.h"
#include "distmuon/hash.h"
#include "train/trainer_impl.h"

namespace distmuon {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// 64 bits from the system's entropy source as 16 hex digits: two runs never share an id.
std::string new_run_id() {
  std::random_device source;
  const std::uint64_t hi = source(), lo = source();
  return fmt::format("{:08x}{:08x}", hi & 0xffffffffu, lo & 0xffffffffu);
}

ParamRole role_of(const std::string& name) {
  if (name == "embedding") return ParamRole::kEmbedding;
  if (name == "head") return ParamRole::kOutputHead;
  return ParamRole::kHidden;
}

}  // namespace

Trainer::Trainer(TrainConfig config, Communicator world)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(world))) {
  Impl& s = *impl_;
  const Communicator& w = s.world;
  // Rank-local failures (a file one rank cannot read) are agreed on before any collective.
  std::string failure;
  try {
    s.options = optimizer_options(s.config);
    s.step_timeout = step_timeout_seconds(s.options.step_timeout_s);
    if (s.config.train.batch % w.size() != 0) {
      throw Error(fmt::format(
          "the global batch train.batch = {} must be a multiple of the {} ranks (each rank "
          "takes an equal part)",
          s.config.train.batch, w.size()));
    }
    s.data.emplace(TextData::from_file(s.config.data.path, s.config.data_options()));
    s.profile = resolve_profile(s.options.profile);
    s.cost_model = parse_cost_model(s.options.cost_model);
    s.compute = &compute_backend(s.config.train.device);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  agree_or_throw(w, failure.empty(), "train: setup", failure);
  // One model on one data set: the configuration and the bytes each rank read are agreed on (a
  // data file that differs between the ranks' nodes would otherwise train each rank on its own).
  const std::span<const std::uint8_t> text = s.data->bytes();
  const nlohmann::json identity = {
      {"config", to_json(s.config)},
      {"data",
       {{"bytes", text.size()},
        {"checksum", fmt::format("{:016x}", fnv1a64(text.data(), text.size()))}}},
      {"step_deadline_s", s.step_timeout}};
  agree_on(w, identity.dump(), "train: the configuration and the training data",
           explain_json_difference);
  // The run id: rank 0 draws it, every rank receives it.
  s.run_id = decide_on_root<std::string>(w, 0, "train: the run id", new_run_id);

  s.model = std::make_unique<ShardedCharLm>(s.config.model, s.config.train.seed, w,
                                            s.config.train.replicated());
  Compute& compute = *s.compute;
  s.muon.emplace(s.options, w, compute);
  const bool mirror = compute.memory() != MemoryKind::kHost;
  for (ShardedParam& p : s.model->params()) {
    if (mirror) {
      s.values.emplace_back(compute, p.value.rows(), p.value.cols());
      s.grads_on_device.emplace_back(compute, p.grad.rows(), p.grad.cols());
    }
    ParamSpec spec;
    spec.name = p.name;
    spec.local = mirror ? s.values.back().view() : p.value.view();
    spec.rows = p.rows;
    spec.cols = p.cols;
    spec.role = role_of(p.name);
    DISTMUON_ASSERT((spec.role == ParamRole::kHidden) == (p.kind == ParamKind::kMuon),
                    "the model's Muon parameters are its hidden matrices");
    if (p.sharded) {
      spec.gtp_sharded = true;
      spec.gtp_group = w;
      spec.pad_length = p.sharding.pad_length;
    } else if (p.kind == ParamKind::kMuon) {
      spec.dp_group = w;  // replicated: every rank holds it whole
    }
    s.muon->add_parameter(std::move(spec));
    s.grads.push_back(mirror ? std::as_const(s.grads_on_device.back()).view() : p.grad.view());
  }
  s.upload_values();
  s.validation = s.data->validation_batch(w.rank(), w.size(), s.config.train.eval_windows);
  s.entropy = distmuon::unigram_entropy(s.data->bytes());
}

void Trainer::Impl::upload_values() {
  auto& params = model->params();
  for (std::size_t i = 0; i < values.size(); ++i)
    compute->copy_from_host(params[i].value.view(), values[i].view());
}

void Trainer::Impl::download_values() {
  auto& params = model->params();
  for (std::size_t i = 0; i < values.size(); ++i)
    compute->copy_to_host(std::as_const(values[i]).view(), params[i].value.view());
}

void Trainer::Impl::upload_grads() {
  auto& params = model->params();
  for (std::size_t i = 0; i < grads_on_device.size(); ++i)
    compute->copy_from_host(params[i].grad.view(), grads_on_device[i].view());
}

Trainer::~Trainer() = default;
Trainer::Trainer(Trainer&&) noexcept = default;
Trainer& Trainer::operator=(Trainer&&) noexcept = default;

StepRecord Trainer::step() {
  Impl& s = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  StepRecord r;
  r.step = s.step + 1;
  // Every rank reaches this step (its forward and backward collectives) within the step deadline,
  // or the late rank is named.
  pass_step_gate(s.world, r.step, s.step_timeout, "training step");
  const CharBatch batch = s.data->train_batch(static_cast<std::uint64_t>(r.step), s.world.rank(),
                                              s.world.size(), s.config.train.batch);
  r.loss = s.model->forward_backward(batch);
  // A loss that is not finite (the run diverged, or a reduction went wrong) ends the run on every
  // rank: agreed within the optimizer's step, before anything is updated.
  const std::string failure =
      std::isfinite(r.loss)
          ? std::string()
          : fmt::format("train: the training loss of step {} is not finite ({})", r.step, r.loss);
  s.upload_grads();
  s.muon->step(s.grads, failure);
  s.download_values();
  // The optimizer's apply phase is rank-local: every rank finishes it within the deadline before
  // the collectives that follow a step (the log, evaluations, checkpoints).
  pass_step_gate(s.world, r.step, s.step_timeout, "the end of training step");
  const MuonStepStats stats = s.muon->last_step_stats();
  r.opt_ms = stats.total_s * 1e3;
  r.opt_comm_ms = stats.comm_s * 1e3;
  r.step_ms = ms_since(t0);
  s.step = r.step;
  return r;
}

double Trainer::evaluate() {
  const double loss = impl_->model->evaluate(impl_->validation);
  // Agreed: a loss that is not finite on some ranks only (a reduction gone wrong) would have the
  // ranks report and decide differently.
  agree_or_throw(impl_->world, std::isfinite(loss), "train: the validation loss",
                 fmt::format("it is not finite ({})", loss));
  return loss;
}

int Trainer::step_count() const {
  return impl_->step;
}
const std::string& Trainer::run_id() const {
  return impl_->run_id;
}
const std::filesystem::path& Trainer::resumed_from() const {
  return impl_->resumed_from;
}
const TrainConfig& Trainer::config() const {
  return impl_->config;
}
const Communicator& Trainer::world() const {
  return impl_->world;
}
const TextData& Trainer::data() const {
  return *impl_->data;
}
double Trainer::unigram_entropy() const {
  return impl_->entropy;
}
ShardedCharLm& Trainer::model() {
  return *impl_->model;
}
const Muon& Trainer::optimizer() const {
  return *impl_->muon;
}

std::vector<ShapeDecision> Trainer::decisions() const {
  const Impl& s = *impl_;
  const auto resolved = s.muon->auto_decisions();
  const NsOptions ns = s.options.ns_options(s.compute->default_precision());
  std::vector<ShapeDecision> out;
  for (const ParamInfo& p : s.muon->parameters()) {
    if (!p.muon) continue;
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const ShapeDecision& d) { return d.m == p.rows && d.n == p.cols; });
    if (it != out.end()) {
      it->names.push_back(p.name);
      continue;
    }
    ShapeDecision d;
    d.m = p.rows;
    d.n = p.cols;
    d.names = {p.name};
    d.sharded = p.gtp_size > 1;
    d.replicas = p.dp_size;
    d.home = p.home;
    // Before the first step auto has not resolved yet: report the option.
    d.mode = p.mode.value_or(s.options.tp_mode);
    d.algorithm = p.algorithm;
    d.key = auto_key(ShardLayout{.m = p.rows, .n = p.cols, .gtp_size = p.gtp_size}, ns,
                     s.options.ns_algorithm, false);
    for (const auto& [key, choice] : resolved) {
      if (key.m == p.rows && key.n == p.cols && key.group_size == p.gtp_size) d.key = key;
    }
    d.in_seconds = s.profile.has_value();
    d.estimate = estimate(d.key, s.profile ? &*s.profile : nullptr, s.cost_model);
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace distmuon
