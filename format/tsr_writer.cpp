// Streaming .tsr writer (see tsr.h, docs/FORMAT.md §9): metadata first, tensor bytes by pwrite
// into a pre-sized temporary file, then the per-tensor hashes, directory and header last,
// fsync, rename.
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "format/error.h"
#include "format/tsr.h"
#include "format/tsr_codec.h"
#include "format/file_io.h"

namespace tessera {

namespace {

constexpr int kZstdLevel = 9;  // metadata is a few MB (tokenizer): compresses in well under a second


// Assigns offsets from `data_offset` on (FORMAT.md §5); returns the end of the last tensor.
uint64_t assign_offsets(std::vector<TsrTensor>& tensors, uint64_t data_offset) {
  uint64_t at = data_offset;
  int32_t prev_layer = INT32_MIN;
  for (TsrTensor& t : tensors) {
    at = align_up(at, t.layer != prev_layer ? kTsrGroupAlign : kTsrTensorAlign);
    t.offset = at;
    at += t.nbytes;
    prev_layer = t.layer;
  }
  return at;
}

}  // namespace

TsrWriter::TsrWriter() = default;

TsrWriter::~TsrWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

size_t TsrWriter::add_tensor(TsrTensor t) {
  if (fd_ >= 0) usage_error(".tsr writer: add_tensor('", t.name, "') after begin()");
  tsr_codec::validate_entry(t, "<tsr writer>", /*fill=*/false);
  for (const TsrTensor& o : tensors_)
    if (o.name == t.name) usage_error(".tsr writer: duplicate tensor name '", t.name, "'");
  if (t.layer >= 0 && !tensors_.empty() && tensors_.back().layer != t.layer)
    for (const TsrTensor& o : tensors_)
      if (o.layer == t.layer)
        usage_error(".tsr writer: tensor '", t.name, "' of block ", t.layer, " does not follow the block's other tensors");
  t.offset = 0;
  t.xxh64 = 0;
  tensors_.push_back(std::move(t));
  return tensors_.size() - 1;
}

uint64_t TsrWriter::tensor_bytes() const {
  uint64_t n = 0;
  for (const TsrTensor& t : tensors_) n += t.nbytes;
  return n;
}

uint64_t TsrWriter::planned_size(uint64_t metadata_bytes) const {
  std::vector<TsrTensor> copy = tensors_;
  const uint64_t meta_end = kTsrHeaderBytes + copy.size() * kTsrEntryBytes + metadata_bytes;
  return align_up(assign_offsets(copy, align_up(meta_end, kTsrGroupAlign)), kTsrGroupAlign);
}

void TsrWriter::begin(const std::string& path) {
  if (fd_ >= 0) usage_error(".tsr writer: begin('", path, "') called twice");
  if (tensors_.empty()) usage_error(".tsr writer: no tensors to write");

  const std::vector<uint8_t> raw = meta_.serialize();
  std::vector<uint8_t> packed(ZSTD_compressBound(raw.size()));
  const size_t zn = ZSTD_compress(packed.data(), packed.size(), raw.data(), raw.size(), kZstdLevel);
  if (ZSTD_isError(zn)) runtime_error(path, ": zstd compression of the metadata failed: ", ZSTD_getErrorName(zn));
  packed.resize(zn);
  // The reader's bounds (tsr_codec.h), checked before anything is written: no file it would refuse.
  if (raw.size() > tsr_codec::kMaxMetadataRaw || raw.size() > tsr_codec::metadata_ratio_bound(zn))
    bad_input(path, ": the metadata (", raw.size(), " bytes, ", zn, " compressed) is past what a .tsr reader accepts (",
              tsr_codec::kMaxMetadataRaw, " bytes, ", tsr_codec::kMaxMetadataRatio, " x its compressed size + ",
              tsr_codec::kMetadataRatioSlack, ")");

  TsrHeader& h = header_;
  h = TsrHeader{};
  h.tensor_count = tensors_.size();
  h.directory_offset = kTsrHeaderBytes;
  h.directory_size = tensors_.size() * kTsrEntryBytes;
  h.metadata_offset = h.directory_offset + h.directory_size;
  h.metadata_size = packed.size();
  h.metadata_raw_size = raw.size();
  h.metadata_kv_count = meta_.entries().size();
  h.metadata_xxh64 = XXH64(packed.data(), packed.size(), 0);
  h.data_offset = align_up(h.metadata_offset + h.metadata_size, kTsrGroupAlign);
  h.file_size = align_up(assign_offsets(tensors_, h.data_offset), kTsrGroupAlign);
  h.data_size = h.file_size - h.data_offset;
  for (const TsrTensor& t : tensors_) {
    if (t.composed() && t.name.ends_with("attn_qk.weight")) h.flags |= kTsrFlagComposedQk;
    if (t.composed() && t.name.ends_with("attn_vo.weight")) h.flags |= kTsrFlagComposedVo;
  }

  require_free_space(path, h.file_size);

  path_ = path;
  tmp_path_ = cat(path, ".tmp-", ::getpid());
  const int fd = ::open(tmp_path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) runtime_error(tmp_path_, ": cannot create file: ", std::strerror(errno));
  fd_ = fd;  // from here the destructor removes the temporary file on failure
  if (::ftruncate(fd_, off_t(h.file_size)) != 0)
    runtime_error(tmp_path_, ": cannot size the file to ", h.file_size, " bytes: ", std::strerror(errno));
  pwrite_all(fd_, packed.data(), packed.size(), h.metadata_offset, tmp_path_);
  written_ = std::make_unique<std::atomic<uint64_t>[]>(tensors_.size());
  for (size_t k = 0; k < tensors_.size(); ++k) written_[k].store(0);
}

void TsrWriter::write(size_t index, const void* data, uint64_t n, uint64_t offset) {
  if (fd_ < 0) usage_error(".tsr writer: write() called before begin() or after finish()");
  if (index >= tensors_.size()) usage_error(".tsr writer: write() index ", index, " but only ", tensors_.size(), " tensors");
  const TsrTensor& t = tensors_[index];
  if (offset > t.nbytes || n > t.nbytes - offset)
    usage_error(".tsr writer: tensor '", t.name, "': writing ", n, " bytes at offset ", offset, " exceeds its size of ",
                t.nbytes, " bytes");
  pwrite_all(fd_, data, n, t.offset + offset, tmp_path_);
  written_[index].fetch_add(n);
}

void TsrWriter::finish(unsigned threads) {
  if (fd_ < 0) usage_error(".tsr writer: finish() called before begin()");
  for (size_t k = 0; k < tensors_.size(); ++k)
    if (written_[k].load() != tensors_[k].nbytes)
      runtime_error(path_, ": tensor '", tensors_[k].name, "': ", written_[k].load(), " bytes were written, expected ",
                    tensors_[k].nbytes);
  // Hash what is in the file (so the checksums describe the bytes on disk, whatever order and
  // thread wrote them), in parallel over tensors, reading with pread into a small buffer per
  // thread (a mapping would pull the whole file into this process's resident memory).
  {
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    std::string error;
    std::mutex mu;
    auto work = [&] {
      std::vector<uint8_t> buf(size_t(16) << 20);
      XXH64_state_t* st = XXH64_createState();
      for (size_t i; !failed && (i = next.fetch_add(1)) < tensors_.size();) {
        TsrTensor& t = tensors_[i];
        XXH64_reset(st, 0);
        for (uint64_t at = 0; at < t.nbytes;) {
          const size_t want = size_t(std::min<uint64_t>(buf.size(), t.nbytes - at));
          const ssize_t got = ::pread(fd_, buf.data(), want, off_t(t.offset + at));
          if (got <= 0) {
            if (got < 0 && errno == EINTR) continue;
            std::lock_guard<std::mutex> lock(mu);
            error = cat(tmp_path_, ": reading back tensor '", t.name, "' failed: ", got < 0 ? std::strerror(errno) : "end of file");
            failed = true;
            break;
          }
          XXH64_update(st, buf.data(), size_t(got));
          at += uint64_t(got);
        }
        t.xxh64 = XXH64_digest(st);
      }
      XXH64_freeState(st);
    };
    std::vector<std::thread> pool;
    for (unsigned k = 1; k < std::max(1u, threads); ++k) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
    if (failed) runtime_error(error);
  }
  std::vector<uint8_t> head(kTsrHeaderBytes + header_.directory_size, 0);
  for (size_t i = 0; i < tensors_.size(); ++i)
    tsr_codec::encode_entry(tensors_[i], head.data() + kTsrHeaderBytes + i * kTsrEntryBytes);
  tsr_codec::encode_header(header_, head.data());
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  XXH64_update(st, head.data(), tsr_codec::kHeaderHashedBytes);
  XXH64_update(st, head.data() + kTsrHeaderBytes, header_.directory_size);
  header_.header_xxh64 = XXH64_digest(st);
  XXH64_freeState(st);
  tsr_codec::set<uint64_t>(head.data(), tsr_codec::kOffHeaderHash, header_.header_xxh64);
  pwrite_all(fd_, head.data(), head.size(), 0, tmp_path_);

  const int fd = fd_;
  fd_ = -1;  // closed (and on failure removed) by commit_temp_file
  commit_temp_file(fd, tmp_path_, path_);
  written_.reset();
}

}  // namespace tessera
