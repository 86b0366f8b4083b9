# The step deadline (docs/reliability.md, "The step deadline"): `mpirun -np NP distmuon train
# --step-timeout 2` on a tiny model, with FAULT (DISTMUON_FAULT: one rank stops itself with
# SIGSTOP in its optimizer step 2). Every rank must end within LIMIT seconds (a hang fails: the
# job is killed then), the job must fail, and the output must match EXPECT (the stopped rank
# named by the others; run_failing_job). ENV: NAME=VALUE pairs joined by commas; WORK: a
# scratch folder.
include(${CMAKE_CURRENT_LIST_DIR}/../run_failing_job.cmake)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
string(REPEAT "free software for all copies of the licence\n" 300 text)
file(WRITE "${WORK}/text.txt" "${text}")
file(WRITE "${WORK}/tiny.json" "{\"model\": {\"context\": 8, \"embed\": 8, \"hidden\": 16, \
\"ffn\": 128, \"layers\": 2}, \"data\": {\"path\": \"${WORK}/text.txt\"}, \"train\": {\"steps\": 6, \
\"batch\": 32, \"log_every\": 1, \"eval_every\": 3, \"eval_windows\": 64}}")
set(WHAT "the stopped rank did not fail it")
set(ENV "${ENV},DISTMUON_FAULT=${FAULT}")
run_failing_job(${MPIEXEC} -np ${NP} @MPI_FLAGS@ -x DISTMUON_FAULT ${PROGRAM} train
                --config ${WORK}/tiny.json --step-timeout 2)
file(REMOVE_RECURSE "${WORK}")
