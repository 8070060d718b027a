# minitrain_add_op_library(NAME SOURCES file...): an op of your own, in a project built against
# the installed package (docs/first_op.md). Installed beside minitrainConfig.cmake, which
# includes it, so find_package(minitrain) brings it along.
#
#   find_package(minitrain CONFIG REQUIRED)
#   minitrain_add_op_library(swiglu SOURCES swiglu.cu)   # at the top level, not in a function
#   add_executable(train_swiglu train_swiglu.cpp)
#   target_link_libraries(train_swiglu PRIVATE swiglu)  # the op's kernels and minitrain::minitrain
#
# NAME is an object library: its objects go whole into every program that links it, so the
# kernels' static registrations (core/registry.h) are kept. The .cu sources are compiled only
# when minitrain was built with CUDA (a CPU install leaves them out, and its registry needs no
# CUDA kernel); then CUDA is enabled here with what minitrain was built with: nvcc, C++20,
# --expt-relaxed-constexpr, and minitrain's CUDA architectures unless CMAKE_CUDA_ARCHITECTURES is
# set, and C++20 for the CUDA files of the whole directory. Programs and other .cu files that
# link NAME get the same flags. An op with CPU kernels
# only, in a header, passes no SOURCES, and declares itself CPU-only (MT_OP_BACKENDS).
#
# A macro, not a function: enable_language(CUDA) must run at the directory's top level.
macro(minitrain_add_op_library _mt_name)
  cmake_parse_arguments(_mt_op "" "" "SOURCES" ${ARGN})
  if(_mt_op_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "minitrain_add_op_library(${_mt_name}): unexpected arguments "
                        "'${_mt_op_UNPARSED_ARGUMENTS}'; list the files after SOURCES")
  endif()
  set(_mt_op_sources ${_mt_op_SOURCES})
  if(minitrain_WITH_CUDA)
    if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    endif()
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES ${minitrain_CUDA_ARCHITECTURES})
    endif()
    enable_language(CUDA)
    # CMake before 3.27 does not know nvcc's C++20 flag and would silently compile C++17, which
    # minitrain's headers are not.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)  # the variable, not cuda_std_20: CMake 3.25 lacks that feature
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  else()
    list(FILTER _mt_op_sources EXCLUDE REGEX "\\.cu$")
  endif()
  if(_mt_op_sources)
    add_library(${_mt_name} OBJECT ${_mt_op_sources})
    target_link_libraries(${_mt_name} PUBLIC minitrain::minitrain)
  else()  # nothing to compile (a CPU install, or header-only kernels): the op's headers only
    add_library(${_mt_name} INTERFACE)
    target_link_libraries(${_mt_name} INTERFACE minitrain::minitrain)
  endif()
  target_include_directories(${_mt_name} INTERFACE ${CMAKE_CURRENT_SOURCE_DIR})
  target_compile_features(${_mt_name} INTERFACE cxx_std_20)
  if(minitrain_WITH_CUDA)
    target_compile_options(${_mt_name} INTERFACE
                           "$<$<COMPILE_LANGUAGE:CUDA>:${minitrain_CUDA_FLAGS}>")
    if(_mt_op_sources)
      target_compile_options(${_mt_name} PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:${minitrain_CUDA_FLAGS}>")
    endif()
  endif()
endmacro()
