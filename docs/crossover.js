// Save or recompute: the arithmetic of bench/crossover.h, for docs/crossover.html and for Node
// (tests/crossover_page.test.js checks it against the crossover program).
//
// Per element, saving a value of B bytes costs a write and a read back, 2·B bytes at the copy
// bandwidth (which counts reads and writes); recomputing it costs F flops at the flop rate.
// They take the same time at the crossover F* = 2·B · rate / bandwidth.
// Units: bandwidth in GB/s, rates in TFLOP/s, times in seconds.
(function (root, factory) {
  if (typeof module === "object" && module.exports) module.exports = factory();
  else root.Crossover = factory();
})(typeof self !== "undefined" ? self : this, function () {
  "use strict";

  // The H200 figures measured by bench/bench_crossover.cu (the defaults of bench/crossover.h).
  const H200 = { bandwidthGBs: 4264, fp32Tflops: 65.0, bf16Tflops: 788.6 };

  // Flops the GPU does in the time it moves one byte.
  function balanceFlopsPerByte(tflops, bandwidthGBs) {
    return (tflops * 1e12) / (bandwidthGBs * 1e9);
  }

  // Bytes moved to save a value and read it back.
  function roundTripBytes(bytesPerElement) {
    return 2 * bytesPerElement;
  }

  // The recompute cost (flops per element) at which both choices take the same time.
  function crossoverFlopsPerElement(tflops, bandwidthGBs, bytesPerElement) {
    return roundTripBytes(bytesPerElement) * balanceFlopsPerByte(tflops, bandwidthGBs);
  }

  function saveSeconds(elements, bytesPerElement, bandwidthGBs) {
    return (elements * roundTripBytes(bytesPerElement)) / (bandwidthGBs * 1e9);
  }

  function recomputeSeconds(elements, flopsPerElement, tflops) {
    return (elements * flopsPerElement) / (tflops * 1e12);
  }

  // "recompute", "save" or "either".
  function cheaper(flopsPerElement, crossover) {
    if (flopsPerElement < crossover) return "recompute";
    if (flopsPerElement > crossover) return "save";
    return "either";
  }

  // 3 significant digits with a unit, like the program's: "3.84 ns", "12.3 us".
  function formatSeconds(s) {
    const [scale, unit] = s < 1e-6 ? [1e9, "ns"] : s < 1e-3 ? [1e6, "us"] : s < 1 ? [1e3, "ms"] : [1, "s"];
    return Number((s * scale).toPrecision(3)).toString() + " " + unit;
  }

  // A figure typed in a box or given in the URL: a finite number > 0, or an error to show (never a
  // silent fallback to the defaults, which would present the H200's result as the reader's).
  function parseFigure(text, what) {
    const t = String(text == null ? "" : text).trim();
    if (t === "") return { error: what + ": enter a number" };
    const v = Number(t);
    if (!Number.isFinite(v)) return { error: what + ": '" + t + "' is not a number" };
    if (v <= 0) return { error: what + ": must be greater than 0, got " + t };
    return { value: v };
  }

  // The page's settings from a URL query, e.g. "?bw=3350&fp32=67&bf16=989&bytes=2&rate=bf16":
  // bw (GB/s), fp32 and bf16 (TFLOP/s), bytes (1, 2 or 4), rate (fp32 or bf16), flops (per element)
  // and size (log2 of the element count). Returns the values given and the errors of bad ones.
  function parseParams(search) {
    const q = new URLSearchParams(search);
    const out = { values: {}, errors: [] };
    const figures = { bw: "copy bandwidth", fp32: "fp32 rate", bf16: "bf16 rate", flops: "recompute flops" };
    for (const [key, what] of Object.entries(figures)) {
      if (!q.has(key)) continue;
      const r = key === "flops" && Number(q.get(key)) === 0 ? { value: 0 } : parseFigure(q.get(key), what + " (" + key + "=)");
      if (r.error) out.errors.push(r.error);
      else out.values[key] = r.value;
    }
    if (q.has("bytes")) {
      if (["1", "2", "4"].includes(q.get("bytes"))) out.values.bytes = Number(q.get("bytes"));
      else out.errors.push("bytes=: expected 1, 2 or 4, got '" + q.get("bytes") + "'");
    }
    if (q.has("rate")) {
      if (["fp32", "bf16"].includes(q.get("rate"))) out.values.rate = q.get("rate");
      else out.errors.push("rate=: expected fp32 or bf16, got '" + q.get("rate") + "'");
    }
    if (q.has("size")) {
      const n = Number(q.get("size"));
      if (Number.isInteger(n) && n >= 10 && n <= 34) out.values.size = n;
      else out.errors.push("size=: expected an integer from 10 to 34 (log2 of the elements), got '" + q.get("size") + "'");
    }
    return out;
  }

  // The query that reproduces a setting (the inverse of parseParams).
  function toParams(v) {
    const q = new URLSearchParams();
    for (const key of ["bw", "fp32", "bf16", "bytes", "rate", "flops", "size"]) if (v[key] !== undefined) q.set(key, String(v[key]));
    return "?" + q.toString();
  }

  return {
    H200,
    parseFigure,
    parseParams,
    toParams,
    balanceFlopsPerByte,
    roundTripBytes,
    crossoverFlopsPerElement,
    saveSeconds,
    recomputeSeconds,
    cheaper,
    formatSeconds,
  };
});
