// A read-only memory mapping of a whole file (RAII).
#pragma once
#include <cstdint>
#include <span>
#include <string>

namespace tessera {

class MappedFile {
 public:
  // Throws Error(Runtime) if the file cannot be opened or mapped (message names the path and errno).
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace tessera
