# parquet.cmake - the optional Parquet input (tokenize/input/parquet.cc): Apache
# Arrow's C++ Parquet reader as the pyarrow wheel ships it (libarrow,
# libparquet and their headers; Debian 12 has no Arrow package). Sets
# TKS_HAVE_PARQUET and the target tks_parquet: the reader, or
# tokenize/input/parquet_stub.c, which refuses Parquet inputs with the instruction.
#
# TKS_PARQUET=AUTO  build it when pyarrow is found (TKS_PYARROW_DIR, else the
#                   project's .venv-arrow made by scripts/install-venv.sh)
# TKS_PARQUET=ON    build it or stop with the reason
# TKS_PARQUET=OFF   never
#
# Arrow's headers need C++20 (Debian 12's g++ 12 compiles them); the unit is
# built as C++20 on its own, the rest of the project is unchanged. The
# programs find the wheel's libraries through the build's RPATH.
set(TKS_HAVE_PARQUET OFF)
set(TKS_PARQUET AUTO CACHE STRING "Read Parquet inputs with Arrow C++ from the pyarrow wheel: AUTO, ON, OFF")
set_property(CACHE TKS_PARQUET PROPERTY STRINGS AUTO ON OFF)
set(TKS_PYARROW_DIR "" CACHE PATH "The pyarrow package directory (site-packages/pyarrow); empty: .venv-arrow's")
if(NOT TKS_PARQUET MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "TKS_PARQUET=${TKS_PARQUET}: use AUTO, ON or OFF")
endif()

set(tks_pq_why "")
if(NOT TKS_PARQUET STREQUAL "OFF")
  set(tks_pa "${TKS_PYARROW_DIR}")
  if(NOT tks_pa)
    file(GLOB tks_pa LIST_DIRECTORIES true "${CMAKE_SOURCE_DIR}/.venv-arrow/lib/python3*/site-packages/pyarrow")
  endif()
  if(tks_pa)
    list(GET tks_pa 0 tks_pa)
    file(GLOB tks_pq_lib "${tks_pa}/libparquet.so.[0-9]*")
    file(GLOB tks_arrow_lib "${tks_pa}/libarrow.so.[0-9]*")
  endif()
  if(NOT tks_pa OR NOT EXISTS "${tks_pa}/include/parquet/file_reader.h")
    set(tks_pq_why "no pyarrow with its C++ headers (run scripts/install-venv.sh, or set -DTKS_PYARROW_DIR=site-packages/pyarrow)")
  elseif(NOT tks_pq_lib OR NOT tks_arrow_lib)
    set(tks_pq_why "${tks_pa} has no libparquet.so.N or libarrow.so.N")
  else()
    list(GET tks_pq_lib 0 tks_pq_lib)
    list(GET tks_arrow_lib 0 tks_arrow_lib)
    include(CheckCXXSourceCompiles)
    set(CMAKE_REQUIRED_FLAGS "-std=c++20")
    check_cxx_source_compiles("#include <concepts>\nint main() { return 0; }" TKS_CXX20_WORKS)
    unset(CMAKE_REQUIRED_FLAGS)
    if(NOT TKS_CXX20_WORKS)
      set(tks_pq_why "the C++ compiler does not compile C++20 (Arrow's headers need it)")
    endif()
  endif()
  if(tks_pq_why AND TKS_PARQUET STREQUAL "ON")
    message(FATAL_ERROR "TKS_PARQUET=ON but ${tks_pq_why}; or configure with -DTKS_PARQUET=OFF")
  endif()
endif()

if(NOT TKS_PARQUET STREQUAL "OFF" AND NOT tks_pq_why)
  set(TKS_HAVE_PARQUET ON)
  # The reader is a module (bin/tokshard-parquet.so) that the programs load
  # at their first Parquet input (tokenize/input/parquet_dl.c): linked into every
  # program, Arrow cost each process start 7 ms. It calls the loading
  # program's tks_fail, which the programs export; it links no tokshard
  # library itself (a second copy of the error state would hide its errors).
  add_library(tks_parquet_module MODULE tokenize/input/parquet.cc)
  set_target_properties(tks_parquet_module PROPERTIES CXX_STANDARD 20 CXX_STANDARD_REQUIRED ON PREFIX ""
                        OUTPUT_NAME tokshard-parquet LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
  target_include_directories(tks_parquet_module PRIVATE ${CMAKE_SOURCE_DIR})
  target_include_directories(tks_parquet_module SYSTEM PRIVATE "${tks_pa}/include")
  target_link_libraries(tks_parquet_module PRIVATE "${tks_pq_lib}" "${tks_arrow_lib}")
  add_library(tks_parquet STATIC tokenize/input/parquet_dl.c)
  add_dependencies(tks_parquet tks_parquet_module)
  target_compile_definitions(tks_parquet PRIVATE TKS_PARQUET_MODULE="$<TARGET_FILE:tks_parquet_module>")
  target_link_libraries(tks_parquet PUBLIC tks_common ${CMAKE_DL_LIBS})
  target_link_options(tks_parquet INTERFACE "LINKER:--export-dynamic-symbol=tks_fail")
  message(STATUS "Parquet input: on (${tks_pq_lib}, loaded from bin/tokshard-parquet.so)")
else()
  add_library(tks_parquet STATIC tokenize/input/parquet_stub.c)
  target_link_libraries(tks_parquet PUBLIC tks_common)
  if(TKS_PARQUET STREQUAL "OFF")
    message(STATUS "Parquet input: off (TKS_PARQUET=OFF)")
  else()
    message(STATUS "Parquet input: off (${tks_pq_why}; TKS_PARQUET=AUTO)")
  endif()
endif()
