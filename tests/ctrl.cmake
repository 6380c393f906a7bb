# Control plane: host collective, wire format, sampler, coordinator + worker processes.
mla_unit_test(coll_host mla_common rt)
mla_unit_test(sig_clean mla_common rt)
set_tests_properties(coll_host PROPERTIES TIMEOUT 120)

mla_unit_test(wire mla_wire m)

# wire fuzz target: replayed over a generated seed corpus in every build (tests/fuzz/replay_main.c),
# and run by libFuzzer with -DMLA_FUZZ=ON (clang)
set(WIRE_CORPUS ${CMAKE_CURRENT_BINARY_DIR}/wire_corpus)
add_executable(make_wire_corpus ${MLA_TEST_DIR}/ctrl/make_wire_corpus.c)
target_link_libraries(make_wire_corpus mla_wire)
add_executable(replay_wire ${MLA_TEST_DIR}/fuzz/replay_main.c ${MLA_TEST_DIR}/fuzz/fuzz_wire.c)
target_link_libraries(replay_wire mla_wire)
add_test(NAME wire_make_corpus COMMAND make_wire_corpus ${WIRE_CORPUS})
set_tests_properties(wire_make_corpus PROPERTIES FIXTURES_SETUP wire_gen)
add_test(NAME wire_fuzz_replay COMMAND replay_wire ${WIRE_CORPUS})
set_tests_properties(wire_fuzz_replay PROPERTIES FIXTURES_REQUIRED wire_gen)

if(MLA_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "MLA_FUZZ=ON needs clang (configure with CC=clang)")
  endif()
  # wire.c is compiled into the target so that it carries the fuzzer's coverage instrumentation
  add_executable(fuzz_wire ${MLA_TEST_DIR}/fuzz/fuzz_wire.c ${CMAKE_SOURCE_DIR}/proto/wire.c)
  target_include_directories(fuzz_wire PRIVATE ${CMAKE_SOURCE_DIR}/proto ${CMAKE_SOURCE_DIR}/common)
  target_compile_options(fuzz_wire PRIVATE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  target_link_options(fuzz_wire PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_wire mla_proto mla_common m)
  add_test(NAME wire_fuzz_smoke
           COMMAND ${MLA_TEST_DIR}/fuzz/run_fuzz.sh $<TARGET_FILE:fuzz_wire> runs=1000000 ${WIRE_CORPUS})
  set_tests_properties(wire_fuzz_smoke PROPERTIES FIXTURES_REQUIRED wire_gen
                       ENVIRONMENT "FUZZ_ARTIFACTS=${CMAKE_CURRENT_BINARY_DIR}/fuzz-artifacts")
endif()

mla_unit_test(fdlink mla_common)

mla_unit_test(zspin mla_wire Threads::Threads)

mla_unit_test(sample mla_worker m)

# the constrained rows' masks computed on threads equal those computed in line
mla_unit_test(wk_constrain mla_worker)

mla_unit_test(wk_ahead mla_worker)

mla_unit_test(wk_sample mla_worker)
# bench/sample_host.c: the time of one host-sampled row for the settings clients send (docs/PERF.md);
# the test only checks that it runs
add_executable(sample_host ${CMAKE_SOURCE_DIR}/bench/sample_host.c)
target_include_directories(sample_host PRIVATE ${CMAKE_SOURCE_DIR})
target_link_libraries(sample_host mla_worker m)
add_test(NAME sample_host_runs COMMAND sample_host 4096 2)

# the worker runtime with the tiny deterministic test engine (tests only)
add_library(mla_test_engine STATIC ${MLA_TEST_DIR}/ctrl/test_engine.c)
target_include_directories(mla_test_engine PUBLIC ${MLA_TEST_DIR}/ctrl)
target_link_libraries(mla_test_engine PUBLIC mla_worker)
add_executable(mla-test-worker ${MLA_TEST_DIR}/ctrl/test_worker_main.c)
target_link_libraries(mla-test-worker mla_test_engine)

# /metrics' worker series (coordinator/api_metrics.c)
mla_unit_test(api_metrics mla_coord m)
# cache diagnostics' fingerprints (coordinator/api_fprint.c)
mla_unit_test(api_fprint mla_coord m)
# the Messages API's tool search and the billing line, as the translated text (coordinator/api_messages.c)
mla_unit_test(api_messages mla_coord m)
# the UTF-8 of generated text and its offsets (coordinator/api_params.c)
mla_unit_test(api_text mla_coord m)

add_executable(test_coord ${MLA_TEST_DIR}/unit/test_coord.c)
target_include_directories(test_coord PRIVATE ${MLA_TEST_DIR}/unit)
target_link_libraries(test_coord mla_coord mla_test_engine mla_worker m)
foreach(part group refuse kill orphan load ncclid ahead grammar)
  add_test(NAME coord_${part} COMMAND test_coord $<TARGET_FILE:mla-test-worker> ${part})
  set_tests_properties(coord_${part} PROPERTIES TIMEOUT 180)
endforeach()
# the local workers' links off: every frame on ZeroMQ, as with workers on other hosts
foreach(part group kill)
  add_test(NAME coord_${part}_zmq_only COMMAND test_coord $<TARGET_FILE:mla-test-worker> ${part})
  set_tests_properties(coord_${part}_zmq_only PROPERTIES TIMEOUT 180 ENVIRONMENT "MLA_LOCAL_LINK=0")
endforeach()

# the real model through coordinator + mlaserve-worker processes vs the single-process forward
if(TARGET mlaserve-worker)
  add_executable(test_coord_model ${MLA_TEST_DIR}/unit/test_coord_model.c)
  target_include_directories(test_coord_model PRIVATE ${MLA_TEST_DIR}/unit ${MLA_TEST_DIR}/ctrl)
  target_link_libraries(test_coord_model mla_coord m)
  foreach(fx tiny-deepseek3/tiny-deepseek3-bf16 tiny-glm5/tiny-glm5-q8_0)
    get_filename_component(fxn ${fx} NAME)
    add_test(NAME coord_model_${fxn}
             COMMAND test_coord_model $<TARGET_FILE:mlaserve-worker> ${MLA_FIXTURES}/${fx}.gguf)
    set_tests_properties(coord_model_${fxn} PROPERTIES TIMEOUT 300)
  endforeach()
endif()

add_test(NAME ctrl_cli_tp COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/ctrl/cli_tp.py
         $<TARGET_FILE:mlaserve> ${MLA_FIXTURES})
# a generous heartbeat timeout: sanitizer builds on 2 busy cores
set_tests_properties(ctrl_cli_tp PROPERTIES TIMEOUT 300)
add_test(NAME ctrl_cli_signals COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/ctrl/cli_signals.py
         $<TARGET_FILE:mlaserve> ${MLA_FIXTURES})
set_tests_properties(ctrl_cli_signals PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)

# not a test: per-step control-plane overhead (numbers in docs/ctrl.md)
add_executable(bench_ctrl ${MLA_TEST_DIR}/ctrl/bench_ctrl.c)
target_link_libraries(bench_ctrl mla_coord mla_test_engine)

# the option parser every command uses (common/opts.h)
mla_unit_test(opts mla_common m)
