# Fails unless README.md holds SOURCE verbatim in a ```cpp block.
file(READ "${README}" readme)
file(READ "${SOURCE}" source)
string(FIND "${readme}" "```cpp\n${source}```" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md does not hold ${SOURCE} verbatim in a ```cpp block: copy the file into it")
endif()
