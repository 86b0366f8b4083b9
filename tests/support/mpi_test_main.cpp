// GoogleTest main for single- and multi-rank tests. Under mpirun every rank runs every test;
// only rank 0 prints the usual report, other ranks print their own failures with their rank, and
// the exit code is non-zero when any rank failed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <optional>

#include "distmuon/comm.h"
#include "test_util.h"

namespace distmuon::test {
namespace {
std::optional<Communicator> g_world;

// Prints failed assertions of a non-zero rank, prefixed by the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) {
      std::cerr << "[rank " << rank_ << "] " << (r.file_name() ? r.file_name() : "?") << ":"
                << r.line_number() << ": " << r.summary() << std::endl;
    }
  }

 private:
  int rank_;
};
}  // namespace

const Communicator& world() {
  if (!g_world) g_world = local_communicator();
  return *g_world;
}

}  // namespace distmuon::test

int main(int argc, char** argv) {
  using namespace distmuon;
  ::testing::InitGoogleTest(&argc, argv);
  std::optional<MpiRuntime> mpi;
  if (launched_by_mpi()) {
    mpi.emplace(&argc, &argv);
    test::g_world = mpi_world();
  }
  const Communicator& world = test::world();
  if (world.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new test::RankFailurePrinter(world.rank()));
  }
  const int local_rc = RUN_ALL_TESTS();
  const int rc = world.all_reduce<std::int32_t>(local_rc != 0 ? 1 : 0, ReduceOp::kMax);
  if (rc != 0 && world.rank() == 0 && local_rc == 0) {
    std::cerr << "FAILED: tests failed on other ranks (see their [rank N] lines)" << std::endl;
  }
  // DISTMUON_TEST_SKIPPED_RC=N (set by ctest for tests that may skip, e.g. the gpu ones): a run
  // with no failure in which some test skipped itself exits with N, which ctest's
  // SKIP_RETURN_CODE reports as skipped (a failure still fails).
  if (const char* skipped_rc = std::getenv("DISTMUON_TEST_SKIPPED_RC");
      rc == 0 && skipped_rc != nullptr &&
      world.all_reduce<std::int32_t>(
          ::testing::UnitTest::GetInstance()->skipped_test_count() > 0 ? 1 : 0, ReduceOp::kMax)) {
    return std::atoi(skipped_rc);
  }
  return rc;
}
