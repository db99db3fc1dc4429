# Fails unless every symbol in SYMBOLS is an undefined (to-be-linked) reference of EXE (nm -u):
# an #ifdef-emptied CUDA translation unit cannot pass.
execute_process(COMMAND nm -u ${EXE} OUTPUT_VARIABLE undefined RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm -u ${EXE} failed (${rc})")
endif()
foreach(sym IN LISTS SYMBOLS)
  if(NOT undefined MATCHES "[ \n]U ${sym}(@|\n)")
    message(FATAL_ERROR "${EXE} does not reference ${sym}")
  endif()
  message("${EXE} references ${sym}")
endforeach()
