#pragma once
// For tests only (not installed): the Hopper attention forward's work counters for launches on
// the framework's stream on the current device (the next work item, the blocks done), read and
// written after that stream's work. A test sets them where a launch in flight there would have
// them and shows that a launch on another stream leaves them alone. Anything but {0, 0} left
// behind makes the next framework-stream forward skip work items.
#include <array>

namespace mt::cuda::testing {

std::array<int, 2> attention_forward_counters();
void set_attention_forward_counters(const std::array<int, 2>& values);

}  // namespace mt::cuda::testing
