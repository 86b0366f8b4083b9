#pragma once
#include <memory>

#include "distmuon/comm.h"
#include "distmuon/compute.h"

namespace distmuon::detail {

// Forwards to inner and adds the seconds spent in each collective to *seconds; both planes are
// timed when inner has a data plane of its own. With a device timer (Compute::stream_timer), the
// data plane's collectives, which return once queued, are marked as intervals on the backend's
// stream instead, read by the owner of the timer (device->seconds()) once the work completed;
// barriers wait on the host and stay on the host clock. `device` must outlive the communicator.
Communicator timed_communicator(const Communicator& inner, std::shared_ptr<double> seconds,
                                StreamTimer* device = nullptr);

}  // namespace distmuon::detail
