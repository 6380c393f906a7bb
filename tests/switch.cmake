# The registry of switches (common/mla_switch.h): the getters and the check in this build
# (`switch`), the same with mla_switch.c compiled as in a Release build (`switch_release`), and
# the programs: `mlaserve env`, a start refused for a bad or unknown MLA_* variable
# (tests/switch/test_env.py).
mla_unit_test(switch mla_common)
add_executable(test_switch_release ${MLA_TEST_DIR}/unit/test_switch.c ${CMAKE_SOURCE_DIR}/common/mla_switch.c
               ${CMAKE_SOURCE_DIR}/common/mla_err.c)
target_include_directories(test_switch_release PRIVATE ${MLA_TEST_DIR}/unit ${CMAKE_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/common)
target_compile_definitions(test_switch_release PRIVATE MLA_TEST_RELEASE_SWITCHES=1)
target_link_libraries(test_switch_release Threads::Threads)
add_test(NAME switch_release COMMAND test_switch_release)
add_test(NAME switch_env COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/switch/test_env.py
         $<TARGET_FILE:mlaserve> $<TARGET_FILE:mlaserve-worker> ${CMAKE_SOURCE_DIR}/docs/switches.md)
# the check and the getters over arbitrary environments (tests/fuzz/fuzz_switch.c): corpus
# replay always, a deterministic libFuzzer run with -DMLA_FUZZ=ON
add_executable(replay_switch ${MLA_TEST_DIR}/fuzz/replay_main.c ${MLA_TEST_DIR}/fuzz/fuzz_switch.c)
target_link_libraries(replay_switch mla_common)
add_test(NAME switch_fuzz_replay COMMAND replay_switch ${MLA_TEST_DIR}/data/switch)
if(MLA_FUZZ)
  add_executable(fuzz_switch ${MLA_TEST_DIR}/fuzz/fuzz_switch.c)
  target_compile_options(fuzz_switch PRIVATE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  target_link_options(fuzz_switch PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_switch mla_common)
  add_test(NAME switch_fuzz_smoke
           COMMAND ${MLA_TEST_DIR}/fuzz/run_fuzz.sh $<TARGET_FILE:fuzz_switch> runs=5000 ${MLA_TEST_DIR}/data/switch)
  set_tests_properties(switch_fuzz_smoke PROPERTIES TIMEOUT 300
                       ENVIRONMENT "FUZZ_ARTIFACTS=${CMAKE_CURRENT_BINARY_DIR}/fuzz-artifacts")
endif()
