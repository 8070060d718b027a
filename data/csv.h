#pragma once
// Numeric CSV: one sample per line, comma-separated numbers, one column holding the class label
// (a non-negative integer). Blank lines are skipped; there is no quoting, since every cell is a
// number.
#include <cstdint>
#include <string>
#include <vector>

namespace mt {

struct CsvData {
  std::vector<float> features;  // rows x cols, row-major, the label column removed
  std::vector<int64_t> labels;  // rows
  int64_t rows = 0;
  int64_t cols = 0;  // feature columns
  int64_t first_line = 0;  // the line of the first data row, from 1 (after a header, blank lines)
};

// A label_column for a file of features only (the input of `train predict`): labels stay empty.
inline constexpr int64_t kNoLabelColumn = -2;

// label_column counts from 0; -1 means the last column, kNoLabelColumn none. With `header` the
// first line is skipped.
// Throws mt::Error as "file:line:column: ..." for a cell that is not a finite number, a label that
// is not a non-negative integer, a row with a different number of cells than the first, or a
// file with no data rows; and, before reading, for a path that is not a regular file (a device or
// pipe such as /dev/zero has no size, so nothing would bound the read).
CsvData read_csv(const std::string& path, int64_t label_column = -1, bool header = false);

// data.header for one file: "true", "false", or "auto": whether the file's first line holds no
// number at all (a header of names: "x1,x2,label"). A first line with any number is data, so that
// a typo in it is reported as a bad cell rather than skipped; a header of numbers only ("0,1,2")
// needs data.header: true. Throws like read_csv for a file it cannot open.
bool csv_header(const std::string& setting, const std::string& path);

}  // namespace mt
