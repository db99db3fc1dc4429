# Runs a harness self-test and checks it failed the intended way:
#   cmake -DMPIEXEC=... -DNP=... -DEXE=... -DTAG=... -DEXPECT=... -P check_selftest.cmake
# EXPECT is a ;-list of regular expressions that must all appear in the combined output; optional:
# FORBID, a ;-list that must not appear, and MAX_SECONDS, how long the failure may take. TAG is
# the program's argument list (also used for kdist_calibrate's failure check).
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${MPIEXEC} -n ${NP} ${EXE} ${TAG}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
string(TIMESTAMP t1 "%s")
math(EXPR elapsed "${t1} - ${t0}")
message("${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "self-test ${TAG} at ${NP} ranks exited 0; it must fail")
endif()
if(rc MATCHES "timeout|Process terminated")
  message(FATAL_ERROR "self-test ${TAG} at ${NP} ranks hung (${rc})")
endif()
foreach(re IN LISTS EXPECT)
  if(NOT "${out}${err}" MATCHES "${re}")
    message(FATAL_ERROR "self-test ${TAG} at ${NP} ranks: output lacks /${re}/")
  endif()
endforeach()
foreach(re IN LISTS FORBID)
  if("${out}${err}" MATCHES "${re}")
    message(FATAL_ERROR "self-test ${TAG} at ${NP} ranks: output has /${re}/")
  endif()
endforeach()
if(DEFINED MAX_SECONDS AND elapsed GREATER MAX_SECONDS)
  message(FATAL_ERROR "self-test ${TAG} at ${NP} ranks took ${elapsed} s to fail (at most ${MAX_SECONDS} s)")
endif()
message("self-test ${TAG} at ${NP} ranks failed as intended (exit ${rc}) in ${elapsed} s")
