// docs/crossover.js (the arithmetic behind docs/crossover.html) against the crossover program
// built from bench/crossover.cpp: the same inputs must give the same numbers and the same verdict.
//
//   node tests/crossover_page.test.js path/to/crossover
//
// Exits non-zero on any mismatch. Also checks that the page loads crossover.js by a relative
// path and asks for nothing from the network, so it opens from the file system.
"use strict";

const { execFileSync } = require("child_process");
const fs = require("fs");
const path = require("path");

const calc = require(path.join(__dirname, "..", "docs", "crossover.js"));
const exe = process.argv[2];
if (!exe) {
  console.error("usage: node tests/crossover_page.test.js path/to/crossover");
  process.exit(2);
}

let failures = 0;
function check(ok, what) {
  if (!ok) {
    failures += 1;
    console.error("FAIL " + what);
  }
}
function close(a, b, what) {
  check(Math.abs(a - b) <= 1e-12 * Math.max(Math.abs(a), Math.abs(b)), `${what}: js ${a}, program ${b}`);
}

const cases = [
  { bandwidth: 4270, fp32: 67, bf16: 790, width: 4096, flops: 20, bytes: 2 }, // the H200, a sigmoid
  { bandwidth: 4270, fp32: 67, bf16: 790, width: 4096, flops: 100, bytes: 2 }, // fp32 says save
  { bandwidth: 4270, fp32: 67, bf16: 790, width: 1, flops: 1000, bytes: 4 }, // both say save
  { bandwidth: 3350, fp32: 67, bf16: 989, width: 8192, flops: 585, bytes: 2 }, // H100 datasheet
  { bandwidth: 1555, fp32: 19.5, bf16: 312, width: 12288, flops: 0, bytes: 1 }, // A100, free recompute
];

for (const c of cases) {
  const args = [
    "--json",
    "--bandwidth", String(c.bandwidth),
    "--fp32-tflops", String(c.fp32),
    "--bf16-tflops", String(c.bf16),
    "--width", String(c.width),
    "--recompute-flops", String(c.flops),
    "--bytes-per-element", String(c.bytes),
  ];
  const out = JSON.parse(execFileSync(exe, args, { encoding: "utf8" }));
  const name = JSON.stringify(c);
  close(calc.roundTripBytes(c.bytes), out.round_trip_bytes, name + " round trip");
  for (const [key, tflops] of [["fp32", c.fp32], ["bf16", c.bf16]]) {
    const p = out[key];
    const crossover = calc.crossoverFlopsPerElement(tflops, c.bandwidth, c.bytes);
    close(calc.balanceFlopsPerByte(tflops, c.bandwidth), p.balance_flops_per_byte, `${name} ${key} balance`);
    close(crossover, p.crossover_flops_per_element, `${name} ${key} crossover`);
    close(calc.saveSeconds(c.width, c.bytes, c.bandwidth), p.save_seconds_per_row, `${name} ${key} save`);
    const recompute = calc.recomputeSeconds(c.width, c.flops, tflops);
    if (c.flops === 0) check(recompute === 0 && p.recompute_seconds_per_row === 0, `${name} ${key} free recompute`);
    else close(recompute, p.recompute_seconds_per_row, `${name} ${key} recompute`);
    check(calc.cheaper(c.flops, crossover) === p.cheaper, `${name} ${key} verdict: js ${calc.cheaper(c.flops, crossover)}, program ${p.cheaper}`);
  }
}

// The page's defaults are the program's defaults.
const defaults = JSON.parse(execFileSync(exe, ["--json"], { encoding: "utf8" }));
check(defaults.bandwidth_gbs === calc.H200.bandwidthGBs, "default bandwidth");
check(defaults.fp32_tflops === calc.H200.fp32Tflops, "default fp32 rate");
check(defaults.bf16_tflops === calc.H200.bf16Tflops, "default bf16 rate");

// The duration format matches the program's text output ("%.3g" and a unit), at the defaults.
const text = execFileSync(exe, ["--recompute-flops", "100"], { encoding: "utf8" });
const H = calc.H200;
for (const s of [calc.saveSeconds(4096, 2, H.bandwidthGBs), calc.recomputeSeconds(4096, 100, H.fp32Tflops), calc.recomputeSeconds(4096, 100, H.bf16Tflops)])
  check(text.includes(calc.formatSeconds(s)), `formatted ${calc.formatSeconds(s)} in the program's output`);

// A box holding 0, a negative or no number is an error to show, never a silent default.
for (const bad of ["0", "-5", "", "abc", "Infinity"]) {
  const r = calc.parseFigure(bad, "Copy bandwidth");
  check(r.error !== undefined && r.value === undefined, `parseFigure('${bad}') is an error, got ${JSON.stringify(r)}`);
  check(r.error && r.error.startsWith("Copy bandwidth: "), `parseFigure('${bad}') names the box: ${r.error}`);
}
check(calc.parseFigure(" 3350 ", "x").value === 3350, "parseFigure reads a positive number");

// URL parameters: a GPU's figures round-trip; bad ones are named, not dropped.
const params = { bw: 3350, fp32: 67, bf16: 989, bytes: 2, rate: "bf16", flops: 585, size: 28 };
const back = calc.parseParams(calc.toParams(params));
check(back.errors.length === 0 && Object.keys(params).every((k) => back.values[k] === params[k]),
      `toParams/parseParams round trip: ${JSON.stringify(back)}`);
const bad = calc.parseParams("?bw=0&fp32=-1&bytes=3&rate=fp64&size=99&flops=0");
check(bad.errors.length === 5, `five bad parameters named: ${JSON.stringify(bad.errors)}`);
check(bad.values.flops === 0 && bad.values.bw === undefined, "flops=0 is valid (a free recompute); bw=0 is not");
check(bad.errors.some((e) => e.includes("bw=") && e.includes("greater than 0")), "bw=0 names bw=");

// The page: crossover.js by a relative path, nothing from the network.
const page = fs.readFileSync(path.join(__dirname, "..", "docs", "crossover.html"), "utf8");
check(/<script src="crossover\.js"><\/script>/.test(page), "the page loads crossover.js by a relative path");
check(!/Number\(input\.value\) > 0 \? Number\(input\.value\) : fallback/.test(page) && /C\.parseFigure\(inputs\[key\]\.value/.test(page),
      "the page checks each box with parseFigure instead of falling back to the H200 figures");
check(/@media \(max-width: \d+px\)/.test(page), "the page has a narrow-screen layout");
check(!/(src|href)="(https?:)?\/\//.test(page) && !/url\(\s*["']?(https?:)?\/\//.test(page), "the page loads nothing from the network");

if (failures > 0) {
  console.error(`${failures} check(s) failed`);
  process.exit(1);
}
console.log(`crossover_page: ${cases.length} input sets, js and program agree`);
