// tessera's version and the git commit it was built from (written at build time by
// cmake/version.cmake, so a new commit recompiles one file).
#pragma once

namespace tessera {
const char* tessera_version();     // "0.1.0"
const char* tessera_git_commit();  // short hash, or "unknown" outside a git checkout
}  // namespace tessera
