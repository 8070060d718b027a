#include "train/metrics.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "core/error.h"

namespace mt::train {

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  std::error_code ec;
  auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  MT_CHECK(out_.good(), "metrics: cannot open '", path, "' for writing");
}

void MetricsWriter::write(const nlohmann::json& record) {
  out_ << record.dump() << '\n';
  out_.flush();  // a killed run keeps every line it logged
}

void read_curve(const std::string& metrics_path, std::vector<CurvePoint>& train_loss,
                std::vector<CurvePoint>& val_accuracy) {
  std::ifstream in(metrics_path);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step")) continue;
    if (j.contains("loss") && j["loss"].is_number())
      train_loss.push_back({j["step"].get<int64_t>(), j["loss"].get<double>()});
    if (j.contains("val_accuracy") && j["val_accuracy"].is_number())
      val_accuracy.push_back({j["step"].get<int64_t>(), j["val_accuracy"].get<double>()});
  }
}

void write_curve_svg(const std::string& path, const std::vector<CurvePoint>& loss,
                     const std::vector<CurvePoint>& acc, const std::string& title) {
  const double W = 640, H = 360, L = 60, R = 60, T = 40, B = 40;  // size and margins
  int64_t max_step = 1;
  for (const auto& p : loss) max_step = std::max(max_step, p.step);
  for (const auto& p : acc) max_step = std::max(max_step, p.step);
  double max_loss = 1e-9;
  for (const auto& p : loss)
    if (std::isfinite(p.value)) max_loss = std::max(max_loss, p.value);
  auto x = [&](int64_t s) { return L + (W - L - R) * double(s) / double(max_step); };
  auto y_loss = [&](double v) { return T + (H - T - B) * (1 - v / max_loss); };
  auto y_acc = [&](double v) { return T + (H - T - B) * (1 - v); };
  auto polyline = [&](const std::vector<CurvePoint>& pts, auto&& fy, const char* color) {
    std::ostringstream s;
    s << "<polyline fill='none' stroke='" << color << "' stroke-width='2' points='";
    for (const auto& p : pts)
      if (std::isfinite(p.value)) s << x(p.step) << ',' << fy(p.value) << ' ';
    s << "'/>\n";
    return s.str();
  };
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
      << "' font-family='sans-serif' font-size='12'>\n"
      << "<rect width='100%' height='100%' fill='white'/>\n"
      << "<text x='" << W / 2 << "' y='22' text-anchor='middle' font-size='14'>" << title << "</text>\n"
      << "<line x1='" << L << "' y1='" << H - B << "' x2='" << W - R << "' y2='" << H - B
      << "' stroke='black'/>\n"
      << "<line x1='" << L << "' y1='" << T << "' x2='" << L << "' y2='" << H - B << "' stroke='black'/>\n"
      << "<line x1='" << W - R << "' y1='" << T << "' x2='" << W - R << "' y2='" << H - B
      << "' stroke='black'/>\n";
  for (int i = 0; i <= 4; ++i) {  // ticks: loss on the left, accuracy on the right, steps below
    double f = i / 4.0;
    svg << "<text x='" << L - 6 << "' y='" << y_loss(f * max_loss) + 4 << "' text-anchor='end' fill='#1f77b4'>"
        << std::setprecision(3) << f * max_loss << "</text>\n"
        << "<text x='" << W - R + 6 << "' y='" << y_acc(f) + 4 << "' fill='#d62728'>" << f << "</text>\n"
        << "<text x='" << x(int64_t(f * double(max_step))) << "' y='" << H - B + 16
        << "' text-anchor='middle'>" << int64_t(f * double(max_step)) << "</text>\n";
  }
  svg << polyline(loss, y_loss, "#1f77b4") << polyline(acc, y_acc, "#d62728")
      << "<text x='" << L + 10 << "' y='" << T + 14 << "' fill='#1f77b4'>training loss</text>\n"
      << "<text x='" << W - R - 10 << "' y='" << T + 14
      << "' text-anchor='end' fill='#d62728'>validation accuracy</text>\n"
      << "<text x='" << W / 2 << "' y='" << H - 6 << "' text-anchor='middle'>optimizer step</text>\n"
      << "</svg>\n";
  std::ofstream out(path, std::ios::trunc);
  MT_CHECK(out.good(), "curve: cannot write '", path, "'");
  out << svg.str();
}

}  // namespace mt::train
