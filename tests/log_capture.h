#pragma once
// Captures what the process logs through spdlog while the object is alive, for tests that check
// a warning or a message was given.
#include <memory>
#include <string>

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

struct LogCapture {
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink =
      std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1024);
  LogCapture() { spdlog::default_logger()->sinks().push_back(sink); }
  ~LogCapture() { spdlog::default_logger()->sinks().pop_back(); }
  bool contains(const std::string& text) const {
    for (const std::string& line : sink->last_formatted())
      if (line.find(text) != std::string::npos) return true;
    return false;
  }
};
