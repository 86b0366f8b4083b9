#pragma once
#include <memory>

#include "distmuon/comm.h"

namespace distmuon::detail {

// Forwards to inner and adds the seconds spent in each collective to *seconds.
Communicator timed_communicator(const Communicator& inner, std::shared_ptr<double> seconds);

}  // namespace distmuon::detail
