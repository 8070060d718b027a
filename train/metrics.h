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
  // Appends to `path` when resuming (so one file tells the whole run), truncates otherwise.
  MetricsWriter(const std::string& path, bool append);
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

// Writes an SVG with the training loss (left axis) and the validation accuracy (right axis,
// 0..1) against the step. Either series may be empty.
void write_curve_svg(const std::string& path, const std::vector<CurvePoint>& train_loss,
                     const std::vector<CurvePoint>& val_accuracy, const std::string& title);

// Reads a metrics file back into the two series (records with "loss" and with "val_accuracy").
void read_curve(const std::string& metrics_path, std::vector<CurvePoint>& train_loss,
                std::vector<CurvePoint>& val_accuracy);

}  // namespace mt::train
