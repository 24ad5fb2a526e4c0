#include "core/weight_residency.h"

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "test_util.h"

namespace qf {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST(WeightResidency, AutoReadsIntoMemoryUpToHalfTheAvailableMemory) {
  for (const char* automatic : {static_cast<const char*>(nullptr), "", "auto"}) {
    EXPECT_EQ(choose_weight_residency(automatic, 4 * kGiB, 8 * kGiB), FileResidency::InMemory);
    EXPECT_EQ(choose_weight_residency(automatic, 4 * kGiB + 1, 8 * kGiB), FileResidency::Mapped);
    EXPECT_EQ(choose_weight_residency(automatic, 1, 0), FileResidency::Mapped);  // available memory unknown
  }
}

TEST(WeightResidency, ExplicitChoiceWinsOverTheSize) {
  EXPECT_EQ(choose_weight_residency("memory", 100 * kGiB, 8 * kGiB), FileResidency::InMemory);
  EXPECT_EQ(choose_weight_residency("memory", 1, 0), FileResidency::InMemory);
  EXPECT_EQ(choose_weight_residency("map", 1, 8 * kGiB), FileResidency::Mapped);
  EXPECT_STREQ(residency_name(FileResidency::InMemory), "memory");
  EXPECT_STREQ(residency_name(FileResidency::Mapped), "map");
}

TEST(WeightResidency, UnknownValueIsAUsageError) {
  for (const char* bad : {"mmap", "Memory", " map", "auto "})
    EXPECT_QF_ERROR(choose_weight_residency(bad, 1, kGiB), ErrorKind::Usage,
                    std::string("QF_WEIGHTS: unknown value '") + bad + "' (allowed: auto|memory|map)");
  EXPECT_QF_ERROR(choose_weight_residency("ma\np", 1, kGiB), ErrorKind::Usage, "unknown value 'ma?p'");
}

TEST(WeightResidency, AvailableMemoryIsReadFromProcMeminfo) {
  if (!std::filesystem::exists("/proc/meminfo")) GTEST_SKIP() << "no /proc/meminfo on this system";
  EXPECT_GT(available_memory_bytes(), 0u);
}

}  // namespace
}  // namespace qf
