#pragma once
// How minitrain logs: "[14:02:07] message", the `train` program's lines, rather than spdlog's
// default "[2026-12-02 14:02:07.123] [info] message". The library sets this pattern on spdlog's
// default logger as the program starts (a static initializer in train/log_format.cpp, before
// main()), so a program of your own that trains through the library logs the lines `train`
// does; your own spdlog::set_pattern, called later, replaces it.
namespace mt::train {

inline constexpr const char* kLogPattern = "[%H:%M:%S] %v";

}  // namespace mt::train
