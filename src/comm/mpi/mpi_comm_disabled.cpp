// Stub compiled when distmuon is built without MPI (DISTMUON_ENABLE_MPI=OFF).
#include "distmuon/comm.h"
#include "distmuon/error.h"

namespace distmuon {

MpiRuntime::MpiRuntime(int*, char***) {
  if (launched_by_mpi()) throw Error("distmuon was built without MPI (DISTMUON_ENABLE_MPI=OFF)");
}
MpiRuntime::~MpiRuntime() = default;
bool MpiRuntime::available() {
  return false;
}
Communicator mpi_world() {
  throw Error("distmuon was built without MPI (DISTMUON_ENABLE_MPI=OFF)");
}

Communicator mpi_communicator(const void*) {
  throw Error("distmuon was built without MPI (DISTMUON_ENABLE_MPI=OFF)");
}

}  // namespace distmuon
