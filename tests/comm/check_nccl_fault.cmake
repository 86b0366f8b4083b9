# One fault case of the NCCL communicator on the stand-in NCCL: runs MPIEXEC -np NP PROGRAM with
# the case's environment (ENV: NAME=VALUE pairs joined by commas) and checks that every rank ended within
# LIMIT seconds (the job is killed after that: a hang fails) with output matching EXPECT (the
# failing rank named), and that the job failed.
separate_arguments(flags UNIX_COMMAND "${MPI_FLAGS}")
string(REPLACE "," ";" env "${ENV}")
string(TIMESTAMP start "%s")
execute_process(COMMAND ${CMAKE_COMMAND} -E env ${env} ${MPIEXEC} -np ${NP} ${flags} ${PROGRAM}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT ${LIMIT})
string(TIMESTAMP stop "%s")
math(EXPR seconds "${stop} - ${start}")
message("exit: ${rc}, ${seconds} s\n--- stdout\n${out}\n--- stderr\n${err}")
if(rc MATCHES "timeout" OR seconds GREATER_EQUAL ${LIMIT})
  message(FATAL_ERROR "the job did not end within ${LIMIT} s")
endif()
if(rc EQUAL 0)
  message(FATAL_ERROR "the job succeeded: the fault did not fail it")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "no line matches '${EXPECT}'")
endif()
