# Runs bench/crossover.cpp with fixed arguments and checks what it prints (ctest: crossover_cli).
#   cmake -DCROSSOVER=path/to/crossover -P tests/crossover_cli.cmake
# The expected figures follow from bench/crossover.h by hand, for the H200 figures:
#   balance  67e12 / 4270e9 = 15.69 and 790e12 / 4270e9 = 185.01 flops per byte
#   F*       2·2 bytes × those = 62.76 and 740.05 flops per element
#   per row  save 4096·4 / 4270e9 = 3.84 ns; recompute 4096·100 / 67e12 = 6.11 ns (fp32),
#            4096·100 / 790e12 = 0.518 ns (bf16): at 100 flops, fp32 says save, bf16 recompute.
if(NOT CROSSOVER)
  message(FATAL_ERROR "pass -DCROSSOVER=<path of the crossover program>")
endif()

function(expect_output args)
  execute_process(COMMAND ${CROSSOVER} ${args} OUTPUT_VARIABLE out ERROR_VARIABLE err
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "crossover ${args}: exit ${rc}\n${out}${err}")
  endif()
  foreach(want IN LISTS ARGN)
    string(FIND "${out}" "${want}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "crossover ${args}: expected '${want}' in:\n${out}")
    endif()
  endforeach()
endfunction()

function(expect_error args want)
  execute_process(COMMAND ${CROSSOVER} ${args} OUTPUT_VARIABLE out ERROR_VARIABLE err
                  RESULT_VARIABLE rc)
  string(FIND "${err}" "${want}" at)
  if(NOT rc EQUAL 2 OR at EQUAL -1)
    message(FATAL_ERROR "crossover ${args}: expected exit 2 and '${want}', got exit ${rc}:\n${err}")
  endif()
endfunction()

set(h200 --bandwidth 4270 --fp32-tflops 67 --bf16-tflops 790 --width 4096 --bytes-per-element 2)
expect_output("${h200};--recompute-flops;100"
  "balance point             15.7 flops/byte       185.0 flops/byte"
  "crossover                 62.8 flops/element    740.0 flops/element"
  "save + reload, per row    3.84 ns               3.84 ns"
  "recompute, per row        6.11 ns               0.518 ns"
  "cheaper                   save                  recompute")
# An fp32 value (an 8-byte round trip) doubles the crossover.
expect_output("${h200};--bytes-per-element;4;--recompute-flops;100"
  "crossover                 125.5 flops/element   1480.1 flops/element"
  "cheaper                   recompute             recompute")
# The defaults are the H200 figures measured by bench_crossover (4264 GB/s, 65.0, 788.6 TFLOP/s).
expect_output("--recompute-flops=100" "61.0 flops/element    739.8 flops/element")
# docs/lab.md's two commands: LayerNorm's x̂ (2 flops, a bf16 value) is recomputed; dropout's
# mask packed to bits (0.125 bytes) against about 25 flops of Philox is, charged in full, saved in
# the fp32 column (the one that applies: Philox is no matrix product).
expect_output("--recompute-flops;2;--bytes-per-element;2"
  "cheaper                   recompute             recompute")
expect_output("--recompute-flops;25;--bytes-per-element;0.125"
  "crossover                 3.8 flops/element     46.2 flops/element"
  "cheaper                   save                  recompute")
expect_output("--json" "\"crossover_flops_per_element\": 60.97560975609")
expect_error("--bandwidth;0" "--bandwidth must be > 0")
expect_error("--width;wide" "--width needs a number")
expect_error("--speed;3" "unknown option '--speed'")
