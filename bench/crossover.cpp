// crossover: save or recompute a per-element value in a backward kernel, for any GPU.
//
//   crossover [--bandwidth GB/s] [--fp32-tflops X] [--bf16-tflops Y]
//             [--width D] [--recompute-flops F] [--bytes-per-element B] [--json]
//
// Prints the GPU's balance point (flops per byte), the crossover F* = 2·B · flops/bandwidth, and
// for a row of D elements the time to save and reload the value against the time to recompute
// it, at the fp32 rate (elementwise recompute) and at the bf16 tensor-core rate. The defaults are
// the H200 figures this project uses; the formulas are in bench/crossover.h. Plain C++: no GPU
// is needed, it only does the arithmetic. --json prints the same numbers as one JSON object
// (tests/crossover_page.test.js compares them with docs/crossover.js).
#include "bench/crossover.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

namespace {

using namespace mt::crossover;

struct Args {
  Gpu gpu;
  double width = 4096;
  double recompute_flops = 20;  // about what a sigmoid costs: an exp, an add, a divide
  double bytes_per_element = 2;  // a bf16 value
  bool json = false;
};

const char* kUsage =
    "usage: crossover [--bandwidth GB/s] [--fp32-tflops X] [--bf16-tflops Y]\n"
    "                 [--width D] [--recompute-flops F] [--bytes-per-element B] [--json]\n"
    "  --bandwidth          copy bandwidth, reads + writes counted (default 4264, the H200's)\n"
    "  --fp32-tflops        fp32 FMA rate, an FMA = 2 flops (default 65.0)\n"
    "  --bf16-tflops        bf16 dense tensor-core rate (default 788.6)\n"
    "  --width              elements per row (default 4096)\n"
    "  --recompute-flops    flops to recompute one element's value (default 20)\n"
    "  --bytes-per-element  bytes of the saved value (default 2: bf16)\n"
    "  --json               print the numbers as one JSON object\n";

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "crossover: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

double parse_number(const std::string& flag, const std::string& text, bool zero_ok) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v))
    usage_error(flag + " needs a number, got '" + text + "'");
  if (v < 0 || (v == 0 && !zero_ok))
    usage_error(flag + " must be " + (zero_ok ? ">= 0" : "> 0") + ", got " + text);
  return v;
}

Args parse(int argc, char** argv) {
  Args a;
  const std::map<std::string, std::pair<double*, bool>> numbers{
      {"--bandwidth", {&a.gpu.bandwidth_gbs, false}},
      {"--fp32-tflops", {&a.gpu.fp32_tflops, false}},
      {"--bf16-tflops", {&a.gpu.bf16_tflops, false}},
      {"--width", {&a.width, false}},
      {"--recompute-flops", {&a.recompute_flops, true}},
      {"--bytes-per-element", {&a.bytes_per_element, false}},
  };
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (flag == "--json") {
      a.json = true;
      continue;
    }
    const size_t eq = flag.find('=');
    if (eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    auto it = numbers.find(flag);
    if (it == numbers.end()) usage_error("unknown option '" + flag + "'");
    if (eq == std::string::npos) {
      if (i + 1 >= argc) usage_error(flag + " needs a value");
      value = argv[++i];
    }
    *it->second.first = parse_number(flag, value, it->second.second);
  }
  return a;
}

// The numbers for one flop rate.
struct Side {
  double balance, crossover, save_s, recompute_s;
  Choice choice;
};

Side side(const Args& a, double tflops) {
  Side s;
  s.balance = balance_flops_per_byte(tflops, a.gpu.bandwidth_gbs);
  s.crossover = crossover_flops_per_element(tflops, a.gpu.bandwidth_gbs, a.bytes_per_element);
  s.save_s = save_seconds(a.width, a.bytes_per_element, a.gpu.bandwidth_gbs);
  s.recompute_s = recompute_seconds(a.width, a.recompute_flops, tflops);
  s.choice = cheaper(a.recompute_flops, s.crossover);
  return s;
}

// 3 significant digits with a unit: "3.84 ns", "12.3 us".
std::string duration(double s) {
  const char* unit = "s";
  double v = s;
  if (s < 1e-6) v = s * 1e9, unit = "ns";
  else if (s < 1e-3) v = s * 1e6, unit = "us";
  else if (s < 1) v = s * 1e3, unit = "ms";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g %s", v, unit);
  return buf;
}

void print_json(const Args& a, const Side& f, const Side& b) {
  auto one = [](const char* name, const Side& s, const char* tail) {
    std::printf("  \"%s\": {\"balance_flops_per_byte\": %.17g, \"crossover_flops_per_element\": "
                "%.17g, \"save_seconds_per_row\": %.17g, \"recompute_seconds_per_row\": %.17g, "
                "\"cheaper\": \"%s\"}%s\n",
                name, s.balance, s.crossover, s.save_s, s.recompute_s, choice_name(s.choice), tail);
  };
  std::printf("{\n  \"bandwidth_gbs\": %.17g, \"fp32_tflops\": %.17g, \"bf16_tflops\": %.17g,\n",
              a.gpu.bandwidth_gbs, a.gpu.fp32_tflops, a.gpu.bf16_tflops);
  std::printf("  \"width\": %.17g, \"recompute_flops\": %.17g, \"bytes_per_element\": %.17g, "
              "\"round_trip_bytes\": %.17g,\n",
              a.width, a.recompute_flops, a.bytes_per_element,
              round_trip_bytes(a.bytes_per_element));
  one("fp32", f, ",");
  one("bf16", b, "");
  std::printf("}\n");
}

void print_text(const Args& a, const Side& f, const Side& b) {
  std::printf("save or recompute one per-element value in a backward kernel\n\n");
  std::printf("GPU        %g GB/s copy bandwidth (reads + writes), %g TFLOP/s fp32, "
              "%g TFLOP/s bf16 dense\n",
              a.gpu.bandwidth_gbs, a.gpu.fp32_tflops, a.gpu.bf16_tflops);
  std::printf("value      %g bytes per element: saving moves %g bytes (written, then read back)\n",
              a.bytes_per_element, round_trip_bytes(a.bytes_per_element));
  std::printf("recompute  %g flops per element; a row is %g elements\n\n", a.recompute_flops,
              a.width);
  std::printf("%-26s%-22s%s\n", "", "fp32 units", "bf16 tensor cores");
  auto row = [](const char* label, const std::string& l, const std::string& r) {
    std::printf("%-26s%-22s%s\n", label, l.c_str(), r.c_str());
  };
  auto fixed = [](double v, const char* unit) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.1f %s", v, unit);
    return std::string(buf);
  };
  row("balance point", fixed(f.balance, "flops/byte"), fixed(b.balance, "flops/byte"));
  row("crossover", fixed(f.crossover, "flops/element"), fixed(b.crossover, "flops/element"));
  row("save + reload, per row", duration(f.save_s), duration(b.save_s));
  row("recompute, per row", duration(f.recompute_s), duration(b.recompute_s));
  row("cheaper", choice_name(f.choice), choice_name(b.choice));
  const double f4 = crossover_flops_per_element(a.gpu.fp32_tflops, a.gpu.bandwidth_gbs, 2);
  const double b4 = crossover_flops_per_element(a.gpu.bf16_tflops, a.gpu.bandwidth_gbs, 2);
  std::printf("\nFor a 4-byte round trip (a 2-byte value) this GPU's crossover is %.1f flops per\n"
              "element at the fp32 rate and %.1f at the bf16 rate. An elementwise recompute (a\n"
              "sigmoid, x*rstd) runs on the fp32 units: read the fp32 column for it.\n",
              f4, b4);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const Side f = side(a, a.gpu.fp32_tflops), b = side(a, a.gpu.bf16_tflops);
  if (a.json)
    print_json(a, f, b);
  else
    print_text(a, f, b);
  return 0;
}
