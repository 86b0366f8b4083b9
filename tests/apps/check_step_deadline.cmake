# The step deadline (docs/reliability.md, "The step deadline"): `mpirun -np NP distmuon train
# --step-timeout 2` on a tiny model, with FAULT (DISTMUON_FAULT: one rank stops itself with
# SIGSTOP in its optimizer step 2). Every rank must end within LIMIT seconds (a hang fails: the
# job is killed then), the job must fail, and the output must match EXPECT (the stopped rank
# named by the others). ENV: NAME=VALUE pairs joined by commas; WORK: a scratch folder.
separate_arguments(flags UNIX_COMMAND "${MPI_FLAGS}")
string(REPLACE "," ";" env "${ENV}")
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
string(REPEAT "free software for all copies of the licence\n" 300 text)
file(WRITE "${WORK}/text.txt" "${text}")
file(WRITE "${WORK}/tiny.json" "{\"model\": {\"context\": 8, \"embed\": 8, \"hidden\": 16, \
\"ffn\": 128, \"layers\": 2}, \"data\": {\"path\": \"${WORK}/text.txt\"}, \"train\": {\"steps\": 6, \
\"batch\": 32, \"log_every\": 1, \"eval_every\": 3, \"eval_windows\": 64}}")
string(TIMESTAMP start "%s")
execute_process(COMMAND ${CMAKE_COMMAND} -E env ${env} DISTMUON_FAULT=${FAULT}
                        ${MPIEXEC} -np ${NP} ${flags} -x DISTMUON_FAULT ${PROGRAM} train
                        --config ${WORK}/tiny.json --step-timeout 2
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT ${LIMIT})
string(TIMESTAMP stop "%s")
math(EXPR seconds "${stop} - ${start}")
message("exit: ${rc}, ${seconds} s\n--- stdout\n${out}\n--- stderr\n${err}")
file(REMOVE_RECURSE "${WORK}")
if(rc MATCHES "timeout" OR seconds GREATER_EQUAL ${LIMIT})
  message(FATAL_ERROR "the job did not end within ${LIMIT} s")
endif()
if(rc EQUAL 0)
  message(FATAL_ERROR "the job succeeded: the stopped rank did not fail it")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "no line matches '${EXPECT}'")
endif()
