// libFuzzer harness: the dataset readers, read_idx (plain or gzip'd IDX) and read_csv, on
// arbitrary bytes. Each input is given to both, so one corpus serves the two formats; the first
// byte also picks read_csv's options (label column -1..2, header line or not) so that those
// paths are explored as well.
//
// A malformed file must be an mt::Error; any other exception, a crash, a leak or a sanitizer
// report is a bug. What reads must be consistent with the shape it reports.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "data/csv.h"
#include "data/idx.h"
#include "fuzz/input_file.h"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "inconsistent result: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static mt::fuzz::InputFile file;
  const std::string& path = file.write(data, size);

  try {
    const mt::IdxArray a = mt::read_idx(path);
    uint64_t numel = 1;
    for (int64_t d : a.shape) numel *= uint64_t(d);
    if (a.shape.empty() || a.data.size() != numel) fail("IDX data size does not match its shape");
  } catch (const mt::Error&) {
  }

  const int label_column = size > 0 ? data[0] % 4 - 1 : -1;
  const bool header = size > 0 && (data[0] & 4);
  try {
    const mt::CsvData c = mt::read_csv(path, label_column, header);
    if (c.rows < 1 || c.cols < 1 || c.labels.size() != size_t(c.rows) ||
        c.features.size() != size_t(c.rows * c.cols))
      fail("CSV sizes do not match rows x cols");
    for (float v : c.features)
      if (!std::isfinite(v)) fail("CSV feature is not finite");
    for (int64_t y : c.labels)
      if (y < 0) fail("CSV label is negative");
  } catch (const mt::Error&) {
  }
  return 0;
}
