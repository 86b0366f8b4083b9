// Memory estimates against available memory (memory_check.h): the figure in the message, the
// address-space limit honoured, absurd estimates refused.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <cstdlib>

#include <cmath>
#include <limits>
#include <string>

#include "distmuon/error.h"
#include "distmuon/memory_check.h"
#include "test_util.h"

namespace distmuon {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string error_of(double bytes) {
  try {
    check_memory_fits(bytes, "a test allocation");
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

TEST(MemoryCheck, SmallEstimatesPassHugeOnesNameTheFigure) {
  const std::uint64_t avail = available_memory_bytes();
  ASSERT_GT(avail, 0u);
  EXPECT_EQ(error_of(1 << 20), "");  // 1 MiB: any machine that runs the tests has it
  // 2^60 bytes (1 EiB) fits on no machine; the message has the estimate and the room.
  const std::string msg = error_of(std::ldexp(1.0, 60));
  EXPECT_NE(msg.find("a test allocation needs about 1073741824.0 GiB of memory, more than the"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find(" GiB available"), std::string::npos) << msg;
  EXPECT_NE(error_of(std::numeric_limits<double>::infinity()), "");
  EXPECT_NE(error_of(std::numeric_limits<double>::quiet_NaN()), "");
  EXPECT_NE(error_of(-1), "");
}

// The ranks of a job on one host share its memory: with the launcher's count of 4 ranks on this
// host (OMPI_COMM_WORLD_LOCAL_SIZE) each may count on a quarter of what one process alone may
// (within 20%: the host's free memory moves between the two readings), and an estimate that fits
// one process but not a quarter is refused naming the 4 ranks.
TEST(MemoryCheck, RanksOnOneHostShareItsMemory) {
  const char* old = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const std::string saved = old != nullptr ? old : "";
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const double alone = static_cast<double>(available_memory_bytes());
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
  const int ranks = ranks_on_this_host();
  const double shared = static_cast<double>(available_memory_bytes());
  const std::string msg = error_of(0.5 * alone);
  if (old != nullptr) {
    ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", saved.c_str(), 1);
  } else {
    ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  }
  EXPECT_EQ(ranks, 4);
  EXPECT_NEAR(shared, alone / 4, 0.2 * alone / 4);
  EXPECT_NE(msg.find("to each of the 4 ranks on this host"), std::string::npos) << msg;
}

// `ulimit -v`: the room left under RLIMIT_AS bounds the estimate (restored afterwards).
TEST(MemoryCheck, AddressSpaceLimitIsHonoured) {
  if (test::under_address_sanitizer())
    GTEST_SKIP() << "AddressSanitizer maps terabytes of shadow memory: no address-space limit fits";
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_AS, &old), 0);
  const double before = static_cast<double>(available_memory_bytes());
  rlimit lower = old;
  // 64 GiB of address space: less than a 65 GiB estimate, whatever the machine has.
  lower.rlim_cur = static_cast<rlim_t>(64 * kGiB);
  if (old.rlim_max != RLIM_INFINITY && old.rlim_max < lower.rlim_cur) GTEST_SKIP() << "hard limit";
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &lower), 0);
  const double limited = static_cast<double>(available_memory_bytes());
  const std::string msg = error_of(65 * kGiB);
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &old), 0);
  EXPECT_LE(limited, 64 * kGiB);
  EXPECT_LE(limited, before);
  EXPECT_NE(msg.find("needs about 65.0 GiB"), std::string::npos) << msg;
}

}  // namespace
}  // namespace distmuon
