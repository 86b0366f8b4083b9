#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

#include "comm/comm_names.h"
#include "distmuon/comm.h"
#include "distmuon/error.h"

namespace distmuon {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
    case DType::kBf16:
    case DType::kF16:
      return 2;
  }
  DISTMUON_ASSERT(false, "unknown dtype");
}

const char* dtype_name(DType t) {
  return detail::name_of(t);
}

Communicator::Communicator(std::shared_ptr<CommImpl> impl) : impl_(std::move(impl)) {
  DISTMUON_ASSERT(impl_ != nullptr, "communicator without implementation");
}

void Communicator::check_gather(std::size_t send, std::size_t recv) const {
  if (recv != send * static_cast<std::size_t>(size())) {
    throw Error(
        fmt::format("collective on rank {} of {}: buffer of {} elements does not hold {} x {}",
                    rank(), size(), recv, size(), send));
  }
}

std::unique_ptr<CommRequest> CommImpl::start_all_to_all_v(
    const void* send, const std::size_t* send_counts, const std::size_t* send_displs, void* recv,
    const std::size_t* recv_counts, const std::size_t* recv_displs, DType t) {
  struct Done final : CommRequest {
    void wait() override {}
  };
  all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
  return std::make_unique<Done>();
}

namespace {
[[noreturn]] void no_gate(const CommImpl& c) {
  throw Error(fmt::format(
      "the step deadline needs point-to-point messages, which the {} communicator does not have "
      "(use an MPI communicator, or no step deadline)",
      c.backend()));
}
}  // namespace

void CommImpl::post_gate(int, const std::string&) {
  no_gate(*this);
}

std::optional<std::string> CommImpl::poll_gate(int) {
  no_gate(*this);
}

std::unique_ptr<CommRequest> Communicator::all_to_all_v_packed(
    const void* send, std::size_t send_size, std::span<const std::size_t> send_counts, void* recv,
    std::size_t recv_size, std::span<const std::size_t> recv_counts, DType t, bool start) const {
  const auto n = static_cast<std::size_t>(size());
  auto displs = [&](std::span<const std::size_t> counts, std::size_t total, const char* which) {
    if (counts.size() != n) {
      throw Error(fmt::format("all_to_all_v on rank {} of {}: {} {} counts for {} ranks", rank(),
                              size(), counts.size(), which, n));
    }
    std::vector<std::size_t> d(n);
    std::size_t sum = 0;
    for (std::size_t r = 0; r < n; ++r) {
      d[r] = sum;
      sum += counts[r];
    }
    if (sum != total) {
      throw Error(
          fmt::format("all_to_all_v on rank {} of {}: {} counts sum to {}, the buffer "
                      "holds {} elements",
                      rank(), size(), which, sum, total));
    }
    return d;
  };
  const std::vector<std::size_t> sd = displs(send_counts, send_size, "send");
  const std::vector<std::size_t> rd = displs(recv_counts, recv_size, "receive");
  if (start) {
    return impl_->start_all_to_all_v(send, send_counts.data(), sd.data(), recv, recv_counts.data(),
                                     rd.data(), t);
  }
  impl_->all_to_all_v(send, send_counts.data(), sd.data(), recv, recv_counts.data(), rd.data(), t);
  return nullptr;
}

std::string Communicator::broadcast_string(const std::string& s, int root) const {
  std::int64_t n = static_cast<std::int64_t>(s.size());
  impl_->broadcast(&n, 1, DType::kI64, root);
  std::string out = rank() == root ? s : std::string(static_cast<std::size_t>(n), '\0');
  if (n > 0) impl_->broadcast(out.data(), out.size(), DType::kU8, root);
  return out;
}

Communicator Communicator::with_data(std::shared_ptr<CommImpl> data) const {
  DISTMUON_ASSERT(data != nullptr, "data plane without implementation");
  if (data->rank() != rank() || data->size() != size()) {
    throw Error(
        fmt::format("Communicator::with_data: the data plane ({}) is rank {} of {}, the "
                    "control plane ({}) rank {} of {}",
                    data->backend(), data->rank(), data->size(), backend(), rank(), size()));
  }
  Communicator out = *this;
  out.data_ = std::move(data);
  return out;
}

Communicator Communicator::split(int color, int key) const {
  return Communicator(impl_->split(color, key));
}

void Communicator::abort(int code) const {
  impl_->abort(code);
  std::abort();  // abort() of a backend must not return
}

ErrorScope Communicator::error_scope() const {
  GroupPlacement at = impl_->placement();
  ErrorScope scope;
  scope.size = size();
  scope.world_size = at.world_size;
  if (static_cast<int>(at.ranks.size()) == size()) scope.ranks = std::move(at.ranks);
  return scope;
}

std::vector<int> Communicator::ranks_in(const Communicator& world) const {
  std::vector<int> out;
  if (impl_ == world.impl_) {
    for (int r = 0; r < size(); ++r)
      out.push_back(r);
    return out;
  }
  if (size() == 1) return {world.rank()};
  const GroupPlacement mine = impl_->placement(), theirs = world.impl_->placement();
  if (static_cast<int>(mine.ranks.size()) != size() ||
      static_cast<int>(theirs.ranks.size()) != world.size() || mine.world_size == 0 ||
      mine.world_size != theirs.world_size) {
    return {};
  }
  for (const int r : mine.ranks) {
    const auto at = std::find(theirs.ranks.begin(), theirs.ranks.end(), r);
    if (at == theirs.ranks.end()) return {};
    out.push_back(static_cast<int>(at - theirs.ranks.begin()));
  }
  // This rank must be itself in both.
  if (out[static_cast<std::size_t>(rank())] != world.rank()) return {};
  return out;
}

Communicator world_communicator() {
  return launched_by_mpi() ? mpi_world() : local_communicator();
}

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

}  // namespace distmuon
