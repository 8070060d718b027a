#include "train/log_format.h"

#include <spdlog/spdlog.h>

namespace mt::train {
namespace {

// spdlog's registry is a function-local static, built on first use, so this is safe before main().
[[maybe_unused]] const bool kPatternSet = (spdlog::set_pattern(kLogPattern), true);

}  // namespace
}  // namespace mt::train
