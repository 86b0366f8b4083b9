// Memory estimates against available memory (memory_check.h): the figure in the message, the
// address-space limit honoured, absurd estimates refused.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cmath>
#include <limits>
#include <string>

#include "distmuon/error.h"
#include "distmuon/memory_check.h"

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

// `ulimit -v`: the room left under RLIMIT_AS bounds the estimate (restored afterwards).
TEST(MemoryCheck, AddressSpaceLimitIsHonoured) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer maps terabytes of shadow memory: no address-space limit fits";
#endif
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
