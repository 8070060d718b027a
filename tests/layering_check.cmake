# Tests cmake/check_layering.cmake: on copies of core/, data/ and train/ it passes; with an upward
# include planted in a copy it must fail, naming the file, the include and the rule. One plant per
# boundary a new area brings: core/ including data/ (data is above core), data/ including train/
# (data depends on core only) and train/ including app/ (the program is above the trainer).
#   cmake -DROOT=<repo> -DWORK=<scratch dir> -P tests/layering_check.cmake
cmake_policy(VERSION 3.25)
set(areas "core;ops;check;nn;optim;parallel;data;train;app")

# The check on the copy of `area` under `root` (lists passed quoted, whole).
function(run_check area allowed root out_rc out_out out_err)
  execute_process(COMMAND ${CMAKE_COMMAND} -DAREA=${area} "-DALLOWED=${allowed}" "-DAREAS=${areas}"
                          -DROOT=${root} -P ${ROOT}/cmake/check_layering.cmake
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${out_rc} ${rc} PARENT_SCOPE)
  set(${out_out} "${out}" PARENT_SCOPE)
  set(${out_err} "${err}" PARENT_SCOPE)
endfunction()

# area: the copy checked; allowed: what it may include (as CMakeLists.txt derives it); file: the
# copy's file that gets the include; include: the planted header.
function(check_plant area allowed file include)
  set(work "${WORK}/${area}")
  file(REMOVE_RECURSE "${work}")
  file(MAKE_DIRECTORY "${work}")
  file(COPY "${ROOT}/${area}" DESTINATION "${work}")
  run_check(${area} "${allowed}" ${work} rc out err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the clean copy of ${area}/ failed the layering check:\n${out}${err}")
  endif()

  file(READ "${work}/${area}/${file}" body)
  file(WRITE "${work}/${area}/${file}" "#include \"${include}\"\n${body}")
  run_check(${area} "${allowed}" ${work} rc out err)
  if(rc EQUAL 0)
    message(FATAL_ERROR "an upward include (${area}/${file} including ${include}) passed the "
                        "layering check")
  endif()
  string(REPLACE ";" ", " allowed_text "${allowed}")
  set(expected "${area}/${file}: #include \"${include}\": ${area}/ may include only ${allowed_text}")
  string(FIND "${out}${err}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the layering check failed without the expected message\n  ${expected}\n"
                        "got:\n${out}${err}")
  endif()
  message(STATUS "layering check: the planted include was caught:\n${out}${err}")
endfunction()

check_plant(core "core" tensor.cpp "data/data.h")
check_plant(data "data;core" data.cpp "train/trainer.h")
check_plant(train "train;optim;nn;ops;core;parallel;data" trainer.cpp "app/inference.h")
