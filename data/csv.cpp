#include "data/csv.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string_view>

#include "core/error.h"
#include "core/input_file.h"

namespace mt {
namespace {

struct Cell {
  std::string_view text;  // without surrounding spaces
  size_t column;          // 1-based character column where the cell's text starts
};

void split(std::string_view line, std::vector<Cell>& cells) {
  cells.clear();
  size_t start = 0;
  while (true) {
    size_t end = line.find(',', start);
    if (end == std::string_view::npos) end = line.size();
    size_t b = start, e = end;
    while (b < e && (line[b] == ' ' || line[b] == '\t')) ++b;
    while (e > b && (line[e - 1] == ' ' || line[e - 1] == '\t')) --e;
    cells.push_back({line.substr(b, e - b), b + 1});
    if (end == line.size()) return;
    start = end + 1;
  }
}

bool blank(std::string_view line) {
  return line.find_first_not_of(" \t") == std::string_view::npos;
}

// The file, open for reading: a regular file only (a device or pipe may never end).
std::ifstream open_csv(const std::string& path) {
  MT_CHECK(regular_file(path) || !exists(path), path,
           ": not a regular file; a device or pipe may never end, so it is not read");
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in, path, ": cannot open: ", std::strerror(errno));
  return in;
}

}  // namespace

CsvData read_csv(const std::string& path, int64_t label_column, bool header) {
  MT_CHECK(label_column >= kNoLabelColumn, path, ": label_column must be -1 (the last column) or ",
           "a column index from 0, got ", label_column);
  const bool labelled = label_column != kNoLabelColumn;
  std::ifstream in = open_csv(path);

  CsvData out;
  std::string line;
  std::vector<Cell> cells;
  int64_t lineno = 0;
  int64_t first_line = 0;  // the first data row; it fixes the number of cells per row
  size_t width = 0, label = SIZE_MAX;  // SIZE_MAX: no label column
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (lineno == 1 && line.starts_with("\xEF\xBB\xBF")) line.erase(0, 3);  // a UTF-8 BOM
    if ((header && lineno == 1) || blank(line)) continue;
    split(line, cells);
    const std::string at = path + ":" + std::to_string(lineno) + ":";

    if (first_line == 0) {
      first_line = lineno;
      width = cells.size();
      if (labelled) {
        MT_CHECK(width >= 2, at, "1: need a label and at least one feature, but the row has ",
                 width, " cell");
        MT_CHECK(label_column < int64_t(width), at, "1: label_column ", label_column,
                 " is out of range: the row has ", width, " cells (columns 0..", width - 1, ")");
        label = label_column < 0 ? width - 1 : size_t(label_column);
      }
    }
    if (cells.size() != width) {
      const size_t col = cells.size() > width ? cells[width].column : line.size() + 1;
      MT_THROW(at, col, ": row has ", cells.size(), " cells, expected ", width, " as on line ",
               first_line);
    }

    for (size_t i = 0; i < width; ++i) {
      const std::string_view s = cells[i].text;
      const char* end = s.data() + s.size();
      const std::string where = at + std::to_string(cells[i].column) + ": ";
      if (i == label) {
        int64_t v = 0;
        auto [p, ec] = std::from_chars(s.data(), end, v);
        MT_CHECK(ec == std::errc() && p == end && v >= 0, where,
                 "the label must be a non-negative integer, got '", s, "'");
        out.labels.push_back(v);
      } else {
        float v = 0;
        auto [p, ec] = std::from_chars(s.data(), end, v);
        if (ec == std::errc::result_out_of_range && p == end) {
          // Too small for a float is not an error: 1e-50 rounds to 0 (or a subnormal), as
          // strtof gives it; too large is (strtof's ±inf).
          v = std::strtof(std::string(s).c_str(), nullptr);
          MT_CHECK(!std::isinf(v), where, "cell ", i + 1, ": '", s, "' is out of range for a 32-bit float");
          ec = std::errc();
        }
        MT_CHECK(ec == std::errc() && p == end && std::isfinite(v), where, "cell ", i + 1,
                 ": expected a finite number, got '", s, "'");
        out.features.push_back(v);
      }
    }
    ++out.rows;
  }
  MT_CHECK(!in.bad(), path, ": read error after line ", lineno, ": ", std::strerror(errno));
  MT_CHECK(lineno > 0, path, ":1:1: no data rows (the file is empty)");
  MT_CHECK(out.rows > 0, path, ":", lineno, ":1: no data rows",
           header ? " after the header line" : "");
  out.cols = int64_t(width) - (labelled ? 1 : 0);
  out.first_line = first_line;
  return out;
}

bool csv_header(const std::string& setting, const std::string& path) {
  if (setting != "auto") return setting == "true";
  std::ifstream in = open_csv(path);
  std::string line;
  std::vector<Cell> cells;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (lineno == 1 && line.starts_with("\xEF\xBB\xBF")) line.erase(0, 3);
    if (blank(line)) continue;
    // Only the first line can be a header: a blank line before the first text means none.
    if (lineno != 1) return false;
    split(line, cells);
    for (const Cell& c : cells) {
      double v = 0;
      const char* end = c.text.data() + c.text.size();
      auto [p, err] = std::from_chars(c.text.data(), end, v);
      if (err == std::errc() && p == end) return false;  // a number: a data row (perhaps with a typo)
    }
    return true;
  }
  return false;
}

}  // namespace mt
