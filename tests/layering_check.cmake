# Tests cmake/check_layering.cmake: on a copy of core/ it passes; with an upward include planted
# in the copy (core/ including ops/) it must fail, naming the file, the include and the rule.
#   cmake -DROOT=<repo> -DWORK=<scratch dir> -P tests/layering_check.cmake
cmake_policy(VERSION 3.25)
set(areas "core;ops;nn;optim;parallel;train")
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
file(COPY "${ROOT}/core" DESTINATION "${WORK}")

function(run_check out_rc out_text)
  execute_process(COMMAND ${CMAKE_COMMAND} -DAREA=core -DALLOWED=core "-DAREAS=${areas}"
                          -DROOT=${WORK} -P ${ROOT}/cmake/check_layering.cmake
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${out_rc} ${rc} PARENT_SCOPE)
  set(${out_text} "${out}${err}" PARENT_SCOPE)
endfunction()

run_check(rc text)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the clean copy of core/ failed the layering check:\n${text}")
endif()

file(READ "${WORK}/core/tensor.cpp" body)
file(WRITE "${WORK}/core/tensor.cpp" "#include \"ops/linear/linear.h\"\n${body}")
run_check(rc text)
if(rc EQUAL 0)
  message(FATAL_ERROR "an upward include (core/ including ops/) passed the layering check")
endif()
set(expected "core/tensor.cpp: #include \"ops/linear/linear.h\": core/ may include only core")
string(FIND "${text}" "${expected}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the layering check failed without the expected message\n  ${expected}\n"
                      "got:\n${text}")
endif()
message(STATUS "layering check: the planted include was caught:\n${text}")
