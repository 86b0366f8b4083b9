# test_cuda_fatbin: every file in FILES (comma-separated: the library, the CLI) holds the CUDA
# kernels as machine code for exactly the architectures in ELF (sm_N, comma-separated) and as PTX
# for exactly those in PTX (compute_N), as cuobjdump (CUOBJDUMP) lists them; so does each file in
# OPTIONAL_FILES (the Python module) that is built and holds device code at all (one that does not
# link the CUDA backend has none; both cases are reported). Fails when cuobjdump is missing: the check must run
# wherever CUDA is built.
if(NOT CUOBJDUMP OR NOT EXISTS "${CUOBJDUMP}")
  message(FATAL_ERROR "test_cuda_fatbin: cuobjdump was not found (DISTMUON_CUOBJDUMP='${CUOBJDUMP}'): "
                      "it comes with a full CUDA toolkit, or from the nvidia-cuda-cuobjdump wheel "
                      "of python/requirements-cuda.txt (scripts/python-env.sh installs it)")
endif()
string(REPLACE "," ";" files "${FILES}")
string(REPLACE "," ";" optional_files "${OPTIONAL_FILES}")
string(REPLACE "," ";" want_elf "${ELF}")
string(REPLACE "," ";" want_ptx_virtual "${PTX}")
set(want_ptx "")
foreach(p IN LISTS want_ptx_virtual)  # cuobjdump names PTX for compute_N as sm_N.ptx
  string(REPLACE "compute_" "sm_" p "${p}")
  list(APPEND want_ptx ${p})
endforeach()
list(SORT want_elf)
list(SORT want_ptx)
set(failed "")
foreach(file IN LISTS files optional_files)
  if(NOT EXISTS "${file}" AND "${file}" IN_LIST optional_files)
    message(STATUS "${file}: not built")
    continue()
  endif()
  execute_process(COMMAND "${CUOBJDUMP}" --list-elf --list-ptx "${file}"
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 AND "${file}" IN_LIST optional_files AND "${err}${out}" MATCHES
                                                             "does not contain device code")
    message(STATUS "${file}: no device code (it does not link the CUDA backend)")
    continue()
  endif()
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "test_cuda_fatbin: cuobjdump --list-elf --list-ptx ${file} failed (${rc}): ${err}")
  endif()
  string(REGEX MATCHALL "ELF file +[0-9]+: [^\n]*\\.(sm_[0-9]+[af]?)\\.cubin" elf_lines "${out}")
  string(REGEX MATCHALL "PTX file +[0-9]+: [^\n]*\\.(sm_[0-9]+[af]?)\\.ptx" ptx_lines "${out}")
  set(got_elf "")
  foreach(line IN LISTS elf_lines)
    string(REGEX REPLACE ".*\\.(sm_[0-9]+[af]?)\\.cubin$" "\\1" arch "${line}")
    list(APPEND got_elf ${arch})
  endforeach()
  set(got_ptx "")
  foreach(line IN LISTS ptx_lines)
    string(REGEX REPLACE ".*\\.(sm_[0-9]+[af]?)\\.ptx$" "\\1" arch "${line}")
    list(APPEND got_ptx ${arch})
  endforeach()
  list(REMOVE_DUPLICATES got_elf)
  list(REMOVE_DUPLICATES got_ptx)
  list(SORT got_elf)
  list(SORT got_ptx)
  get_filename_component(name "${file}" NAME)
  message(STATUS "${name}: machine code ${got_elf}; PTX ${got_ptx}")
  if(NOT "${got_elf}" STREQUAL "${want_elf}" OR NOT "${got_ptx}" STREQUAL "${want_ptx}")
    string(APPEND failed "\n  ${name}: machine code [${got_elf}], PTX [${got_ptx}]; "
                         "configured: machine code [${want_elf}], PTX [${want_ptx}]")
  endif()
endforeach()
if(failed)
  message(FATAL_ERROR "test_cuda_fatbin: the kernels built are not those configured:${failed}")
endif()
