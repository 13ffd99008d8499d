#include "format/file_io.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "format/error.h"

namespace tessera {

std::string folder_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

void require_free_space(const std::string& path, uint64_t bytes) {
  const std::string folder = folder_of(path);
  struct statvfs vfs {};
  if (::statvfs(folder.c_str(), &vfs) != 0)
    runtime_error(path, ": cannot write into folder '", folder, "': ", std::strerror(errno));
  const uint64_t free_bytes = uint64_t(vfs.f_bavail) * uint64_t(vfs.f_frsize);
  if (bytes > free_bytes)
    runtime_error(path, ": not enough disk space: the file needs ", bytes, " bytes, ", free_bytes,
                  " bytes are free in '", folder, "'");
}

void pwrite_all(int fd, const void* data, uint64_t n, uint64_t at, const std::string& path) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const size_t chunk = size_t(std::min<uint64_t>(n, uint64_t(1) << 30));
    const ssize_t w = ::pwrite(fd, p, chunk, off_t(at));
    if (w < 0) {
      if (errno == EINTR) continue;
      runtime_error(path, ": write of ", chunk, " bytes at offset ", at, " failed: ", std::strerror(errno));
    }
    p += w;
    at += uint64_t(w);
    n -= uint64_t(w);
  }
}

void commit_temp_file(int fd, const std::string& tmp_path, const std::string& path) {
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp_path.c_str());
    runtime_error(tmp_path, ": fsync failed: ", std::strerror(err));
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp_path.c_str());
    runtime_error(tmp_path, ": close failed: ", std::strerror(err));
  }
  if (::rename(tmp_path.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_path.c_str());
    runtime_error(path, ": cannot rename ", tmp_path, " into place: ", std::strerror(err));
  }
  // Make the rename durable (best effort: some file systems refuse fsync on folders).
  const int dir = ::open(folder_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

}  // namespace tessera
