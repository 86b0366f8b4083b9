# A launched job that a fault must end (included by the fault checks run with cmake -P):
# run_failing_job(<command>...) runs the command (@MPI_FLAGS@ in it stands for MPI_FLAGS' words)
# with the case's environment, kills it after LIMIT seconds, prints its exit status, time and
# output, and fails the check unless every rank ended within LIMIT seconds (a hang fails), the job
# failed, and its output matches EXPECT (the failing rank named). Reads MPI_FLAGS, ENV (NAME=VALUE
# pairs joined by commas), LIMIT, EXPECT; WHAT: why a success is wrong ("the fault did not fail
# it").
function(run_failing_job)
  separate_arguments(flags UNIX_COMMAND "${MPI_FLAGS}")
  string(REPLACE "," ";" env "${ENV}")
  list(REMOVE_ITEM env "")
  set(command)
  foreach(arg IN LISTS ARGN)  # @MPI_FLAGS@ stands for MPI_FLAGS' words (none when empty)
    if(arg STREQUAL "@MPI_FLAGS@")
      list(APPEND command ${flags})
    else()
      list(APPEND command "${arg}")
    endif()
  endforeach()
  string(TIMESTAMP start "%s")
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${env} ${command}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT ${LIMIT})
  string(TIMESTAMP stop "%s")
  math(EXPR seconds "${stop} - ${start}")
  message("exit: ${rc}, ${seconds} s\n--- stdout\n${out}\n--- stderr\n${err}")
  if(rc MATCHES "timeout" OR seconds GREATER_EQUAL ${LIMIT})
    message(FATAL_ERROR "the job did not end within ${LIMIT} s")
  endif()
  if(rc EQUAL 0)
    message(FATAL_ERROR "the job succeeded: ${WHAT}")
  endif()
  if(NOT "${out}${err}" MATCHES "${EXPECT}")
    message(FATAL_ERROR "no line matches '${EXPECT}'")
  endif()
endfunction()
