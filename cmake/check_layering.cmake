# The layering check: fails when a file of one area includes a header of an area it must not
# depend on. Run at build time, before the area's library compiles (see CMakeLists.txt), so an
# upward include fails the build however it got there.
#
#   cmake -DAREA=ops -DALLOWED="core;ops" -DROOT=<repo> -DAREAS="core;ops;..." [-DSTAMP=<file>]
#         -P cmake/check_layering.cmake
#
# Scans every .h/.cuh/.cpp/.cu under ROOT/AREA for `#include "<area>/..."` with <area> one of
# AREAS and not in ALLOWED. Includes are rooted at the repository root, so the first path
# component names the area. Writes STAMP when the area is clean.
cmake_policy(VERSION 3.25)
foreach(var AREA ALLOWED ROOT AREAS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_layering.cmake: -D${var}=... is required")
  endif()
endforeach()

file(GLOB_RECURSE files LIST_DIRECTORIES false
     "${ROOT}/${AREA}/*.h" "${ROOT}/${AREA}/*.cuh" "${ROOT}/${AREA}/*.cpp" "${ROOT}/${AREA}/*.cu")
list(SORT files)
set(violations "")
foreach(file IN LISTS files)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"[A-Za-z0-9_]+/")
  foreach(line IN LISTS lines)
    string(REGEX MATCH "\"([A-Za-z0-9_]+)/[^\"]*\"" include "${line}")
    set(target_area "${CMAKE_MATCH_1}")
    if(target_area IN_LIST AREAS AND NOT target_area IN_LIST ALLOWED)
      file(RELATIVE_PATH rel "${ROOT}" "${file}")
      string(REPLACE ";" ", " allowed_text "${ALLOWED}")
      string(APPEND violations "  ${rel}: #include ${include}: ${AREA}/ may include only "
                               "${allowed_text}\n")
    endif()
  endforeach()
endforeach()

if(violations)
  message(FATAL_ERROR "layering violation (docs/library.md, \"Layering\"):\n${violations}")
endif()
if(DEFINED STAMP)
  file(WRITE "${STAMP}" "")
endif()
