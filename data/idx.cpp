#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/input_file.h"

namespace mt {
namespace {

// gzopen looks for the gzip magic (1f 8b) itself and reads any other file unchanged, so plain and
// gzip'd files share this one reader. Offsets count bytes of the IDX stream, i.e. of the
// decompressed data for a .gz file.
class IdxStream {
 public:
  explicit IdxStream(const std::string& path) : path_(path) {
    errno = 0;
    gz_ = gzdopen(open_regular_file(path), "rb");  // gzdopen closes the descriptor
    MT_CHECK(gz_, path, ": cannot open: ", errno ? std::strerror(errno) : "out of memory");
  }
  ~IdxStream() { gzclose(gz_); }
  IdxStream(const IdxStream&) = delete;
  IdxStream& operator=(const IdxStream&) = delete;

  // Reads up to n bytes; fewer only where the data ends.
  size_t read(void* dst, size_t n) {
    size_t got = 0;
    while (got < n) {
      unsigned chunk = unsigned(std::min<size_t>(n - got, 1u << 30));
      int r = gzread(gz_, static_cast<char*>(dst) + got, chunk);
      if (r <= 0) break;
      got += size_t(r);
    }
    // A truncated or damaged gzip stream shows up as a short read plus an error state.
    int err = Z_OK;
    const char* msg = gzerror(gz_, &err);
    if (err == Z_ERRNO)
      MT_THROW(path_, ": read error near byte offset ", offset_ + got, ": ", std::strerror(errno));
    MT_CHECK(err == Z_OK, path_, ": corrupt or truncated gzip data near byte offset ",
             offset_ + got, " of the decompressed data: ", msg);
    offset_ += got;
    return got;
  }

  uint64_t offset() const { return offset_; }
  const char* offset_note() { return gzdirect(gz_) ? "" : " (of the decompressed data)"; }

 private:
  std::string path_;
  gzFile gz_;
  uint64_t offset_ = 0;
};

uint32_t be32(const uint8_t* b) {
  return uint32_t(b[0]) << 24 | uint32_t(b[1]) << 16 | uint32_t(b[2]) << 8 | uint32_t(b[3]);
}

std::string hex(uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*x", digits, unsigned(v));
  return buf;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s.append(i ? "x" : "").append(std::to_string(shape[i]));
  return s;
}

}  // namespace

IdxArray read_idx(const std::string& path,
                  const std::function<void(const std::vector<int64_t>&)>& check_shape) {
  IdxStream in(path);
  uint8_t magic[4];
  size_t got = in.read(magic, 4);
  MT_CHECK(got == 4, path, ": truncated at byte offset ", got, in.offset_note(),
           ": the file ends inside the 4-byte magic number");
  MT_CHECK(magic[0] == 0 && magic[1] == 0, path, ": bad magic ", hex(be32(magic), 8),
           " at byte offset 0 (expected 0x00000803 for images or 0x00000801 for labels)");
  MT_CHECK(magic[2] == 0x08, path, ": element type ", hex(magic[2], 2),
           " at byte offset 2 is not supported; only unsigned bytes (0x08) are");
  const int ndims = magic[3];
  MT_CHECK(ndims >= 1, path, ": byte offset 3: the magic says the array has no dimensions");

  IdxArray out;
  uint64_t numel = 1, nonzero = 1;  // nonzero: the product of the dimensions other than 0
  for (int i = 0; i < ndims; ++i) {
    const uint64_t at = in.offset();
    uint8_t b[4];
    MT_CHECK(in.read(b, 4) == 4, path, ": truncated at byte offset ", in.offset(), in.offset_note(),
             ": the file ends inside dimension ", i + 1, " of ", ndims);
    const uint32_t d = be32(b);
    // Checked on the non-zero dimensions: after a 0 the count stays 0, but the sizes are still
    // multiplied later (a row's features, say), so they must not overflow either.
    MT_CHECK(d == 0 || nonzero <= uint64_t(std::numeric_limits<int64_t>::max()) / d, path,
             ": byte offset ", at, ": dimension ", i + 1, " (", d,
             ") makes the element count overflow 64 bits");
    numel *= d;
    if (d != 0) nonzero *= d;
    out.shape.push_back(d);
  }
  MT_CHECK(numel <= kMaxIdxBytes, path, ": shape ", shape_str(out.shape), " is ", numel,
           " bytes of data, more than the ", kMaxIdxBytes, " (4 GiB) an IDX file may hold");
  if (check_shape) check_shape(out.shape);

  // Grow the buffer as data arrives, so a header lying about its size cannot demand a huge
  // allocation before the file has shown it has the bytes.
  constexpr uint64_t kChunk = uint64_t(1) << 20;
  while (out.data.size() < numel) {
    const size_t have = out.data.size();
    const size_t want = size_t(std::min(numel - have, kChunk));
    out.data.resize(have + want);
    const size_t n = in.read(out.data.data() + have, want);
    MT_CHECK(n == want, path, ": truncated at byte offset ", in.offset(), in.offset_note(),
             ": shape ", shape_str(out.shape), " needs ", numel, " bytes of data but the file has ",
             have + n);
  }
  uint8_t extra;
  MT_CHECK(in.read(&extra, 1) == 0, path, ": unexpected data at byte offset ", in.offset() - 1,
           in.offset_note(), ": shape ", shape_str(out.shape), " accounts for ", numel,
           " bytes of data and the file has more");
  return out;
}

}  // namespace mt
