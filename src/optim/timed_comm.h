#pragma once
#include <memory>

#include "distmuon/comm.h"

namespace distmuon::detail {

// Forwards to inner and adds the seconds spent in each collective to *seconds; both planes are
// timed when inner has a data plane of its own.
Communicator timed_communicator(const Communicator& inner, std::shared_ptr<double> seconds);

}  // namespace distmuon::detail
