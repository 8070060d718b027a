// The config schema is one table (app/config.cpp) that parses, prints (to_yaml, --print-config)
// and documents every key: docs/config.md's reference must be the table's, and to_yaml must write
// every key it documents (a kind's keys when that kind is chosen).
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "app/config.h"
#include "app/registry.h"

namespace mt {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The rows of a markdown table that starts with `header`, through its last line.
std::string table_in(const std::string& text, const std::string& header) {
  const size_t begin = text.find(header);
  if (begin == std::string::npos) return "";
  size_t end = begin;
  while (end < text.size() && text[end] == '|') end = text.find('\n', end) + 1;
  return text.substr(begin, end - begin);
}

TEST(ConfigSchema, TheReferenceInTheDocsIsTheSchemas) {
  const std::string docs = read_text(std::string(MT_SOURCE_DIR) + "/docs/config.md");
  const std::string expected = reference_table();
  EXPECT_EQ(table_in(docs, "| key | type | default | meaning | constraints |"), expected)
      << "docs/config.md's table of keys differs from the schema; `train --config-reference` "
         "prints the table to paste there:\n"
      << expected;
}

// The key paths a YAML document of to_yaml's shape writes: "seed", "model.input", ...
std::set<std::string> written_keys(const std::string& yaml) {
  std::set<std::string> keys;
  std::istringstream lines(yaml);
  std::string line, section;
  while (std::getline(lines, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    if (line.starts_with("  ")) {
      keys.insert(section + "." + line.substr(2, colon - 2));
    } else if (colon + 1 == line.size()) {
      section = line.substr(0, colon);
    } else {
      keys.insert(line.substr(0, colon));
    }
  }
  return keys;
}

// The default config (model.kind mlp, data.kind synthetic) and one config of each documented
// model and data kind, the kind's own keys at their defaults. A kind's keys are written only
// when that kind is chosen (another kind's key is an unknown key to the parser), so no one config
// writes them all.
std::vector<Config> one_config_per_kind() {
  auto defaults = [](const std::vector<app::ParamKey>& keys) {
    Params p;
    for (const app::ParamKey& k : keys) p.values.emplace_back(k.name, k.default_value);
    return p;
  };
  std::vector<Config> out{Config{}};
  for (const app::ModelKind* k : app::model_kinds()) {
    if (!k->documented) continue;
    Config c;
    c.model.kind = k->name;
    c.model.params = defaults(k->keys);
    out.push_back(c);
  }
  for (const app::DataKind* k : app::data_kinds()) {
    if (!k->documented) continue;
    Config c;
    c.data.kind = k->name;
    c.data.params = defaults(k->keys);
    out.push_back(c);
  }
  return out;
}

TEST(ConfigSchema, ToYamlWritesEveryKeyTheReferenceLists) {
  std::set<std::string> documented;
  std::istringstream rows(reference_table());
  for (std::string row; std::getline(rows, row);)
    if (row.starts_with("| `")) documented.insert(row.substr(3, row.find('`', 3) - 3));

  std::set<std::string> written;  // by any config
  for (const Config& c : one_config_per_kind()) {
    const std::string kinds = "model.kind " + c.model.kind + ", data.kind " + c.data.kind;
    const std::set<std::string> keys = written_keys(to_yaml(c));
    for (const std::string& key : keys)
      EXPECT_TRUE(documented.contains(key)) << key << " is written (" << kinds << ") but not documented";
    for (const app::ParamKey& k : app::model_kind(c.model.kind).keys)
      EXPECT_TRUE(keys.contains("model." + k.name)) << "model." << k.name << " is not written (" << kinds << ")";
    for (const app::ParamKey& k : app::data_kind(c.data.kind).keys)
      EXPECT_TRUE(keys.contains("data." + k.name)) << "data." << k.name << " is not written (" << kinds << ")";
    written.insert(keys.begin(), keys.end());
  }
  for (const std::string& key : documented)
    EXPECT_TRUE(written.contains(key)) << key << " is documented but to_yaml writes it for no kind";
  // The schema's own keys, gpt's seven and the token data's four.
  EXPECT_GE(documented.size(), 52u + 7 + 4);
}

}  // namespace
}  // namespace mt
