// Removes this test process's temp folder when the tests end.
#include <filesystem>

#include "tests/cpu/test_util.h"

namespace {
class TempDirCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(tessera::test::temp_dir(), ec);
  }
};
[[maybe_unused]] ::testing::Environment* const cleanup = ::testing::AddGlobalTestEnvironment(new TempDirCleanup);
}  // namespace
