// Muon's state storage: the weights and momenta kept in bfloat16 (ParamSpec::bf16,
// MomentumDtype::kParam), held in float32 for each step, and every state tensor's access.
#include <fmt/format.h>

#include "core/fault.h"
#include "distmuon/error.h"
#include "optim/muon_impl.h"

namespace distmuon {

void Muon::Impl::hold_bf16_weights() {
  for (ParamState& p : params) {
    if (p.spec.bf16 == nullptr) continue;
    detail::fault_point("bf16-hold");  // docs/reliability.md
    p.weight32 = DeviceMatrix(*compute, p.spec.local.rows, p.spec.local.cols);
    if (p.weight32.size() > 0) compute->unpack_bf16(p.spec.bf16, p.weight32.view());
    p.spec.local = p.weight32.view();
    if (p.momentum16.size() == 0) continue;
    p.momentum = DeviceMatrix(*compute, p.spec.local.rows, p.spec.local.cols);
    compute->unpack_bf16(p.momentum16.view().data, p.momentum.view());
  }
}

void Muon::Impl::store_bf16_weight(ParamState& p) {
  if (p.spec.bf16 == nullptr || p.weight32.size() == 0) return;
  compute->pack_bf16(p.weight32.view(), p.spec.bf16);
  if (p.momentum16.size() > 0) compute->pack_bf16(p.momentum.view(), p.momentum16.view().data);
}

void Muon::Impl::release_bf16_weights() noexcept {
  for (ParamState& p : params) {
    if (p.spec.bf16 == nullptr) continue;
    p.spec.local.data = nullptr;
    p.weight32 = DeviceMatrix();
    if (p.momentum16.size() > 0) p.momentum = DeviceMatrix();
  }
}

std::vector<MatrixView> Muon::state_tensors(std::size_t i) {
  if (i >= impl_->params.size()) {
    throw Error(fmt::format("Muon::state_tensors: parameter {} of {}", i, impl_->params.size()));
  }
  ParamState& p = impl_->params[i];
  if (p.momentum16.size() > 0) {
    throw Error(
        fmt::format("Muon::state_tensors: the momentum of '{}' is kept in bfloat16 "
                    "(momentum_bf16, state_to_host)",
                    p.spec.name));
  }
  if (p.muon) return {p.momentum.view()};
  return {p.exp_avg.view(), p.exp_avg_sq.view()};
}

std::optional<Muon::Bf16State> Muon::momentum_bf16(std::size_t i) {
  if (i >= impl_->params.size()) {
    throw Error(fmt::format("Muon::momentum_bf16: parameter {} of {}", i, impl_->params.size()));
  }
  ParamState& p = impl_->params[i];
  if (p.momentum16.size() == 0) return std::nullopt;
  return Bf16State{p.momentum16.view().data, p.spec.local.rows, p.spec.local.cols};
}

Matrix Muon::state_to_host(std::size_t i, std::size_t k) {
  return impl_->state_to_host(impl_->params.at(i), k);
}

void Muon::state_from_host(std::size_t i, std::size_t k, ConstMatrixView host) {
  impl_->state_from_host(impl_->params.at(i), k, host);
}

namespace {

// A state tensor's name, for errors.
const char* state_name(const ParamState& p, std::size_t k) {
  return p.muon ? "momentum" : k == 0 ? "exp_avg" : "exp_avg_sq";
}

// Throws unless p has a state tensor k.
void check_state_index(const ParamState& p, std::size_t k) {
  const std::size_t count = p.muon ? 1 : 2;
  if (k >= count) {
    throw Error(fmt::format("Muon: parameter '{}' has {} state tensor(s), not {}", p.spec.name,
                            count, k + 1));
  }
}

}  // namespace

Matrix Muon::Impl::state_to_host(const ParamState& p, std::size_t k) const {
  check_state_index(p, k);
  if (p.momentum16.size() == 0) {
    const DeviceMatrix& t = p.muon ? p.momentum : k == 0 ? p.exp_avg : p.exp_avg_sq;
    return to_host(*compute, t.view());
  }
  DeviceMatrix f32(*compute, p.spec.local.rows, p.spec.local.cols);  // unpacked exactly
  if (f32.size() > 0) compute->unpack_bf16(p.momentum16.view().data, f32.view());
  return to_host(*compute, f32.view());
}

void Muon::Impl::state_from_host(ParamState& p, std::size_t k, ConstMatrixView host) {
  check_state_index(p, k);
  const MatrixView shard = p.spec.local;  // every state tensor is shard-shaped
  if (host.rows != shard.rows || host.cols != shard.cols) {
    throw Error(fmt::format("Muon: the {} of parameter '{}' is {}, given {}", state_name(p, k),
                            p.spec.name, shape_str(shard.rows, shard.cols), shape_str(host)));
  }
  if (p.momentum16.size() == 0) {
    DeviceMatrix& t = p.muon ? p.momentum : k == 0 ? p.exp_avg : p.exp_avg_sq;
    compute->copy_from_host(host, t.view());
    return;
  }
  const DeviceMatrix f32 = to_device(*compute, host);  // rounded to nearest even when packed
  if (f32.size() > 0) compute->pack_bf16(f32.view(), p.momentum16.view().data);
}

}  // namespace distmuon
