#pragma once
// Metrics as JSON lines (one object per logged step or evaluation, appended and flushed), and the
// loss / accuracy curve drawn from them as a self-contained SVG.
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::train {

class MetricsWriter {
 public:
  // Starts `path` afresh, or, resuming a run from step `resume_step` (>= 0), appends to it so that
  // one file tells the whole run. Records of later steps are dropped first: a run killed after
  // its last checkpoint logged steps that the resumed run logs again.
  // Only a regular file is read back; anything else (a pipe, /dev/stdout) is just appended to.
  MetricsWriter(const std::string& path, int64_t resume_step);
  // Appends and flushes one record; a failed write is an mt::Error naming the file.
  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

struct CurvePoint {
  int64_t step;
  double value;
};

// The series a run's picture is drawn from, each in step order as logged.
struct Curves {
  std::vector<CurvePoint> train_loss;      // "loss": the mean over each logging window
  std::vector<CurvePoint> val_loss;        // "val_loss"
  std::vector<CurvePoint> train_accuracy;  // "accuracy": the logged step's batch
  std::vector<CurvePoint> val_accuracy;    // "val_accuracy"
};

// Reads a metrics file back into its curves (records without a step, and non-numbers, are
// skipped; a path that is not a regular file gives no curves).
Curves read_curves(const std::string& metrics_path);

// Writes an SVG of two panels against the optimizer step: the losses on a log scale (training and
// validation), and the accuracies on a linear scale zoomed to the range they cover. Any series may
// be empty; non-finite values (and non-positive losses, which a log axis cannot show) are left out.
// A failed write is an mt::Error naming the file.
void write_curve_svg(const std::string& path, const Curves& curves, const std::string& title);

}  // namespace mt::train
