# DISTMUON_ENABLE_CUDA: the CUDA compute backend (src/compute/cuda) and the NCCL communicator
# (src/comm/nccl). AUTO (the default) turns them on when the CUDA toolkit (nvcc, the runtime and
# cuBLAS) and NCCL (nccl.h, libnccl) are found, by default in /usr/local/cuda (CUDAToolkit_ROOT
# or a CUDA compiler on PATH name another), and off otherwise; ON fails when any is missing; OFF
# builds without them. libdistmuon links the static CUDA runtime only: cuBLAS and NCCL are
# opened at run time by the first use of the cuda backend (docs/gpu.md, "Loading"). The kernels
# are compiled to machine code for sm_80 (A100, and A10/L40S/RTX 30-40 by binary compatibility),
# sm_90 (H100/H200) and sm_100 (B200), plus compute_100 PTX that the driver compiles for newer
# GPUs (DISTMUON_CUDA_ARCHITECTURES, CMake's CUDA_ARCHITECTURES syntax, to change it). Prints
# whether CUDA is on and why, and what the kernels are built for.
set(DISTMUON_ENABLE_CUDA AUTO CACHE STRING "Build the CUDA backend and the NCCL communicator (AUTO, ON, OFF)")
set_property(CACHE DISTMUON_ENABLE_CUDA PROPERTY STRINGS AUTO ON OFF)
set(DISTMUON_CUDA_ARCHITECTURES "80-real;90-real;100-real;100-virtual" CACHE STRING
    "CUDA architectures of the kernels (N-real: sm_N machine code, N-virtual: compute_N PTX)")

string(TOUPPER "${DISTMUON_ENABLE_CUDA}" distmuon_cuda_request)
if(NOT distmuon_cuda_request MATCHES "^(AUTO|ON|OFF|TRUE|FALSE|YES|NO|1|0)$")
  message(FATAL_ERROR "DISTMUON_ENABLE_CUDA='${DISTMUON_ENABLE_CUDA}': use AUTO, ON or OFF")
endif()
if(distmuon_cuda_request MATCHES "^(TRUE|YES|1)$")
  set(distmuon_cuda_request ON)
elseif(distmuon_cuda_request MATCHES "^(FALSE|NO|0)$")
  set(distmuon_cuda_request OFF)
endif()

set(DISTMUON_HAVE_CUDA OFF)
set(distmuon_cuda_why "")
if(distmuon_cuda_request STREQUAL "OFF")
  set(distmuon_cuda_why "DISTMUON_ENABLE_CUDA=OFF")
elseif(DISTMUON_SANITIZE)
  # The sanitizer build stays on the CPU: nvcc does not take the sanitizer flags.
  if(distmuon_cuda_request STREQUAL "ON")
    message(FATAL_ERROR "DISTMUON_ENABLE_CUDA=ON cannot be combined with DISTMUON_SANITIZE=ON")
  endif()
  set(distmuon_cuda_why "DISTMUON_SANITIZE=ON builds without CUDA")
else()
  if(NOT DEFINED CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  find_package(CUDAToolkit QUIET)
  # cuBLAS and NCCL: from the toolkit, else from the nvidia-* wheels of the Python environment
  # (as PyTorch takes them: nvidia/cu13 holds cuBLAS, nvidia/nccl NCCL), so that a toolkit
  # without them (a compiler-only install) still builds the backend. Only their headers are
  # needed to build libdistmuon: the libraries are opened at run time (docs/gpu.md, "Loading").
  set(distmuon_cuda_hints "")
  find_program(distmuon_python NAMES python3 python HINTS ${Python3_EXECUTABLE} NO_CACHE)
  if(Python3_EXECUTABLE)
    set(distmuon_python ${Python3_EXECUTABLE})
  endif()
  if(distmuon_python)
    execute_process(COMMAND ${distmuon_python} -c
                            "import nvidia; print(';'.join(list(nvidia.__path__)))"
                    OUTPUT_VARIABLE distmuon_nvidia_dirs OUTPUT_STRIP_TRAILING_WHITESPACE
                    ERROR_QUIET RESULT_VARIABLE distmuon_nvidia_rc)
    if(distmuon_nvidia_rc EQUAL 0)
      foreach(dir IN LISTS distmuon_nvidia_dirs)
        list(APPEND distmuon_cuda_hints ${dir}/cu13 ${dir}/cublas ${dir}/nccl)
      endforeach()
    endif()
  endif()
  if(CUDAToolkit_FOUND)
    set(distmuon_include_hints ${CUDAToolkit_INCLUDE_DIRS})
    set(distmuon_lib_hints ${CUDAToolkit_LIBRARY_DIR})
    foreach(dir IN LISTS distmuon_cuda_hints)
      list(APPEND distmuon_include_hints ${dir}/include)
      list(APPEND distmuon_lib_hints ${dir}/lib)
    endforeach()
    find_path(DISTMUON_CUBLAS_INCLUDE_DIR cublas_v2.h HINTS ${distmuon_include_hints})
    find_library(DISTMUON_CUBLAS_LIBRARY NAMES cublas libcublas.so.${CUDAToolkit_VERSION_MAJOR}
                 HINTS ${distmuon_lib_hints})
    find_path(DISTMUON_NCCL_INCLUDE_DIR nccl.h HINTS ${distmuon_include_hints})
    find_library(DISTMUON_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${distmuon_lib_hints})
  endif()
  if(NOT CMAKE_CUDA_COMPILER)
    set(distmuon_cuda_why "no CUDA compiler (nvcc) found")
  elseif(NOT CUDAToolkit_FOUND)
    set(distmuon_cuda_why "the CUDA toolkit was not found")
  elseif(NOT TARGET CUDA::cudart_static)
    set(distmuon_cuda_why "the static CUDA runtime (libcudart_static.a) was not found in ${CUDAToolkit_LIBRARY_DIR}")
  elseif(NOT DISTMUON_CUBLAS_INCLUDE_DIR OR NOT DISTMUON_CUBLAS_LIBRARY)
    set(distmuon_cuda_why "cuBLAS (cublas_v2.h and libcublas) was not found in ${CUDAToolkit_LIBRARY_DIR} nor in the Python environment's nvidia wheels (${distmuon_cuda_hints})")
  elseif(NOT DISTMUON_NCCL_INCLUDE_DIR OR NOT DISTMUON_NCCL_LIBRARY)
    set(distmuon_cuda_why "NCCL (nccl.h and libnccl) was not found in the CUDA toolkit nor in the Python environment's nvidia wheels (${distmuon_cuda_hints})")
  else()
    set(DISTMUON_HAVE_CUDA ON)
    get_filename_component(distmuon_cuda_root ${CUDAToolkit_BIN_DIR} DIRECTORY)
    set(distmuon_cuda_why "CUDA ${CUDAToolkit_VERSION} in ${distmuon_cuda_root}, cuBLAS ${DISTMUON_CUBLAS_LIBRARY}, NCCL ${DISTMUON_NCCL_LIBRARY}")
  endif()
  if(NOT DISTMUON_HAVE_CUDA AND distmuon_cuda_request STREQUAL "ON")
    message(FATAL_ERROR "DISTMUON_ENABLE_CUDA=ON but ${distmuon_cuda_why} (set CUDAToolkit_ROOT, "
                        "or configure with -DDISTMUON_ENABLE_CUDA=AUTO or OFF)")
  endif()
endif()

if(DISTMUON_HAVE_CUDA)
  set(CMAKE_CUDA_ARCHITECTURES ${DISTMUON_CUDA_ARCHITECTURES})
  set(CMAKE_CUDA_STANDARD 17)  # what cuda_kernels.cu needs (CMake 3.25 knows no CUDA 20 for nvcc)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_EXTENSIONS OFF)
  if(CMAKE_CXX_COMPILER_LAUNCHER AND NOT CMAKE_CUDA_COMPILER_LAUNCHER)
    set(CMAKE_CUDA_COMPILER_LAUNCHER ${CMAKE_CXX_COMPILER_LAUNCHER})
  endif()
  enable_language(CUDA)
  # What the kernels hold, as test_cuda_fatbin checks it in the built library: machine code
  # (ELF) for each N-real or plain N, PTX for each N-virtual or plain N.
  set(DISTMUON_CUDA_ELF "")
  set(DISTMUON_CUDA_PTX "")
  foreach(arch IN LISTS DISTMUON_CUDA_ARCHITECTURES)
    if(arch MATCHES "^(all|all-major|native)$")
      # CMake picks them (test_cuda_fatbin is then not defined: no list to check against).
      set(DISTMUON_CUDA_ELF "")
      set(DISTMUON_CUDA_PTX "")
      set(distmuon_cuda_arch_unlisted ON)
      break()
    endif()
    if(NOT arch MATCHES "^([0-9]+[af]?)(-real|-virtual)?$")
      message(FATAL_ERROR "DISTMUON_CUDA_ARCHITECTURES: '${arch}' is not N, N-real, N-virtual, "
                          "all, all-major or native")
    endif()
    if(NOT CMAKE_MATCH_2 STREQUAL "-virtual")
      list(APPEND DISTMUON_CUDA_ELF sm_${CMAKE_MATCH_1})
    endif()
    if(NOT CMAKE_MATCH_2 STREQUAL "-real")
      list(APPEND DISTMUON_CUDA_PTX compute_${CMAKE_MATCH_1})
    endif()
  endforeach()
  if(distmuon_cuda_arch_unlisted)
    set(DISTMUON_CUDA_ELF "what CMake's '${DISTMUON_CUDA_ARCHITECTURES}' selects")
  endif()
  string(REPLACE ";" ", " distmuon_elf "${DISTMUON_CUDA_ELF}")
  string(REPLACE ";" ", " distmuon_ptx "${DISTMUON_CUDA_PTX}")
  if(NOT distmuon_ptx)
    set(distmuon_ptx "none")
  endif()
  if(distmuon_cuda_arch_unlisted)
    set(distmuon_ptx "what it selects")
    set(DISTMUON_CUDA_ELF "")
  endif()
  message(STATUS "distmuon: CUDA backend on: ${distmuon_cuda_why}")
  message(STATUS "distmuon: CUDA kernels: machine code for ${distmuon_elf}; PTX for ${distmuon_ptx} "
                 "(DISTMUON_CUDA_ARCHITECTURES=${DISTMUON_CUDA_ARCHITECTURES})")
  # cuobjdump lists what the built library holds (test_cuda_fatbin): from the toolkit, else from
  # the nvidia-cuda-cuobjdump wheel of the Python environment (python/requirements-cuda.txt).
  set(distmuon_bin_hints ${CUDAToolkit_BIN_DIR})
  foreach(dir IN LISTS distmuon_cuda_hints)
    list(APPEND distmuon_bin_hints ${dir}/bin)
  endforeach()
  find_program(DISTMUON_CUOBJDUMP cuobjdump HINTS ${distmuon_bin_hints})

  # distmuon_cuda_sources(FILES...): adds the CUDA backend's sources (of the calling folder) to
  # distmuon. The CUDA headers (runtime, cuBLAS, NCCL) reach these sources only, as system
  # includes, and the static runtime is linked without its usage requirements: every other object
  # of the library compiles with the same command line with CUDA on or off, so that a compiler
  # cache serves both builds (a CUDA build and the CPU-only one of `pip install .`).
  function(distmuon_cuda_sources)
    set(flags "")
    foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS DISTMUON_CUBLAS_INCLUDE_DIR DISTMUON_NCCL_INCLUDE_DIR)
      list(APPEND flags -isystem ${dir})
    endforeach()
    target_sources(distmuon PRIVATE ${ARGN})
    set_property(SOURCE ${ARGN} TARGET_DIRECTORY distmuon APPEND PROPERTY COMPILE_OPTIONS ${flags})
    target_link_libraries(distmuon PRIVATE $<LINK_ONLY:CUDA::cudart_static>)
  endfunction()
else()
  message(STATUS "distmuon: CUDA backend off: ${distmuon_cuda_why}")
endif()
