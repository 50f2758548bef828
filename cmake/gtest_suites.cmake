# Lists the test suites of a GoogleTest program, for tests/CMakeLists.txt's
# bigbatch_test, which registers one ctest entry per suite: each entry is one
# process (--gtest_filter=SUITE.*), where a process per test cost a LibTorch
# start each (0.4 s with current LibTorch, 0.8 s with Debian's 1.13, on the
# Xeon) and outweighed most tests. Run after the program is built:
#   cmake -D EXECUTABLE=PROGRAM -D OUTPUT=FILE [-D EXCLUDE=REGEX] -P gtest_suites.cmake
# FILE gets one line per suite: its name, a space, and how many of its tests
# are left when the tests whose full name (SUITE.TEST) matches REGEX are
# left out (a suite with none left is not listed).
execute_process(COMMAND "${EXECUTABLE}" --gtest_list_tests OUTPUT_VARIABLE listing RESULT_VARIABLE rc TIMEOUT 60)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXECUTABLE} --gtest_list_tests exited ${rc}: ${listing}")
endif()
# The comments GoogleTest adds ("  # GetParam() = ...") may hold anything.
string(REGEX REPLACE "  #[^\n]*" "" listing "${listing}")
string(REPLACE ";" "," listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(suites "")
set(suite "")
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ ].*)\\.$")
    set(suite "${CMAKE_MATCH_1}")
    list(APPEND suites "${suite}")
    set(count_${suite} 0)
  elseif(line MATCHES "^  +([^ ]+)$" AND suite)
    if(NOT EXCLUDE OR NOT "${suite}.${CMAKE_MATCH_1}" MATCHES "${EXCLUDE}")
      math(EXPR count_${suite} "${count_${suite}} + 1")
    endif()
  endif()
endforeach()
set(text "")
foreach(suite IN LISTS suites)
  if(count_${suite} GREATER 0)
    string(APPEND text "${suite} ${count_${suite}}\n")
  endif()
endforeach()
file(WRITE "${OUTPUT}" "${text}")
