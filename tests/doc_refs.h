#pragma once
// The docs' references to the code, resolved: what tests/test_doc_refs.cpp runs over docs/*.md
// and README.md. A doc names code in four ways, and each must point at something that exists:
//   `dir/file.ext`               the file (or folder, `dir/`) exists, relative to the repository
//   `dir/file.ext: a, B::c`      and every name after the colon occurs in it as a whole word
//                                (a name with a comma in double quotes: "return {dx, {}}")
//   `dir/name`                   a module: some dir/name.* exists
//   `Suite.Name`, `Suite.*`      a test of that name (a suite with that prefix) in tests/*.cpp
//   [text](relative/link)        the link's target exists, relative to the doc
// Line numbers (`file.cpp:42`, `:42-50`) are refused: they go stale with the first edit above
// them, and nothing can check that line 42 is still the one the text means. Code spans without
// a '/' (a function name, `linear_cuda.h` in a sentence about ops/linear/) and paths under a
// build or run directory are prose, not references.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace mt::test {

struct DocProblem {
  std::string doc;  // the doc's path, relative to the root
  int line;         // 1-based
  std::string ref;  // the reference as written
  std::string why;
};

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// `word` occurs in `text` with no identifier character right before or after it (where the
// word itself starts or ends with one).
inline bool contains_word(const std::string& text, const std::string& word) {
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    const bool left = at == 0 || !ident(word.front()) || !ident(text[at - 1]);
    const size_t end = at + word.size();
    const bool right = end == text.size() || !ident(word.back()) || !ident(text[end]);
    if (left && right) return true;
  }
  return false;
}

// `dir/name` with no extension names a module: dir/name.h, name.cpp, ... (at least one exists).
inline bool is_module(const std::filesystem::path& p) {
  if (p.has_extension() || !std::filesystem::is_directory(p.parent_path())) return false;
  for (const auto& e : std::filesystem::directory_iterator(p.parent_path()))
    if (e.path().stem() == p.filename()) return true;
  return false;
}

// The names after a reference's colon: separated by commas; a name that contains a comma is
// written in double quotes ("return {dx, dw, Tensor()}").
inline std::vector<std::string> split_names(const std::string& list) {
  std::vector<std::string> names;
  size_t i = 0;
  while (i < list.size()) {
    while (i < list.size() && list[i] == ' ') ++i;
    if (i == list.size()) break;
    std::string name;
    if (list[i] == '"') {
      const size_t close = list.find('"', i + 1);
      name = list.substr(i + 1, close == std::string::npos ? std::string::npos : close - i - 1);
      i = close == std::string::npos ? list.size() : close + 1;
      i = std::min(list.find(',', i), list.size()) + 1;
    } else {
      const size_t comma = std::min(list.find(',', i), list.size());
      name = list.substr(i, comma - i);
      name.erase(name.find_last_not_of(' ') + 1);
      i = comma + 1;
    }
    names.push_back(name);
  }
  return names;
}

// The tests of tests/*.cpp as "Suite.Name", from TEST(Suite, Name), TEST_F and TEST_P.
inline std::vector<std::string> test_names(const std::filesystem::path& root) {
  std::vector<std::string> names;
  const std::regex test_re(R"(\bTEST(?:_F|_P)?\(\s*(\w+)\s*,\s*(\w+)\s*\))");
  if (!std::filesystem::is_directory(root / "tests")) return names;
  for (const auto& e : std::filesystem::directory_iterator(root / "tests")) {
    if (e.path().extension() != ".cpp") continue;
    const std::string text = read_text(e.path());
    for (std::sregex_iterator it(text.begin(), text.end(), test_re), end; it != end; ++it)
      names.push_back((*it)[1].str() + "." + (*it)[2].str());
  }
  return names;
}

// `tests` is test_names(root), passed in when many docs are checked against one tree.
inline std::vector<DocProblem> check_doc_references(const std::filesystem::path& root,
                                                    const std::string& doc,
                                                    const std::vector<std::string>& tests) {
  namespace fs = std::filesystem;
  std::vector<DocProblem> problems;
  const fs::path doc_path = root / doc;
  if (!fs::is_regular_file(doc_path)) return {{doc, 0, doc, "the doc itself is missing"}};
  const std::regex code_re("`([^`\n]+)`");
  const std::regex link_re(R"(\]\(([^)\s]+)\))");
  const std::regex path_re(R"(^\.?/?((?:[\w.\-]+/)+[\w.\-]*)(?::\s*(.*))?$)");
  const std::regex line_re(R"((^|[\w.\-/]):\d+(-\d+)?(\s|$|,))");
  const std::regex test_re(R"(^([A-Z]\w*)\.(\*|[A-Z]\w*)$)");
  // Build and run outputs, an installed tree (lib/, include/), elided and absolute paths.
  const std::regex skip_re(R"(^(build|runs|tmp|prefix|lib|include|share)[\w\-]*/|^\$|^~|^/|^\.\.\.)");

  std::istringstream in(read_text(doc_path));
  std::string line;
  bool fenced = false;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.rfind("```", 0) == 0) fenced = !fenced;
    if (fenced) continue;  // a code block is an example, not a reference
    auto problem = [&](const std::string& ref, const std::string& why) {
      problems.push_back({doc, n, ref, why});
    };
    for (std::sregex_iterator it(line.begin(), line.end(), code_re), end; it != end; ++it) {
      const std::string span = (*it)[1].str();
      std::smatch m;
      if (std::regex_search(span, line_re) &&
          (span.front() == ':' || std::regex_match(span, std::regex(R"(^[\w.\-/]+:\d.*)")))) {
        problem(span, "a line number: name a symbol instead (`file: symbol`)");
        continue;
      }
      if (std::regex_match(span, m, test_re)) {
        const std::string suite = m[1].str(), name = m[2].str();
        bool found = false;
        for (const auto& t : tests)
          if (name == "*" ? t.rfind(suite + ".", 0) == 0 : t == suite + "." + name) found = true;
        // Only CamelCase.CamelCase spans whose suite is a known suite prefix are tests: the rest
        // (a type and a member) are prose.
        bool suite_known = false;
        for (const auto& t : tests) suite_known |= t.rfind(suite + ".", 0) == 0;
        if (!found && (suite_known || name == "*" || suite.find("Trap") != std::string::npos ||
                       suite.rfind("Cuda", 0) == 0))
          problem(span, "no such test in tests/*.cpp");
        continue;
      }
      std::string path_part = span.substr(0, span.find(':'));
      while (!path_part.empty() && path_part.back() == ' ') path_part.pop_back();
      if (path_part.rfind("./", 0) == 0) path_part = path_part.substr(2);
      if (path_part.find(' ') != std::string::npos || std::regex_search(path_part, skip_re) ||
          !std::regex_match(span, m, path_re))
        continue;
      const fs::path target = root / path_part;
      if (!fs::exists(target) && !is_module(target)) {
        problem(span, "no such file or folder: " + path_part);
        continue;
      }
      if (!m[2].matched) continue;
      if (!fs::is_regular_file(target)) {
        problem(span, "names symbols in a folder");
        continue;
      }
      const std::string text = read_text(target);
      for (const std::string& name : split_names(m[2].str()))
        if (name.empty() || !contains_word(text, name))
          problem(span, "'" + name + "' does not occur in " + path_part);
    }
    for (std::sregex_iterator it(line.begin(), line.end(), link_re), end; it != end; ++it) {
      std::string target = (*it)[1].str();
      if (target.find("://") != std::string::npos || target.rfind("mailto:", 0) == 0 ||
          target.front() == '#')
        continue;
      target = target.substr(0, target.find('#'));
      if (!fs::exists(doc_path.parent_path() / target)) problem(target, "a link to nothing");
    }
  }
  return problems;
}

inline std::vector<DocProblem> check_doc_references(const std::filesystem::path& root,
                                                    const std::string& doc) {
  return check_doc_references(root, doc, test_names(root));
}

}  // namespace mt::test
