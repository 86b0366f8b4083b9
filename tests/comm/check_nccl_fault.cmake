# One fault case of the NCCL communicator on the stand-in NCCL: runs MPIEXEC -np NP PROGRAM MODE with
# the case's environment (ENV: NAME=VALUE pairs joined by commas) and checks that every rank ended
# within LIMIT seconds (the job is killed after that: a hang fails) with output matching EXPECT
# (the failing rank named), and that the job failed (run_failing_job).
include(${CMAKE_CURRENT_LIST_DIR}/../run_failing_job.cmake)
set(WHAT "the fault did not fail it")
run_failing_job(${MPIEXEC} -np ${NP} @MPI_FLAGS@ ${PROGRAM} ${MODE})
