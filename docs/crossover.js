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

  return {
    H200,
    balanceFlopsPerByte,
    roundTripBytes,
    crossoverFlopsPerElement,
    saveSeconds,
    recomputeSeconds,
    cheaper,
    formatSeconds,
  };
});
