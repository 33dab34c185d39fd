# cuda.cmake - the optional CUDA backend (trainer/cuda): CUDA kernels, cuBLASLt
# GEMMs, cuDNN flash attention through the cuDNN frontend (header-only), NCCL
# collectives. Sets TKS_HAVE_CUDA and, when ON, the target tks_cuda.
#
# TKS_CUDA=AUTO  build it when nvcc is found (PATH, CUDACXX or /usr/local/cuda)
# TKS_CUDA=ON    build it or stop with the reason
# TKS_CUDA=OFF   never (the CPU build is exactly the build without the toolkit)
#
# The sources compile without a GPU, so a compile error never waits for one;
# CMAKE_CUDA_ARCHITECTURES defaults to 80;90 (A100, H100/H200).
set(TKS_HAVE_CUDA OFF)
set(TKS_HAVE_CUDNN_FE OFF)
if(NOT TKS_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "TKS_CUDA=${TKS_CUDA}: use AUTO, ON or OFF")
endif()
if(TKS_CUDA STREQUAL "OFF")
  message(STATUS "CUDA backend: off (TKS_CUDA=OFF)")
  return()
endif()

include(CheckLanguage)
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "CUDA compiler")
endif()
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  if(TKS_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TKS_CUDA=ON but no CUDA compiler was found: install the CUDA toolkit "
                        "(nvcc), set CUDACXX=/path/to/nvcc, or configure with -DTKS_CUDA=OFF")
  endif()
  message(STATUS "CUDA backend: off (no nvcc found; TKS_CUDA=AUTO)")
  return()
endif()

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 80 90)
endif()
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

# NCCL and cuDNN: the toolkit's folders first, then the system's, then the
# Python wheels' layout (nvidia-nccl-cu13, nvidia-cudnn-cu13) under TKS_CUDA_EXTRA_ROOT.
set(_tks_cuda_hints ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_INCLUDE_DIRS}/../lib64
    /usr/local/cuda/lib64 /usr/local/lib /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE})
set(_tks_cuda_inc_hints ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include /usr/local/include)
if(DEFINED ENV{TKS_CUDA_EXTRA_ROOT})
  file(GLOB _tks_extra_lib LIST_DIRECTORIES true "$ENV{TKS_CUDA_EXTRA_ROOT}/*/lib")
  file(GLOB _tks_extra_inc LIST_DIRECTORIES true "$ENV{TKS_CUDA_EXTRA_ROOT}/*/include")
  list(PREPEND _tks_cuda_hints ${_tks_extra_lib})
  list(PREPEND _tks_cuda_inc_hints ${_tks_extra_inc})
endif()
find_path(TKS_NCCL_INCLUDE nccl.h HINTS ${_tks_cuda_inc_hints})
find_library(TKS_NCCL_LIB NAMES nccl libnccl.so.2 HINTS ${_tks_cuda_hints})
if(NOT TKS_NCCL_INCLUDE OR NOT TKS_NCCL_LIB)
  set(_why "NCCL not found (nccl.h: ${TKS_NCCL_INCLUDE}, libnccl: ${TKS_NCCL_LIB}); install NCCL "
           "or point TKS_NCCL_INCLUDE/TKS_NCCL_LIB at it")
  if(TKS_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TKS_CUDA=ON: ${_why}")
  endif()
  message(STATUS "CUDA backend: off (${_why})")
  return()
endif()

find_path(TKS_CUDNN_INCLUDE cudnn.h HINTS ${_tks_cuda_inc_hints})
find_library(TKS_CUDNN_LIB NAMES cudnn libcudnn.so.9 HINTS ${_tks_cuda_hints})
# The cuDNN frontend (header-only C++), fetched by scripts/install-deps.sh --cuda
# into third_party/cudnn-frontend (PyPI nvidia-cudnn-frontend).
find_path(TKS_CUDNN_FE_INCLUDE cudnn_frontend.h
          HINTS ${CMAKE_SOURCE_DIR}/third_party/cudnn-frontend/include NO_DEFAULT_PATH)
if(TKS_CUDNN_INCLUDE AND TKS_CUDNN_LIB AND TKS_CUDNN_FE_INCLUDE)
  set(TKS_HAVE_CUDNN_FE ON)
  message(STATUS "CUDA backend: cuDNN flash attention (frontend ${TKS_CUDNN_FE_INCLUDE})")
else()
  message(STATUS "CUDA backend: without cuDNN flash attention (cudnn.h: ${TKS_CUDNN_INCLUDE}, "
                 "libcudnn: ${TKS_CUDNN_LIB}, cudnn_frontend.h: ${TKS_CUDNN_FE_INCLUDE}); "
                 "run scripts/install-deps.sh --cuda to fetch the frontend. Attention uses "
                 "tokshard's own kernel.")
endif()

set(TKS_HAVE_CUDA ON)
message(STATUS "CUDA backend: on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures "
               "${CMAKE_CUDA_ARCHITECTURES}, NCCL ${TKS_NCCL_LIB})")

# tks_cuda is one shared library (libtks_cuda.so) that every CUDA-enabled
# program loads, so the kernels exist once: in a bundle for a GPU machine
# (bench/gpu/bundle.sh) the executables stay small. It holds the CUDA code
# only: the tokshard functions it calls (tks_fail, tks_comm_init, ...) are
# left undefined here and bound at load time to the executable's own copies
# (the linker exports from an executable what a shared library on its link
# line needs), so there is one error state and one registry per process,
# never a second copy inside the library. INTERFACE: a program linking
# tks_cuda gets the trainer too.
add_library(tks_cuda SHARED
  trainer/cuda/cuda_backend.cu trainer/cuda/cuda_elementwise.cu trainer/cuda/cuda_embedding.cu
  trainer/cuda/cuda_norm.cu trainer/cuda/cuda_attention.cu trainer/cuda/cuda_xent.cu
  trainer/cuda/cuda_adamw.cu trainer/cuda/cuda_gemm.cu trainer/cuda/cuda_util.cu trainer/cuda/nccl_comm.c)
target_include_directories(tks_cuda PUBLIC ${CMAKE_SOURCE_DIR} ${TKS_NCCL_INCLUDE})
target_link_libraries(tks_cuda PRIVATE CUDA::cudart CUDA::cublasLt CUDA::cublas ${TKS_NCCL_LIB}
                      PkgConfig::MPI)
target_compile_definitions(tks_cuda PUBLIC TKS_HAVE_CUDA=1)
# Warnings for the host code nvcc hands to gcc; -Werror there too under TKS_WERROR.
target_compile_options(tks_cuda PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --expt-relaxed-constexpr>)
if(TKS_WERROR)
  target_compile_options(tks_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Werror -Werror=all-warnings>)
endif()
# RPATH $ORIGIN: beside the executables' $ORIGIN/../lib in a bundle; CMake's
# build-tree RPATH still finds it in the build directory.
set_target_properties(tks_cuda PROPERTIES CUDA_SEPARABLE_COMPILATION OFF POSITION_INDEPENDENT_CODE ON
                      LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib)
if(TKS_HAVE_CUDNN_FE)
  target_sources(tks_cuda PRIVATE trainer/cuda/cudnn_attention.cpp)
  target_include_directories(tks_cuda SYSTEM PRIVATE ${TKS_CUDNN_FE_INCLUDE} ${TKS_CUDNN_INCLUDE}
                             ${CUDAToolkit_INCLUDE_DIRS})
  target_link_libraries(tks_cuda PRIVATE ${TKS_CUDNN_LIB} CUDA::nvrtc)
  target_compile_definitions(tks_cuda PUBLIC TKS_HAVE_CUDNN_FE=1)
endif()

