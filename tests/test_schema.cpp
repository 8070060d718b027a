// The config schema is one table (app/config.cpp) that parses, prints (to_yaml, --print-config)
// and documents every key: docs/config.md's reference must be the table's, and to_yaml must write
// every key it documents.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "app/config.h"

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

TEST(ConfigSchema, ToYamlWritesEveryKeyTheReferenceLists) {
  const std::set<std::string> written = written_keys(to_yaml(Config{}));
  std::istringstream rows(reference_table());
  std::string row;
  size_t documented = 0;
  while (std::getline(rows, row)) {
    if (!row.starts_with("| `")) continue;
    const std::string key = row.substr(3, row.find('`', 3) - 3);
    EXPECT_TRUE(written.contains(key)) << key << " is documented but to_yaml does not write it";
    ++documented;
  }
  EXPECT_EQ(documented, written.size());
  EXPECT_GE(documented, 52u);
}

}  // namespace
}  // namespace mt
