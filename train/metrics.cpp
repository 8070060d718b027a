#include "train/metrics.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"

namespace mt::train {

namespace {

// Only a regular file is read back: a device or a pipe (/dev/stdout, /dev/full) can be written
// to, but reading one may block or never end.
bool readable(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

// Keeps only run `run_id`'s complete records of steps up to `last_step` in `path` (a last line
// cut short by a kill is dropped too). Any other line (another run's record, or no record at
// all) is a ConfigError naming it, unless `overwrite`, which drops it too. Rewritten through a
// temp file and a rename, so that a kill meanwhile leaves the old file whole.
void drop_records_after(const std::string& path, int64_t last_step, const std::string& run_id,
                        bool overwrite) {
  if (!readable(path)) return;
  std::ifstream in(path);
  std::string kept, line;
  bool dropped = false;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool record = j.is_object() && j.contains("step") && j["step"].is_number_integer();
    const bool cut_short = in.eof() && !record;  // the last line, without its newline
    if ((!record && !cut_short) || (record && j.value("run_id", std::string()) != run_id)) {
      if (!overwrite)
        throw ConfigError("logging.metrics: line " + std::to_string(lineno) + " of '" + path +
                          "' is not a record of this run (" +
                          (record ? "run_id " + j.value("run_id", std::string("none")) + ", this run's is " + run_id
                                  : std::string("not a metrics record")) +
                          "); resuming would rewrite the file without it. Pick another logging.metrics, or set "
                          "checkpoint.overwrite=true to drop such lines");
      dropped = true;
    } else if (record && j["step"].get<int64_t>() <= last_step) {
      kept += line + '\n';
    } else {
      dropped = true;
    }
  }
  if (!dropped) return;
  write_file_atomically(path, kept);
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, int64_t resume_step, const std::string& run_id,
                             bool overwrite)
    : path_(path), run_id_(run_id) {
  if (resume_step >= 0) drop_records_after(path, resume_step, run_id, overwrite);
  std::error_code ec;
  auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  out_.open(path, resume_step >= 0 ? std::ios::app : std::ios::trunc);
  MT_CHECK(out_.good(), "metrics: cannot open '", path, "' for writing");
}

void MetricsWriter::write(nlohmann::json record) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm utc{};
  gmtime_r(&t, &utc);
  char stamp[80];  // GCC bounds each %d by int's range, 78 bytes; the real stamp is 24
  std::snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, int(ms));
  if (!run_id_.empty()) record["run_id"] = run_id_;
  record["time"] = stamp;
  record["elapsed_s"] =
      std::round(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() * 1e3) / 1e3;
  out_ << record.dump() << '\n';
  out_.flush();  // a killed run keeps every line it logged
  // A failed write (a full disk) stops the run: the stream would drop every later record.
  MT_CHECK(out_.good(), "metrics: cannot write to '", path_, "': ", std::strerror(errno));
}

std::string format_value(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<long long>(std::llround(seconds));
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%llds", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, s / 60 % 60);
  return buf;
}

std::string progress_line(int64_t step, int64_t total, double loss, double samples_per_s,
                          double elapsed, double eta) {
  constexpr int64_t kWidth = 20;
  const int64_t filled = total > 0 ? std::clamp<int64_t>(step * kWidth / total, 0, kWidth) : 0;
  std::string line =
      std::string("[").append(size_t(filled), '#').append(size_t(kWidth - filled), '-').append("]");
  char buf[64];
  const int digits = int(std::to_string(total).size());
  std::snprintf(buf, sizeof buf, " %*lld/%lld", digits, static_cast<long long>(step),
                static_cast<long long>(total));
  line += buf;
  if (std::isfinite(loss)) line += "  loss " + format_value(loss);
  if (std::isfinite(samples_per_s)) {
    const double v = samples_per_s;
    const char* unit = v >= 1e6 ? "M" : v >= 1e3 ? "k" : "";
    std::snprintf(buf, sizeof buf, "  %.3g%s samples/s", v >= 1e6 ? v / 1e6 : v >= 1e3 ? v / 1e3 : v, unit);
    line += buf;
  }
  return line + "  " + format_duration(elapsed) + " elapsed  " + format_duration(eta) + " left";
}

Curves read_curves(const std::string& metrics_path) {
  Curves c;
  const std::pair<const char*, std::vector<CurvePoint>*> series[] = {
      {"loss", &c.train_loss},
      {"val_loss", &c.val_loss},
      {"accuracy", &c.train_accuracy},
      {"val_accuracy", &c.val_accuracy},
      {"test_loss", &c.test_loss},
      {"test_accuracy", &c.test_accuracy},
  };
  if (!readable(metrics_path)) return c;
  std::ifstream in(metrics_path);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    for (const auto& [key, points] : series)
      if (j.contains(key) && j[key].is_number())
        points->push_back({j["step"].get<int64_t>(), j[key].get<double>()});
  }
  return c;
}

namespace {

// 1, 2 or 5 times a power of ten: the first such step >= raw.
double nice_step(double raw) {
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw * (1 - 1e-9)) return m * p;
  return 10 * p;
}

// The values 1, 2, 5 times a power of ten from the largest <= lo to the smallest >= hi.
std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> all;
  for (int e = int(std::floor(std::log10(lo))) - 1; e <= int(std::ceil(std::log10(hi))); ++e)
    for (double m : {1.0, 2.0, 5.0}) all.push_back(m * std::pow(10.0, e));
  std::vector<double> ticks;
  for (size_t i = 0; i < all.size(); ++i) {
    const bool below = i + 1 < all.size() && all[i + 1] <= lo * (1 + 1e-9);
    const bool above = i > 0 && all[i - 1] >= hi * (1 - 1e-9);
    if (!below && !above) ticks.push_back(all[i]);
  }
  return ticks;
}

std::string num(double v, int precision = 3) {
  std::ostringstream s;
  s << std::setprecision(precision) << v;
  return s.str();
}

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (ch == '&') out += "&amp;";
    else if (ch == '<') out += "&lt;";
    else if (ch == '>') out += "&gt;";
    else out += ch;
  }
  return out;
}

// One plot: a box on the page, the step range across and a value range up (log or linear).
struct Panel {
  double left, top, width, height;
  double max_step;
  double lo, hi;
  bool log_scale;

  double x(double step) const { return left + width * step / max_step; }
  double y(double v) const {
    const double f = log_scale ? std::log(v / lo) / std::log(hi / lo) : (v - lo) / (hi - lo);
    return top + height * (1 - f);
  }
  bool shows(double v) const { return std::isfinite(v) && (!log_scale || v > 0); }
};

constexpr const char* kTrainColor = "#1f77b4";
constexpr const char* kValColor = "#e8710a";
constexpr const char* kTestColor = "#2ca02c";

// Grid, ticks, frame, title and x label of a panel.
void draw_axes(std::ostream& svg, const Panel& p, const std::vector<double>& y_ticks,
               const std::string& title) {
  const double step_tick = std::max(1.0, nice_step(p.max_step / 6));
  svg << std::fixed << std::setprecision(1);
  for (double s = 0; s <= p.max_step * (1 + 1e-9); s += step_tick)
    svg << "<line x1='" << p.x(s) << "' y1='" << p.top << "' x2='" << p.x(s) << "' y2='"
        << p.top + p.height << "' stroke='#e6e6e6'/>\n"
        << "<text x='" << p.x(s) << "' y='" << p.top + p.height + 16
        << "' text-anchor='middle' fill='#444'>" << int64_t(std::llround(s)) << "</text>\n";
  // A grid line at every tick; a label only where it clears the one below by a text height, so
  // a log axis over many decades labels its powers of ten rather than overprinting 1-2-5.
  double closest = INFINITY;
  for (size_t i = 1; i < y_ticks.size(); ++i)
    closest = std::min(closest, std::abs(p.y(y_ticks[i]) - p.y(y_ticks[i - 1])));
  std::vector<double> labelled;
  for (double v : y_ticks) {
    const double m = v / std::pow(10.0, std::floor(std::log10(v) + 1e-9));
    if (!p.log_scale || closest >= 18 || std::abs(m - 1) < 1e-6) labelled.push_back(v);
  }
  if (labelled.size() < 2) labelled = y_ticks;
  double last_label_y = INFINITY;
  for (double v : y_ticks) {
    svg << "<line x1='" << p.left << "' y1='" << p.y(v) << "' x2='" << p.left + p.width << "' y2='"
        << p.y(v) << "' stroke='#e6e6e6'/>\n";
    if (std::find(labelled.begin(), labelled.end(), v) == labelled.end() ||
        last_label_y - p.y(v) < 14)
      continue;
    last_label_y = p.y(v);
    svg << "<text x='" << p.left - 6 << "' y='" << p.y(v) + 4 << "' text-anchor='end' fill='#444'>"
        << num(v) << "</text>\n";
  }
  svg << "<rect x='" << p.left << "' y='" << p.top << "' width='" << p.width << "' height='"
      << p.height << "' fill='none' stroke='#999'/>\n"
      << "<text x='" << p.left << "' y='" << p.top - 8 << "' font-size='13' font-weight='bold'>"
      << title << "</text>\n"
      << "<text x='" << p.left + p.width / 2 << "' y='" << p.top + p.height + 34
      << "' text-anchor='middle' fill='#444'>optimizer step</text>\n";
}

// Series with more points than this are drawn as lines only: dots that touch hide the line.
constexpr size_t kMaxDots = 60;

// A series as a line with a dot at every logged point, when there are few enough (validation
// dashed).
void draw_series(std::ostream& svg, const Panel& p, const std::vector<CurvePoint>& points,
                 const char* color, bool dashed) {
  std::ostringstream line, dots;
  line << std::fixed << std::setprecision(1);
  dots << std::fixed << std::setprecision(1);
  const size_t shown = size_t(std::count_if(points.begin(), points.end(),
                                            [&](const CurvePoint& pt) { return p.shows(pt.value); }));
  for (const auto& pt : points) {
    if (!p.shows(pt.value)) continue;
    line << p.x(double(pt.step)) << ',' << p.y(pt.value) << ' ';
    if (shown > kMaxDots) continue;
    dots << "<circle cx='" << p.x(double(pt.step)) << "' cy='" << p.y(pt.value) << "' r='"
         << (dashed ? 3.5 : 2.5) << "' fill='" << color << "'/>\n";
  }
  svg << "<polyline fill='none' stroke='" << color << "' stroke-width='2'"
      << (dashed ? " stroke-dasharray='6 4'" : "") << " points='" << line.str() << "'/>\n"
      << dots.str();
}

// A diamond of half-width r centred on (x, y).
void draw_diamond(std::ostream& svg, double x, double y, double r, const char* color,
                  const std::string& title) {
  svg << "<polygon points='" << x << ',' << y - r << ' ' << x + r << ',' << y << ' ' << x << ','
      << y + r << ' ' << x - r << ',' << y << "' fill='" << color << "' stroke='white'>"
      << (title.empty() ? "" : "<title>" + title + "</title>") << "</polygon>\n";
}

// The test set's value, measured once at the end of the run: a diamond at its step, with its
// value as the tooltip.
void draw_points(std::ostream& svg, const Panel& p, const std::vector<CurvePoint>& points,
                 const std::string& what) {
  svg << std::fixed << std::setprecision(1);
  for (const auto& pt : points)
    if (p.shows(pt.value))
      draw_diamond(svg, p.x(double(pt.step)), p.y(pt.value), 6, kTestColor,
                   "test " + what + " " + num(pt.value, 4) + " at step " + std::to_string(pt.step));
}

// The legend in the margin above the panel, right-aligned beside its title: outside the plot,
// so no curve ever runs through it. The test point's entry, where the run has one, sits below the
// plot at its right, beside the axis label, as the row above has no room for a third entry.
void draw_legend(std::ostream& svg, const Panel& p, bool test) {
  const std::pair<const char*, const char*> rows[] = {{"validation", kValColor}, {"training", kTrainColor}};
  const double widths[] = {92, 80};  // line, gap and label
  double x = p.left + p.width;
  const double y = p.top - 8;
  for (int i = 0; i < 2; ++i) {
    x -= widths[i];
    svg << "<line x1='" << x << "' y1='" << y - 4 << "' x2='" << x + 20 << "' y2='" << y - 4
        << "' stroke='" << rows[i].second << "' stroke-width='2'"
        << (i == 0 ? " stroke-dasharray='6 4'" : "") << "/>\n"
        << "<text x='" << x + 25 << "' y='" << y << "' fill='#444'>" << rows[i].first << "</text>\n";
  }
  if (!test) return;
  const double tx = p.left + p.width - 40, ty = p.top + p.height + 34;
  draw_diamond(svg, tx + 10, ty - 4, 5, kTestColor, "");
  svg << "<text x='" << tx + 20 << "' y='" << ty << "' fill='#444'>test</text>\n";
}

}  // namespace

void write_curve_svg(const std::string& path, const Curves& c, const std::string& title,
                     const std::string& run_id) {
  const double W = 760, H = 340, top = 62, bottom = 46, left = 58, gap = 76, right = 20;
  const double pw = (W - left - gap - right) / 2, ph = H - top - bottom;

  int64_t max_step = 1;
  for (const auto* s : {&c.train_loss, &c.val_loss, &c.train_accuracy, &c.val_accuracy,
                        &c.test_loss, &c.test_accuracy})
    for (const auto& p : *s) max_step = std::max(max_step, p.step);

  // Losses: a log axis from the 1-2-5 value at or below the smallest to the one at or above the
  // largest, so the long tail of a training run is as readable as its first steps.
  double lmin = INFINITY, lmax = 0;
  for (const auto* s : {&c.train_loss, &c.val_loss, &c.test_loss})
    for (const auto& p : *s)
      if (std::isfinite(p.value) && p.value > 0) {
        lmin = std::min(lmin, p.value);
        lmax = std::max(lmax, p.value);
      }
  if (!(lmax > 0)) lmin = 0.1, lmax = 10;  // nothing to show: a neutral axis
  std::vector<double> loss_ticks = log_ticks(lmin, lmax);
  if (loss_ticks.size() < 2) loss_ticks = {loss_ticks[0], loss_ticks[0] * 2};
  const Panel loss{left, top, pw, ph, double(max_step), loss_ticks.front(), loss_ticks.back(),
                   /*log_scale=*/true};

  // Accuracies: from the tenth at or below the smallest, up to 1.
  double amin = 1;
  for (const auto* s : {&c.train_accuracy, &c.val_accuracy, &c.test_accuracy})
    for (const auto& p : *s)
      if (std::isfinite(p.value)) amin = std::min(amin, p.value);
  const double alo = std::clamp(std::floor(amin * 10 - 1e-9) / 10, 0.0, 0.9);
  const double astep = nice_step((1 - alo) / 5);
  std::vector<double> acc_ticks;
  for (double v = alo; v <= 1 + 1e-9; v += astep)
    acc_ticks.push_back(std::round(v / astep) * astep);
  const Panel acc{left + pw + gap, top, pw, ph, double(max_step), alo, 1.0, /*log_scale=*/false};

  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
      << "' viewBox='0 0 " << W << ' ' << H << "' font-family='sans-serif' font-size='12'"
      << (run_id.empty() ? "" : " data-run-id='" + xml_escape(run_id) + "'") << ">\n"
      << "<rect width='100%' height='100%' fill='white'/>\n"
      << "<text x='" << W / 2 << "' y='24' text-anchor='middle' font-size='15'>"
      << xml_escape(title) << "</text>\n";
  draw_axes(svg, loss, loss_ticks, "loss (log scale)");
  draw_series(svg, loss, c.train_loss, kTrainColor, false);
  draw_series(svg, loss, c.val_loss, kValColor, true);
  draw_points(svg, loss, c.test_loss, "loss");
  draw_legend(svg, loss, !c.test_loss.empty());
  draw_axes(svg, acc, acc_ticks, "accuracy");
  draw_series(svg, acc, c.train_accuracy, kTrainColor, false);
  draw_series(svg, acc, c.val_accuracy, kValColor, true);
  draw_points(svg, acc, c.test_accuracy, "accuracy");
  draw_legend(svg, acc, !c.test_accuracy.empty());
  svg << "</svg>\n";

  std::ofstream out(path, std::ios::trunc);
  MT_CHECK(out.good(), "curve: cannot write '", path, "': ", std::strerror(errno));
  out << svg.str();
  out.close();
  MT_CHECK(out.good(), "curve: cannot write '", path, "': ", std::strerror(errno));
}

}  // namespace mt::train
