#pragma once
// The rates one cost estimate uses (internal to src/plan).

#include "distmuon/hardware_profile.h"

namespace distmuon::detail {

// The figures one estimate uses: the profile's datasheet values, replaced by its calibration
// where that applies (same precision for compute; same side of a domain boundary for the
// collectives).
struct Rates {
  const HardwareProfile* profile = nullptr;
  const Calibration* compute = nullptr;
  const CollectiveFit* all_gather = nullptr;
  const CollectiveFit* all_reduce = nullptr;

  Rates(const HardwareProfile* p, int elem_size, bool crosses) : profile(p) {
    if (p == nullptr || !p->calibration) return;
    const Calibration& c = *p->calibration;
    if (c.elem_size == elem_size) compute = &c;
    if (c.crosses_domain == crosses) {
      if (c.all_gather) all_gather = &*c.all_gather;
      if (c.all_reduce) all_reduce = &*c.all_reduce;
    }
  }
};

}  // namespace distmuon::detail
