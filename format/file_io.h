// File writing helpers shared by the GGUF and .tsr writers: a file is written as
// "<path>.tmp-<pid>" in its destination folder and renamed into place only when complete.
#pragma once
#include <cstdint>
#include <string>

namespace tessera {

// The folder part of a path ("." when there is none).
std::string folder_of(const std::string& path);

// Throws Error(Runtime) naming `path` when the folder cannot be inspected or has fewer than
// `bytes` bytes free.
void require_free_space(const std::string& path, uint64_t bytes);

// pwrite all n bytes at `at`, retrying short writes and EINTR; Error(Runtime) naming `path`.
void pwrite_all(int fd, const void* data, uint64_t n, uint64_t at, const std::string& path);

// Finishes a temporary file: fsync, close, rename `tmp_path` onto `path`, then sync the folder
// (best effort). On any failure the temporary file is removed and Error(Runtime) is thrown.
// `fd` is closed in every case.
void commit_temp_file(int fd, const std::string& tmp_path, const std::string& path);

}  // namespace tessera
