#pragma once
// Metrics as JSON lines (one object per logged step or evaluation, appended and flushed), and the
// loss / accuracy curve drawn from them as a self-contained SVG.
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <chrono>

#include <nlohmann/json.hpp>

namespace mt::train {

// metrics.jsonl: one JSON object a line. Every record has "step", "run_id" (the run that wrote it),
// "time" (UTC, ISO 8601, to the millisecond) and "elapsed_s" (seconds since this writer opened:
// the run's start, or its resume); the trainer's records are listed in docs/guide.md ("What a run
// writes").
class MetricsWriter {
 public:
  // Starts `path` afresh, or, resuming run `run_id` from step `resume_step` (>= 0), appends to it
  // so that one file tells the whole run. Records of later steps are dropped first: a run killed
  // after its last checkpoint logged steps that the resumed run logs again. A line that is not
  // this run's record (another run's, a notes file's) is a ConfigError, nothing rewritten, unless
  // `overwrite`, which drops it. Only a regular file is read back; anything else (a pipe,
  // /dev/stdout) is just appended to.
  MetricsWriter(const std::string& path, int64_t resume_step, const std::string& run_id = "",
                bool overwrite = false);
  // Appends and flushes one record, with "time" and "elapsed_s" added; a failed write is an
  // mt::Error naming the file.
  void write(nlohmann::json record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string run_id_;
  std::ofstream out_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// How the log prints numbers and times. A value as %.4g: four significant digits at any scale,
// so a small loss stays readable (0.0001234, not 0.0000).
std::string format_value(double v);
// A duration as 42s, 3m07s or 2h05m.
std::string format_duration(double seconds);
// The terminal's live status line: a bar, the step, the smoothed loss (the mean over the logging
// window so far), the
// throughput, elapsed time and the estimate of the time left, e.g.
//   [########------------]   437/3000  loss 0.4123  31.2k samples/s  26s elapsed  1m02s left
// `loss` or `samples_per_s` NaN: not known yet (before the first logged step), left out.
std::string progress_line(int64_t step, int64_t total, double loss, double samples_per_s,
                          double elapsed, double eta);

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
  std::vector<CurvePoint> test_loss;       // "test_loss": the test set's, once, at the run's end
  std::vector<CurvePoint> test_accuracy;   // "test_accuracy"
};

// Reads a metrics file back into its curves (records without a step, and non-numbers, are
// skipped; a path that is not a regular file gives no curves).
Curves read_curves(const std::string& metrics_path);

// Writes an SVG of two panels against the optimizer step: the losses on a log scale (training and
// validation lines, the test point as a diamond), and the accuracies on a linear scale zoomed to
// the range they cover (the same series). Any series may
// be empty; non-finite values (and non-positive losses, which a log axis cannot show) are left out.
// A failed write is an mt::Error naming the file. A `run_id` is recorded as the data-run-id
// attribute of the <svg> element: a resumed run redraws only its own curve (train/run_dir.h).
void write_curve_svg(const std::string& path, const Curves& curves, const std::string& title,
                     const std::string& run_id = "");

}  // namespace mt::train
