// libFuzzer harness: parse_config on arbitrary text.
//
// The input is YAML, optionally followed by NUL-separated `--set` overrides ("key.path=value"),
// so the override path is fuzzed too. A bad config must be a ConfigError; any other exception, a
// crash or a sanitizer report is a bug. A config that parses must survive its own round trip,
// parse_config(to_yaml(c)) == c, as config.h promises (checkpoints store the config that way).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "app/config.h"
#include "app/registry.h"

// The kinds a config names by default, by name only: parsing asks the registries
// (app/registry.h) for their names and keys, and this harness links the parser alone.
static const mt::app::RegisterModel mlp(
    {.name = "mlp", .build = [](const mt::Config&) { return std::shared_ptr<mt::nn::Module>(); }});
static const mt::app::RegisterData synthetic(
    {.name = "synthetic", .load = [](const mt::DataConfig&, const mt::ModelConfig&, bool) { return mt::data::Dataset{}; }});
static const mt::app::RegisterData mnist(
    {.name = "mnist", .load = [](const mt::DataConfig&, const mt::ModelConfig&, bool) { return mt::data::Dataset{}; }});
static const mt::app::RegisterData csv(
    {.name = "csv", .load = [](const mt::DataConfig&, const mt::ModelConfig&, bool) { return mt::data::Dataset{}; }});

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  for (size_t begin = 0;;) {
    const size_t end = input.find('\0', begin);
    parts.push_back(input.substr(begin, end - begin));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());

  mt::Config c;
  try {
    c = mt::parse_config(parts[0], "fuzz.yaml", overrides);
  } catch (const mt::ConfigError&) {
    return 0;
  }
  if (!(mt::parse_config(mt::to_yaml(c), "round-trip.yaml") == c)) {
    std::fprintf(stderr, "to_yaml round trip changed the config:\n%s", mt::to_yaml(c).c_str());
    std::abort();
  }
  return 0;
}
