// ShaderCache: owns the libshaderc compiler (created at first use) and the on-disk SPIR-V cache.
// Sources are the embedded shaders/ files (tessera::shaders::embedded()); `#include "x"` resolves
// to embedded file x. A SPIR-V module is keyed by xxh64 of: the entry file's source, every
// embedded header (*.glsl, *.h: a superset of what it may include), the sorted defines, and the
// device (vendor, device id, driver version, pipeline-cache UUID). Cache directory:
// $TESSERA_CACHE_DIR, else $XDG_CACHE_HOME/tessera, else ~/.cache/tessera (spirv/ inside).
// A warm start compiles nothing: compile_count() counts actual compilations.
#pragma once
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/vulkan/instance.h"

namespace tessera::vk {

// Preprocessor defines, name -> value (sorted, so the key does not depend on insertion order).
using ShaderDefines = std::map<std::string, std::string>;

class ShaderCache {
 public:
  // dir empty = default_dir(). The directory is created on the first write; when it cannot be
  // written the cache works in memory only (one warning on stderr).
  ShaderCache(const DeviceInfo& device, std::filesystem::path dir = {});
  ~ShaderCache();
  ShaderCache(const ShaderCache&) = delete;
  ShaderCache& operator=(const ShaderCache&) = delete;

  // SPIR-V of embedded file `file` (e.g. "matvec.comp") compiled as GLSL compute with `defines`.
  // Throws Error(Runtime) with the compiler's messages when compilation fails.
  std::vector<uint32_t> spirv(std::string_view file, const ShaderDefines& defines);

  // Number of GLSL -> SPIR-V compilations this object performed (cache misses).
  uint64_t compile_count() const { return compiles_.load(); }
  const std::filesystem::path& dir() const { return dir_; }
  // 16 hex digits identifying the device/driver, used in cache file names.
  const std::string& device_key() const { return device_key_; }

  // $TESSERA_CACHE_DIR, else $XDG_CACHE_HOME/tessera, else $HOME/.cache/tessera, else ./.tessera-cache.
  static std::filesystem::path default_dir();

  // Writes `bytes` to `path` atomically (temporary file + rename); false on failure.
  static bool write_file_atomic(const std::filesystem::path& path, const void* bytes, size_t size);

 private:
  std::vector<uint32_t> compile(std::string_view file, std::string_view source, const ShaderDefines& defines);

  std::filesystem::path dir_;
  std::string device_key_;
  uint64_t headers_hash_ = 0;
  std::atomic<uint64_t> compiles_{0};
  std::mutex mutex_;
  void* compiler_ = nullptr;  // shaderc_compiler_t, created on first compile
  bool warned_ = false;
};

}  // namespace tessera::vk
