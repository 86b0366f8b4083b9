#pragma once
// NVLink-domain topology: which ranks share a GPU fabric domain.
//
// CONTRACT (used by the optimizer; keep this declaration): crosses_domain(group).

#include "distmuon/comm.h"

namespace distmuon {

// True when the ranks of the group are not all in one NVLink domain. Collective: every rank of
// the group must call it; all-gathers the ranks' domain ids.
bool crosses_domain(const Communicator& group);

}  // namespace distmuon
