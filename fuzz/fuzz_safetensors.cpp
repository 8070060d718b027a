// libFuzzer harness: read_safetensors on arbitrary bytes.
//
// A damaged file must be an mt::Error; any other exception, a crash, a leak or a sanitizer report
// is a bug. A file that reads must hold what the header promised: every entry's data is exactly
// numel × dtype size bytes.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "fuzz/input_file.h"
#include "core/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static mt::fuzz::InputFile file;
  mt::StFile st;
  try {
    st = mt::read_safetensors(file.write(data, size));
  } catch (const mt::Error&) {
    return 0;
  }
  for (const mt::StEntry& e : st.entries) {
    uint64_t numel = 1;
    for (int64_t d : e.shape) numel *= uint64_t(d);
    if (e.data.size() != numel * mt::dtype_size(e.dtype)) {
      std::fprintf(stderr, "tensor '%s': %zu bytes of data for %llu elements\n", e.name.c_str(),
                   e.data.size(), static_cast<unsigned long long>(numel));
      std::abort();
    }
  }
  return 0;
}
