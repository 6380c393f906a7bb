# Grammars (common/gram): GBNF parser, automaton, token masks; the JSON-schema compiler and the
# request's constraint parameters (coordinator/api_constrain).
mla_unit_test(gram mla_common m)

# the fuzz targets' seed corpora (and kept crashes) replayed in every build
add_executable(replay_gram ${MLA_TEST_DIR}/fuzz/replay_main.c ${MLA_TEST_DIR}/fuzz/fuzz_gram.c)
target_include_directories(replay_gram PRIVATE ${CMAKE_SOURCE_DIR})
target_link_libraries(replay_gram mla_common m)
add_test(NAME gram_fuzz_replay COMMAND replay_gram ${MLA_TEST_DIR}/data/gram)

if(MLA_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "MLA_FUZZ=ON needs clang (CC=clang)")
  endif()
  add_executable(fuzz_gram ${MLA_TEST_DIR}/fuzz/fuzz_gram.c ${CMAKE_SOURCE_DIR}/common/gram.c)
  target_include_directories(fuzz_gram PRIVATE ${CMAKE_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/common)
  target_compile_options(fuzz_gram PRIVATE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  target_link_options(fuzz_gram PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_gram mla_common m)
  add_test(NAME fuzz_gram_smoke
           COMMAND ${MLA_TEST_DIR}/fuzz/run_fuzz.sh $<TARGET_FILE:fuzz_gram> runs=20000 ${MLA_TEST_DIR}/data/gram)
  set_tests_properties(fuzz_gram_smoke PROPERTIES ENVIRONMENT "FUZZ_ARTIFACTS=${CMAKE_CURRENT_BINARY_DIR}/fuzz-artifacts")
endif()

# Structured output and logit_bias end to end (tiny model, CPU workers): every constrained output
# validated with Python jsonschema, unconstrained neighbours unchanged, preemption and the prefix
# cache followed by the grammar state.
if(TARGET mlaserve-worker AND TARGET mlaserve_serve_test)
  add_test(NAME serve_structured
           COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/serve/test_structured.py
                   $<TARGET_FILE:mlaserve_serve_test> $<TARGET_FILE:mlaserve-worker> ${MLA_FIXTURES})
  set_tests_properties(serve_structured PROPERTIES TIMEOUT 1200 SKIP_RETURN_CODE 77)
endif()

# Host-sampled rows (temperature, json_schema, logit_bias, penalties, logprobs) in the workers' step
# ahead (worker/wk_ahead.h): the same streamed answers with --step-ahead off and on, at TP 1 and 2
# (rank 0's tokens broadcast to the other rank before the step ahead).
if(TARGET mlaserve-worker AND TARGET mlaserve_serve_test)
  foreach(tp 1 2)
    add_test(NAME serve_ahead_host_tp${tp}
             COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/serve/test_ahead_host.py
                     $<TARGET_FILE:mlaserve_serve_test> $<TARGET_FILE:mlaserve-worker> ${MLA_FIXTURES} ${tp})
    set_tests_properties(serve_ahead_host_tp${tp} PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
  endforeach()
endif()

mla_unit_test(constrain mla_coord m)

add_executable(replay_schema ${MLA_TEST_DIR}/fuzz/replay_main.c ${MLA_TEST_DIR}/fuzz/fuzz_schema.c)
target_link_libraries(replay_schema mla_coord m)
add_test(NAME schema_fuzz_replay COMMAND replay_schema ${MLA_TEST_DIR}/data/schema)

if(MLA_FUZZ)
  add_executable(fuzz_schema ${MLA_TEST_DIR}/fuzz/fuzz_schema.c ${CMAKE_SOURCE_DIR}/coordinator/api_constrain.c)
  target_compile_options(fuzz_schema PRIVATE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  target_link_options(fuzz_schema PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_schema mla_coord m)
  add_test(NAME fuzz_schema_smoke
           COMMAND ${MLA_TEST_DIR}/fuzz/run_fuzz.sh $<TARGET_FILE:fuzz_schema> runs=20000 ${MLA_TEST_DIR}/data/schema)
  set_tests_properties(fuzz_schema_smoke PROPERTIES ENVIRONMENT "FUZZ_ARTIFACTS=${CMAKE_CURRENT_BINARY_DIR}/fuzz-artifacts")
endif()

# bench/gram_mask.c: the time of one token mask over a synthetic vocabulary (docs/structured-output.md);
# run here on a small vocabulary only to check it runs (no timing asserted)
add_executable(gram_mask ${CMAKE_SOURCE_DIR}/bench/gram_mask.c)
target_link_libraries(gram_mask mla_coord m)
add_test(NAME gram_mask_runs COMMAND gram_mask 4096 2)
