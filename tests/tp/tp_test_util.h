#pragma once
// Helpers shared by the tensor-parallel tests: the groups to test on at the current world size,
// and NS options per coefficient set.

#include <string>
#include <vector>

#include "distmuon/comm.h"
#include "distmuon/newton_schulz.h"
#include "distmuon/tp.h"

namespace distmuon::test {

// The world itself and, when it has 4 ranks, its two halves {0,1} and {2,3}: so that G = 2 and
// G = 4 are both covered under mpirun -np 4 (and G = 1 by the single-rank run).
std::vector<Communicator> tp_groups();

// Options for a coefficient set at the step count it is meant for.
NsOptions ns_options(const std::string& set, bool syrk);

// This rank's shard of full along dim for the given group.
Matrix my_shard(ConstMatrixView full, int dim, const Communicator& group);

}  // namespace distmuon::test
