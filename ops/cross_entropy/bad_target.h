#pragma once
// A target outside [0, C) that is not ignore_index: the message both devices give for it, and the
// record the CUDA forward leaves for it.
//
// The CPU kernel throws at once. A CUDA kernel cannot throw, and checking the targets on the host
// inside the op would synchronize every step and break CUDA-graph capture. So the forward kernel
// records the first bad target of the call (its lowest row) in this device's record, unless an
// earlier one is still waiting, and carries on; the host raises the record as the CPU's mt::Error
// at its next synchronization with that device (see "device-side error reports" in
// core/cuda/runtime.h).
#include <cstdint>
#include <string>

#ifdef __CUDACC__
#define MT_HOST_DEVICE __host__ __device__
#else
#define MT_HOST_DEVICE
#endif

namespace mt {

// "cross_entropy: row 2 has target 4, outside [0, 4) for C = 4 classes (and not ignore_index -100)"
std::string bad_target_message(int64_t row, int64_t target, int64_t classes, int64_t ignore_index);

struct BadTargetRecord {
  int64_t row = -1;  // -1: nothing waiting
  int64_t target = 0, classes = 0, ignore_index = 0;
};

// Records a bad target unless one is already waiting: the first since the last check is the one
// reported, whatever ran after it.
MT_HOST_DEVICE inline void note_bad_target(BadTargetRecord& r, int64_t row, int64_t target,
                                           int64_t classes, int64_t ignore_index) {
  if (r.row >= 0) return;
  r.target = target;
  r.classes = classes;
  r.ignore_index = ignore_index;
  r.row = row;
}

// If a bad target is waiting, clears the record and throws bad_target_message as an mt::Error.
void raise_bad_target(BadTargetRecord& r);

}  // namespace mt
