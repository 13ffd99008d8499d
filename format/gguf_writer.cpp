// Streaming GGUF writer (see gguf.h): header, metadata and tensor infos first, then tensor bytes
// by pwrite into a pre-sized temporary file that finish() renames into place.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "format/gguf.h"
#include "format/gguf_bytes.h"
#include "format/file_io.h"

namespace tessera {

namespace {

constexpr uint64_t kMaxNameBytes = 63;

uint64_t align_up(uint64_t x, uint64_t a) { return x + (a - x % a) % a; }

// The writer's alignment: general.alignment if set (u32, power of two), else 32.
uint32_t writer_alignment(const Metadata& meta) {
  const GgufValue* v = meta.find("general.alignment");
  if (!v) return 32;
  if (v->type != GgufType::U32 || v->u == 0 || (v->u & (v->u - 1)) != 0)
    usage_error("GGUF writer: general.alignment must be a u32 power of two");
  return uint32_t(v->u);
}

// Assigns dense offsets in order, each tensor padded to `alignment`; returns the data size.
uint64_t assign_offsets(std::vector<GgufTensorInfo>& tensors, uint32_t alignment) {
  uint64_t at = 0;
  for (GgufTensorInfo& t : tensors) {
    t.offset = at;
    at += align_up(t.nbytes, alignment);
  }
  return at;
}


}  // namespace

GgufWriter::GgufWriter() = default;

GgufWriter::~GgufWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

size_t GgufWriter::add_tensor(std::string name, GgmlType type, std::vector<uint64_t> ne) {
  if (fd_ >= 0) usage_error("GGUF writer: add_tensor('", name, "') after begin()");
  const TypeInfo* ti = type_info(uint32_t(type));
  if (!ti) bad_input("GGUF writer: tensor '", name, "': unknown ggml type id ", uint32_t(type));
  if (name.size() > kMaxNameBytes)
    bad_input("GGUF writer: tensor name '", name, "' is ", name.size(), " bytes long (ggml allows at most 63)");
  if (ne.empty() || ne.size() > 4)
    bad_input("GGUF writer: tensor '", name, "': ", ne.size(), " dimensions (expected 1..4)");
  for (const GgufTensorInfo& t : tensors_)
    if (t.name == name) bad_input("GGUF writer: duplicate tensor name '", name, "'");
  GgufTensorInfo t;
  t.name = std::move(name);
  t.n_dims = uint32_t(ne.size());
  t.type = type;
  for (size_t d = 0; d < ne.size(); ++d) t.ne[d] = ne[d];
  if (t.ne[0] % ti->block_elems != 0)
    bad_input("GGUF writer: tensor '", t.name, "': ne[0] = ", t.ne[0], " is not a multiple of the block size ",
              ti->block_elems, " of type ", ti->name);
  const uint64_t limit = uint64_t(std::numeric_limits<int64_t>::max());
  uint64_t elems = 1, nbytes = t.ne[0] / ti->block_elems;
  bool overflow = __builtin_mul_overflow(nbytes, uint64_t(ti->block_bytes), &nbytes);
  for (int d = 0; d < 4; ++d) overflow |= __builtin_mul_overflow(elems, t.ne[d], &elems);
  for (int d = 1; d < 4; ++d) overflow |= __builtin_mul_overflow(nbytes, t.ne[d], &nbytes);
  if (overflow || elems > limit || nbytes > limit)
    bad_input("GGUF writer: tensor '", t.name, "': shape ", t.shape_string(), " overflows the byte count");
  t.nbytes = nbytes;
  tensors_.push_back(std::move(t));
  assign_offsets(tensors_, writer_alignment(meta_));
  return tensors_.size() - 1;
}

uint64_t GgufWriter::total_size() const {
  const uint32_t alignment = writer_alignment(meta_);
  uint64_t header = 4 + 4 + 8 + 8 + meta_.serialize().size();
  for (const GgufTensorInfo& t : tensors_) header += 8 + t.name.size() + 4 + 8 * t.n_dims + 4 + 8;
  uint64_t data = 0;
  for (const GgufTensorInfo& t : tensors_) data += align_up(t.nbytes, alignment);
  return align_up(header, alignment) + data;
}

void GgufWriter::begin(const std::string& path) {
  if (fd_ >= 0) usage_error("GGUF writer: begin('", path, "') called twice (already writing ", path_, ")");
  alignment_ = writer_alignment(meta_);
  const uint64_t data_size = assign_offsets(tensors_, alignment_);

  // Header, metadata, tensor infos, then zero padding up to the data section.
  std::vector<uint8_t> head = {'G', 'G', 'U', 'F'};
  gguf_detail::put<uint32_t>(head, 3);
  gguf_detail::put<uint64_t>(head, tensors_.size());
  gguf_detail::put<uint64_t>(head, meta_.entries().size());
  gguf_detail::serialize_kvs(meta_, head);
  for (const GgufTensorInfo& t : tensors_) {
    gguf_detail::put_string(head, t.name);
    gguf_detail::put<uint32_t>(head, t.n_dims);
    for (uint32_t d = 0; d < t.n_dims; ++d) gguf_detail::put<uint64_t>(head, t.ne[d]);
    gguf_detail::put<uint32_t>(head, uint32_t(t.type));
    gguf_detail::put<uint64_t>(head, t.offset);
  }
  data_offset_ = align_up(head.size(), alignment_);
  head.resize(data_offset_, 0);
  const uint64_t total = data_offset_ + data_size;

  require_free_space(path, total);

  path_ = path;
  tmp_path_ = cat(path, ".tmp-", ::getpid());
  const int fd = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) runtime_error(tmp_path_, ": cannot create file: ", std::strerror(errno));
  fd_ = fd;  // from here the destructor removes the temporary file on failure
  if (::ftruncate(fd_, off_t(total)) != 0)
    runtime_error(tmp_path_, ": cannot size the file to ", total, " bytes: ", std::strerror(errno));
  pwrite_all(fd_, head.data(), head.size(), 0, tmp_path_);
  written_ = std::make_unique<std::atomic<uint64_t>[]>(tensors_.size());
  for (size_t k = 0; k < tensors_.size(); ++k) written_[k].store(0);
}

void GgufWriter::write_tensor(size_t index, const void* data, uint64_t n, uint64_t offset) {
  if (fd_ < 0) usage_error("GGUF writer: write_tensor called before begin() or after finish()");
  if (index >= tensors_.size())
    usage_error("GGUF writer: write_tensor index ", index, " but only ", tensors_.size(), " tensors");
  const GgufTensorInfo& t = tensors_[index];
  if (offset > t.nbytes || n > t.nbytes - offset)
    usage_error("GGUF writer: tensor '", t.name, "': writing ", n, " bytes at offset ", offset,
                " exceeds its size of ", t.nbytes, " bytes");
  pwrite_all(fd_, data, n, data_offset_ + t.offset + offset, tmp_path_);
  written_[index].fetch_add(n);
}

void GgufWriter::finish() {
  if (fd_ < 0) usage_error("GGUF writer: finish() called before begin()");
  for (size_t k = 0; k < tensors_.size(); ++k)
    if (written_[k].load() != tensors_[k].nbytes)
      runtime_error(path_, ": tensor '", tensors_[k].name, "': ", written_[k].load(), " bytes were written, expected ",
                    tensors_[k].nbytes);
  // Zero padding after every tensor (the file was pre-sized with zeros; write it explicitly so
  // the bytes are allocated and the layout does not depend on sparse-file behaviour).
  const std::vector<uint8_t> zeros(alignment_, 0);
  for (const GgufTensorInfo& t : tensors_) {
    const uint64_t pad = align_up(t.nbytes, alignment_) - t.nbytes;
    if (pad) pwrite_all(fd_, zeros.data(), pad, data_offset_ + t.offset + t.nbytes, tmp_path_);
  }
  const int fd = fd_;
  fd_ = -1;  // closed (and on failure removed) by commit_temp_file
  commit_temp_file(fd, tmp_path_, path_);
  written_.reset();
}

}  // namespace tessera
