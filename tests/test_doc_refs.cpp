// Every reference the docs make to the code resolves (tests/doc_refs.h says what counts), and the
// checker itself fails on each kind of stale reference, shown on a small tree of its own.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "bench/crossover.h"

#include "tests/doc_refs.h"
#include "tests/run_train.h"
#include "tests/temp_dir.h"

using mt::test::check_doc_references;
using mt::test::DocProblem;

namespace {

std::string describe(const std::vector<DocProblem>& problems) {
  std::string s;
  for (const auto& p : problems) s += p.doc + ":" + std::to_string(p.line) + ": `" + p.ref + "`: " + p.why + "\n";
  return s;
}

void write(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

}  // namespace

TEST(DocReferences, EveryDocReferenceResolves) {
  const std::filesystem::path root = MT_SOURCE_DIR;
  std::vector<std::string> docs{"README.md"};
  for (const auto& e : std::filesystem::directory_iterator(root / "docs"))
    if (e.path().extension() == ".md") docs.push_back("docs/" + e.path().filename().string());
  ASSERT_GE(docs.size(), 5u);
  const auto tests = mt::test::test_names(root);
  ASSERT_GT(tests.size(), 100u);  // the scan found the test files
  for (const auto& doc : docs) {
    const auto problems = check_doc_references(root, doc, tests);
    EXPECT_TRUE(problems.empty()) << describe(problems);
  }
}

// Each way a reference goes stale is caught, and the same references are accepted when true.
TEST(DocReferences, StaleReferencesFail) {
  mt::test::TempDir t;
  write(t.path / "ops/op.cu", "__global__ void backward_kernel() {}\nvoid Trainer::step() {}\n");
  write(t.path / "tests/test_op.cpp", "TEST(OpTrap2, StoreLosesGradients) {}\n");
  write(t.path / "docs/other.md", "x\n");
  write(t.path / "docs/good.md",
        "See `ops/op.cu: backward_kernel, Trainer::step` and `ops/`, shown by\n"
        "`OpTrap2.StoreLosesGradients` and `OpTrap2.*`, and [the other page](other.md).\n"
        "```\n`ops/missing.cu` inside a code block is an example\n```\n"
        "Prose: `backward_kernel`, `build/mt_tests`, `Tensor.grad`.\n");
  EXPECT_TRUE(check_doc_references(t.path, "docs/good.md").empty())
      << describe(check_doc_references(t.path, "docs/good.md"));

  write(t.path / "docs/bad.md",
        "`ops/op.cu:2` and `:5-7`\n"           // line numbers
        "`ops/gone.cu`\n"                       // a file that moved
        "`ops/op.cu: forward_kernel`\n"         // a renamed symbol
        "`ops/op.cu: backward`\n"               // only part of a word
        "`OpTrap2.StoreKeepsGradients`\n"       // a renamed test
        "`OpTrap4.*`\n"                         // a suite that is gone
        "[gone](missing.md)\n");                // a dead link
  const auto problems = check_doc_references(t.path, "docs/bad.md");
  ASSERT_EQ(problems.size(), 8u) << describe(problems);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(problems[i].line, i < 2 ? 1 : i) << describe(problems);
  EXPECT_NE(problems[0].why.find("line number"), std::string::npos);
  EXPECT_NE(problems[2].why.find("no such file"), std::string::npos);
  EXPECT_NE(problems[3].why.find("'forward_kernel' does not occur in ops/op.cu"), std::string::npos);
  EXPECT_NE(problems[5].why.find("no such test"), std::string::npos);
  EXPECT_NE(problems[7].why.find("a link to nothing"), std::string::npos);
}

// The crossover figures quoted in the docs and in scaled_silu.h are the ones bench/crossover.h
// computes from its H200 defaults: one source, every quotation checked against it.
TEST(DocNumbers, CrossoverFiguresAreTheCrossoverProgramsOwn) {
  using namespace mt::crossover;
  const Gpu g;
  auto f1 = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", v);
    return std::string(buf);
  };
  const std::filesystem::path root = MT_SOURCE_DIR;
  const std::string readme = mt::test::read_text(root / "docs/README.md");
  const std::string rows[] = {
      "| balance point | " + f1(balance_flops_per_byte(g.fp32_tflops, g.bandwidth_gbs)) +
          " flops/byte | " + f1(balance_flops_per_byte(g.bf16_tflops, g.bandwidth_gbs)) + " flops/byte |",
      "| crossover, 4-byte round trip (a bf16 value) | " +
          f1(crossover_flops_per_element(g.fp32_tflops, g.bandwidth_gbs, 2)) + " flops/element | " +
          f1(crossover_flops_per_element(g.bf16_tflops, g.bandwidth_gbs, 2)) + " flops/element |",
      "| crossover, 8-byte round trip (an fp32 value) | " +
          f1(crossover_flops_per_element(g.fp32_tflops, g.bandwidth_gbs, 4)) + " flops/element | " +
          f1(crossover_flops_per_element(g.bf16_tflops, g.bandwidth_gbs, 4)) + " flops/element |"};
  for (const auto& row : rows) EXPECT_NE(readme.find(row), std::string::npos) << "docs/README.md lacks: " << row;
  const std::string bw = std::to_string(int(g.bandwidth_gbs)) + " GB/s copy bandwidth";
  EXPECT_NE(readme.find(bw), std::string::npos) << bw;

  // The rounded fp32 4-byte crossover, wherever the prose quotes it.
  const int fp32_4 = int(std::lround(crossover_flops_per_element(g.fp32_tflops, g.bandwidth_gbs, 2)));
  const std::pair<std::string, std::regex> quotes[] = {
      {"docs/README.md", std::regex(R"(sits below\s+(\d+))")},
      {"ops/scaled_silu/scaled_silu.h", std::regex(R"(about (\d+) flops per element)")}};
  for (const auto& [file, re] : quotes) {
    const std::string text = mt::test::read_text(root / file);
    int found = 0;
    for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it, ++found)
      EXPECT_EQ(std::stoi((*it)[1].str()), fp32_4) << file << ": " << (*it)[0].str();
    EXPECT_GT(found, 0) << file << " no longer quotes the crossover";
  }

  // docs/lab.md prices attention's P with the tensor cores' crossover for a bf16 value, and the
  // exp with the fp32 one.
  const std::string lab = mt::test::read_text(root / "docs/lab.md");
  const std::string bf16_4 = f1(crossover_flops_per_element(g.bf16_tflops, g.bandwidth_gbs, 2));
  const std::string lab_flat = std::regex_replace(lab, std::regex("\\s+"), " ");
  EXPECT_NE(lab_flat.find("breaks even at " + bf16_4 + " flops per element"), std::string::npos)
      << "docs/lab.md: the attention crossover is not " << bf16_4;
  EXPECT_NE(lab_flat.find("a few flops against its crossover of " + std::to_string(fp32_4)), std::string::npos)
      << "docs/lab.md: the fp32 crossover is not " << fp32_4;
}

// docs/lab.md prices dropout's mask and LayerNorm's x̂ with the fp32 crossover, and
// docs/README.md's crossover section quotes the same figures: each from bench/crossover.h, and
// the verdicts the prose draws from them.
TEST(DocNumbers, DropoutMaskAndLayerNormPricesAreTheCrossoverProgramsOwn) {
  using namespace mt::crossover;
  const Gpu g;
  auto f1 = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", v);
    return std::string(buf);
  };
  auto fp32_crossover = [&](double bytes) {
    return crossover_flops_per_element(g.fp32_tflops, g.bandwidth_gbs, bytes);
  };
  const std::filesystem::path root = MT_SOURCE_DIR;
  auto flat = [&](const char* file) {
    return std::regex_replace(mt::test::read_text(root / file), std::regex("\\s+"), " ");
  };
  const std::string lab = flat("docs/lab.md"), readme = flat("docs/README.md");

  // The table's rows: the value, its round trip, the crossover, and the memory held at GPT-2
  // small's [16, 1024, 768].
  const double n = 16.0 * 1024 * 768, MiB = 1024.0 * 1024;
  auto g_unit = [](double v, const char* unit) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g %s", v, unit);
    return std::string(buf);
  };
  auto mib = [&](double v) { return g_unit(v, "MiB"); };
  struct Row {
    std::string value;
    double bytes_per_element;
    std::string recompute, held;
  };
  const Row rows[] = {
      {"dropout's keep mask, a byte an element", 1, "about 12 integer operations (Philox)",
       mib(n * 1 / MiB) + " a call"},
      {"the same mask packed, a bit an element", 0.125, "the same", mib(n / 8 / MiB) + " a call"},
      {"LayerNorm's x̂ in bf16", 2, "a subtract and a multiply: 2 flops",
       mib(n * 2 / MiB) + " a LayerNorm"},
      {"x̂ in fp32", 4, "the same", mib(n * 4 / MiB) + " a LayerNorm"}};
  for (const Row& r : rows) {
    const std::string row = "| " + r.value + " | " + g_unit(round_trip_bytes(r.bytes_per_element), "bytes") + " | " +
                            f1(fp32_crossover(r.bytes_per_element)) + " flops/element | " +
                            r.recompute + " | " + r.held + " |";
    EXPECT_NE(lab.find(row), std::string::npos) << "docs/lab.md lacks: " << row;
  }

  // x̂: 2 flops against the bf16 value's crossover, recomputed; memory over 25 LayerNorms.
  const std::string fp32_4 = std::to_string(std::lround(fp32_crossover(2)));
  EXPECT_EQ(cheaper(2, fp32_crossover(2)), Choice::recompute);
  EXPECT_NE(lab.find("2 flops against " + fp32_4 + ", thirty times below"), std::string::npos);
  EXPECT_EQ(std::lround(fp32_crossover(2) / 2 / 10) * 10, 30);  // "thirty times below"
  EXPECT_NE(lab.find("and " + mib(25 * n * 2 / MiB) + " over GPT-2 small's 25 LayerNorms"), std::string::npos);
  EXPECT_NE(lab.find("(" + std::to_string(int(16 * 1024 * 8 / 1024)) + " KiB a LayerNorm"), std::string::npos);

  // The mask: about 25 flops (12 integer operations at an FMA's 2 flops) is below the byte
  // mask's crossover and above the packed mask's, and the map's 4 bytes per bf16 element cover
  // the time of the 4-byte crossover's flops.
  const double philox_flops = 12.5 * 2;
  EXPECT_EQ(cheaper(philox_flops, fp32_crossover(1.0)), Choice::recompute);
  EXPECT_EQ(cheaper(philox_flops, fp32_crossover(0.125)), Choice::save);
  const std::string byte_mask = f1(fp32_crossover(1)), bit_mask = f1(fp32_crossover(0.125));
  EXPECT_NE(lab.find("below the byte mask's " + byte_mask + ", so recomputing beats saving a byte an element, and above the packed mask's " + bit_mask),
            std::string::npos);
  EXPECT_NE(lab.find("(dy in, dx out), the time of " + fp32_4 + " fp32 flops"), std::string::npos);
  EXPECT_NE(lab.find(mib(25 * n / MiB) + " over the 25 dropouts"), std::string::npos);
  EXPECT_NE(readme.find("against a crossover of " + fp32_4 + " for a bf16 value"), std::string::npos);
  EXPECT_NE(readme.find("below a byte mask's crossover of " + byte_mask + " and above a packed mask's " + bit_mask),
            std::string::npos);
}

// The guide and `train --help` say the same about CPU ranks under --nproc: processes joined
// through Gloo (the guide once said threads, which only a build without Gloo uses).
TEST(DocClaims, TheGuideSaysCpuRanksAreProcessesAsTheHelpDoes) {
  const std::string guide =
      mt::test::read_text(std::filesystem::path(MT_SOURCE_DIR) / "docs/guide.md");
  const size_t begin = guide.find("## Several GPUs");
  ASSERT_NE(begin, std::string::npos);
  const std::string section = std::regex_replace(
      guide.substr(begin, guide.find("\n## ", begin + 1) - begin), std::regex("\\s+"), " ");
  EXPECT_NE(section.find("two CPU ranks, each a process of its own, joined through Gloo"),
            std::string::npos) << section;
  std::string help;
  mt::test::run_train("--help", &help);
  EXPECT_NE(help.find("the CPU N processes (Gloo)"), std::string::npos) << help;
}
