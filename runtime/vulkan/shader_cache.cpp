#include "runtime/vulkan/shader_cache.h"

#include <shaderc/shaderc.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "format/error.h"
#include "shaders/embedded.h"

namespace tessera::vk {
namespace fs = std::filesystem;
namespace {

constexpr uint32_t kSpirvMagic = 0x07230203u;

const shaders::EmbeddedFile* find_embedded(std::string_view name) {
  for (const auto& f : shaders::embedded())
    if (f.name == name) return &f;
  return nullptr;
}

bool is_header(std::string_view name) {
  return name.ends_with(".glsl") || name.ends_with(".h");
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Hashes a sequence of byte strings, each prefixed by its length (so "ab"+"c" != "a"+"bc").
class Hasher {
 public:
  Hasher() : s_(XXH64_createState()) { XXH64_reset(s_, 0); }
  ~Hasher() { XXH64_freeState(s_); }
  Hasher& add(const void* p, size_t n) {
    const uint64_t len = n;
    XXH64_update(s_, &len, sizeof len);
    XXH64_update(s_, p, n);
    return *this;
  }
  Hasher& add(std::string_view s) { return add(s.data(), s.size()); }
  Hasher& add_u64(uint64_t v) { return add(&v, sizeof v); }
  uint64_t digest() const { return XXH64_digest(s_); }

 private:
  XXH64_state_t* s_;
};

// shaderc include callbacks over the embedded files.
struct IncludeResult {
  shaderc_include_result result{};
  std::string name, content;
};

shaderc_include_result* resolve_include(void*, const char* requested, int, const char*, size_t) {
  auto* r = new IncludeResult;
  if (const auto* f = find_embedded(requested)) {
    r->name = std::string(f->name);
    r->content = std::string(f->source);
  } else {
    r->content = cat("tessera: no embedded shader file named '", requested, "'");
  }
  r->result.source_name = r->name.c_str();
  r->result.source_name_length = r->name.size();
  r->result.content = r->content.c_str();
  r->result.content_length = r->content.size();
  r->result.user_data = r;
  return &r->result;
}

void release_include(void*, shaderc_include_result* result) { delete static_cast<IncludeResult*>(result->user_data); }

bool read_spirv(const fs::path& path, std::vector<uint32_t>& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 20 || size % 4 != 0) return false;
  in.seekg(0);
  out.resize(static_cast<size_t>(size) / 4);
  if (!in.read(reinterpret_cast<char*>(out.data()), size)) return false;
  return out[0] == kSpirvMagic;
}

}  // namespace

fs::path ShaderCache::default_dir() {
  if (const char* d = std::getenv("TESSERA_CACHE_DIR"); d && *d) return fs::path(d);
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return fs::path(x) / "tessera";
  if (const char* h = std::getenv("HOME"); h && *h) return fs::path(h) / ".cache" / "tessera";
  return fs::path(".tessera-cache");
}

bool ShaderCache::write_file_atomic(const fs::path& path, const void* bytes, size_t size) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  const fs::path tmp = path.string() + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return false;
    out.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(size));
    if (!out) {
      out.close();
      fs::remove(tmp, ec);
      return false;
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) fs::remove(tmp, ec);
  return !ec;
}

ShaderCache::ShaderCache(const DeviceInfo& device, fs::path dir) : dir_(dir.empty() ? default_dir() : std::move(dir)) {
  Hasher dk;
  dk.add_u64(device.vendor_id).add_u64(device.device_id).add_u64(device.driver_version);
  dk.add(device.pipeline_cache_uuid.data(), device.pipeline_cache_uuid.size());
  dk.add(device.driver_info);
  device_key_ = hex64(dk.digest());

  Hasher hh;
  uint32_t spv_version = 0, spv_revision = 0;
  shaderc_get_spv_version(&spv_version, &spv_revision);
  hh.add("tessera-spirv-v1").add_u64(spv_version).add_u64(spv_revision);
  for (const auto& f : shaders::embedded())
    if (is_header(f.name)) hh.add(f.name).add(f.source);
  headers_hash_ = hh.digest();
}

ShaderCache::~ShaderCache() {
  if (compiler_) shaderc_compiler_release(static_cast<shaderc_compiler_t>(compiler_));
}

std::vector<uint32_t> ShaderCache::spirv(std::string_view file, const ShaderDefines& defines) {
  const auto* src = find_embedded(file);
  if (!src) runtime_error("shader '", file, "' is not among the embedded shader files");
  Hasher h;
  h.add_u64(headers_hash_).add(device_key_).add(file).add(src->source);
  for (const auto& [k, v] : defines) h.add(k).add(v);
  const fs::path path = dir_ / "spirv" / (hex64(h.digest()) + ".spv");

  std::lock_guard lock(mutex_);
  std::vector<uint32_t> code;
  if (read_spirv(path, code)) return code;
  code = compile(file, src->source, defines);
  if (!write_file_atomic(path, code.data(), code.size() * 4) && !warned_) {
    warned_ = true;
    std::fprintf(stderr, "tessera: warning: cannot write the shader cache under %s; shaders will be compiled again next run\n",
                 dir_.string().c_str());
  }
  return code;
}

std::vector<uint32_t> ShaderCache::compile(std::string_view file, std::string_view source, const ShaderDefines& defines) {
  if (!compiler_) {
    compiler_ = shaderc_compiler_initialize();
    if (!compiler_) runtime_error("shaderc: cannot initialize the GLSL compiler");
  }
  shaderc_compile_options_t opt = shaderc_compile_options_initialize();
  shaderc_compile_options_set_source_language(opt, shaderc_source_language_glsl);
  shaderc_compile_options_set_target_env(opt, shaderc_target_env_vulkan, shaderc_env_version_vulkan_1_2);
  shaderc_compile_options_set_target_spirv(opt, shaderc_spirv_version_1_5);
  shaderc_compile_options_set_optimization_level(opt, shaderc_optimization_level_performance);
  shaderc_compile_options_set_warnings_as_errors(opt);
  shaderc_compile_options_set_include_callbacks(opt, resolve_include, release_include, nullptr);
  for (const auto& [k, v] : defines) shaderc_compile_options_add_macro_definition(opt, k.data(), k.size(), v.data(), v.size());

  const std::string name(file);
  shaderc_compilation_result_t res = shaderc_compile_into_spv(static_cast<shaderc_compiler_t>(compiler_), source.data(),
                                                              source.size(), shaderc_glsl_compute_shader, name.c_str(),
                                                              "main", opt);
  shaderc_compile_options_release(opt);
  const bool ok = shaderc_result_get_compilation_status(res) == shaderc_compilation_status_success;
  std::vector<uint32_t> code;
  std::string messages = shaderc_result_get_error_message(res);
  if (ok) {
    const size_t bytes = shaderc_result_get_length(res);
    code.resize(bytes / 4);
    std::memcpy(code.data(), shaderc_result_get_bytes(res), bytes);
  }
  shaderc_result_release(res);
  if (!ok) {
    std::string defs;
    for (const auto& [k, v] : defines) defs += cat(" ", k, "=", v);
    runtime_error("shader compilation of ", name, " failed (defines:", defs, "):\n", messages);
  }
  compiles_++;
  return code;
}

}  // namespace tessera::vk
