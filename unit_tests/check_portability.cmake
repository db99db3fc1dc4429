# The performance-portability suite at tiny sizes (so that it cannot rot) and P-bar's arithmetic:
# kdist_portability --smoke writes its JSON (every row with a finite, positive efficiency), then
# perf/portability/pbar.py merges two hand-written platforms: efficiencies 0.5 and 1.0 give the
# harmonic mean 0.667; a row one platform lacks gives 0; the same platform twice is refused. A third
# holds its memory-bound rows to its largest fused_copy row's rate when that beats its copy limit
# (0.5 becomes 0.25) and counts an efficiency above 1 as 1.
execute_process(COMMAND ${MPIEXEC} -n 1 ${EXE} --smoke --platform smoke --json ${DIR}/portability_smoke.json
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kdist_portability --smoke exited ${rc}")
endif()
file(READ ${DIR}/portability_smoke.json doc)
string(JSON n LENGTH "${doc}" rows)
if(n LESS 11)
  message(FATAL_ERROR "portability_smoke.json: ${n} rows, expected every kernel (11)")
endif()
math(EXPR last "${n} - 1")
foreach(i RANGE ${last})
  string(JSON kernel GET "${doc}" rows ${i} kernel)
  string(JSON eff GET "${doc}" rows ${i} efficiency)
  if(NOT eff MATCHES "^[0-9.eE+-]+$" OR eff LESS_EQUAL 0)
    message(FATAL_ERROR "portability_smoke.json: ${kernel} has efficiency '${eff}'")
  endif()
endforeach()
file(WRITE ${DIR}/pbar_a.json [=[{"context": {"platform": "a"}, "rows": [
  {"kernel": "k", "size": 1, "achieved": 5, "limit": "gemm_float", "limit_value": 10, "efficiency": 0.5},
  {"kernel": "k", "size": 2, "achieved": 9, "limit": "gemm_float", "limit_value": 10, "efficiency": 0.9}]}]=])
file(WRITE ${DIR}/pbar_b.json [=[{"context": {"platform": "b"}, "rows": [
  {"kernel": "k", "size": 1, "achieved": 10, "limit": "gemm_float", "limit_value": 10, "efficiency": 1.0}]}]=])
file(WRITE ${DIR}/pbar_c.json [=[{"context": {"platform": "c"}, "rows": [
  {"kernel": "fused_copy", "size": 10, "achieved": 30, "limit": "copy_one", "limit_value": 20, "efficiency": 1.5},
  {"kernel": "fused_copy", "size": 100, "achieved": 40, "limit": "copy_one", "limit_value": 20, "efficiency": 2.0},
  {"kernel": "m", "size": 1, "achieved": 10, "limit": "copy_one", "limit_value": 20, "efficiency": 0.5},
  {"kernel": "k", "size": 1, "achieved": 12, "limit": "gemm_float", "limit_value": 10, "efficiency": 1.2}]}]=])
execute_process(COMMAND ${PYTHON} ${PBAR} ${DIR}/pbar_a.json ${DIR}/pbar_b.json ${DIR}/portability_smoke.json
                OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pbar.py exited ${rc}")
endif()
if(NOT out MATCHES "\\| k \\| 1 \\| 0.500 \\| 1.000 \\| 0.000 \\| 0.000 \\|" OR NOT out MATCHES "\\| k \\| 2 \\| 0.900 \\| 0.000")
  message(FATAL_ERROR "pbar.py over three platforms:\n${out}")
endif()
execute_process(COMMAND ${PYTHON} ${PBAR} ${DIR}/pbar_a.json ${DIR}/pbar_b.json OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "\\| k \\| 1 \\| 0.500 \\| 1.000 \\| 0.667 \\|")
  message(FATAL_ERROR "pbar.py over a and b (rc ${rc}):\n${out}")
endif()
execute_process(COMMAND ${PYTHON} ${PBAR} ${DIR}/pbar_c.json OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "\\| m \\| 1 \\| 0.250 \\| 0.250 \\|" OR NOT out MATCHES "\\| k \\| 1 \\| 1.000 \\| 1.000 \\|"
   OR NOT err MATCHES "deep_copy rate, 2.00x" OR NOT err MATCHES "counted as 1.*k 1")
  message(FATAL_ERROR "pbar.py over c (rc ${rc}):\n${out}\n${err}")
endif()
execute_process(COMMAND ${PYTHON} ${PBAR} ${DIR}/pbar_a.json ${DIR}/pbar_a.json ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "appears twice")
  message(FATAL_ERROR "pbar.py took one platform twice (rc ${rc}): ${err}")
endif()
message("kdist_portability --smoke: ${n} rows; pbar.py: harmonic means and missing rows as stated")
