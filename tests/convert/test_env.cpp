// Removes this test process's temp folder when the tests end.
#include <filesystem>

#include "tests/convert/convert_test_util.h"

namespace {
class TempDirCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(tessera::convert::testing::temp_dir(), ec);
  }
};
[[maybe_unused]] ::testing::Environment* const cleanup = ::testing::AddGlobalTestEnvironment(new TempDirCleanup);
}  // namespace
