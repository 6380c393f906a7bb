# Control plane: host collective, wire format, sampler, coordinator + worker processes.
add_executable(test_coll_host ${MLA_TEST_DIR}/unit/test_coll_host.c)
target_include_directories(test_coll_host PRIVATE ${MLA_TEST_DIR}/unit)
target_link_libraries(test_coll_host mla_common rt)
add_test(NAME coll_host COMMAND test_coll_host)
add_executable(test_sig_clean ${MLA_TEST_DIR}/unit/test_sig_clean.c)
target_include_directories(test_sig_clean PRIVATE ${MLA_TEST_DIR}/unit)
target_link_libraries(test_sig_clean mla_common rt)
add_test(NAME sig_clean COMMAND test_sig_clean)
set_tests_properties(coll_host PROPERTIES TIMEOUT 120)

add_executable(test_wire ${MLA_TEST_DIR}/unit/test_wire.c)
target_include_directories(test_wire PRIVATE ${MLA_TEST_DIR}/unit)
target_link_libraries(test_wire mla_wire m)
add_test(NAME wire COMMAND test_wire)

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

add_executable(test_fdlink ${MLA_TEST_DIR}/unit/test_fdlink.c)
target_include_directories(test_fdlink PRIVATE ${MLA_TEST_DIR}/unit)
target_link_libraries(test_fdlink mla_common)
add_test(NAME fdlink COMMAND test_fdlink)

add_executable(test_zspin ${MLA_TEST_DIR}/unit/test_zspin.c)
target_include_directories(test_zspin PRIVATE ${MLA_TEST_DIR}/unit)
target_link_libraries(test_zspin mla_wire Threads::Threads)
add_test(NAME zspin COMMAND test_zspin)

add_executable(test_sample ${MLA_TEST_DIR}/unit/test_sample.c)
target_include_directories(test_sample PRIVATE ${MLA_TEST_DIR}/unit)
target_link_libraries(test_sample mla_worker m)
add_test(NAME sample COMMAND test_sample)

# the constrained rows' masks computed on threads equal those computed in line
add_executable(test_wk_constrain ${MLA_TEST_DIR}/unit/test_wk_constrain.c)
target_include_directories(test_wk_constrain PRIVATE ${MLA_TEST_DIR}/unit)
target_link_libraries(test_wk_constrain mla_worker)
add_test(NAME wk_constrain COMMAND test_wk_constrain)

add_executable(test_wk_ahead ${MLA_TEST_DIR}/unit/test_wk_ahead.c)
target_include_directories(test_wk_ahead PRIVATE ${MLA_TEST_DIR}/unit)
target_link_libraries(test_wk_ahead mla_worker)
add_test(NAME wk_ahead COMMAND test_wk_ahead)

add_executable(test_wk_sample ${MLA_TEST_DIR}/unit/test_wk_sample.c)
target_include_directories(test_wk_sample PRIVATE ${MLA_TEST_DIR}/unit)
target_link_libraries(test_wk_sample mla_worker)
add_test(NAME wk_sample COMMAND test_wk_sample)
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
add_executable(test_api_metrics ${MLA_TEST_DIR}/unit/test_api_metrics.c)
target_include_directories(test_api_metrics PRIVATE ${MLA_TEST_DIR}/unit)
target_link_libraries(test_api_metrics mla_coord m)
add_test(NAME api_metrics COMMAND test_api_metrics)
# cache diagnostics' fingerprints (coordinator/api_fprint.c)
add_executable(test_api_fprint ${MLA_TEST_DIR}/unit/test_api_fprint.c)
target_include_directories(test_api_fprint PRIVATE ${MLA_TEST_DIR}/unit)
target_link_libraries(test_api_fprint mla_coord m)
add_test(NAME api_fprint COMMAND test_api_fprint)
# the Messages API's tool search and the billing line, as the translated text (coordinator/api_messages.c)
add_executable(test_api_messages ${MLA_TEST_DIR}/unit/test_api_messages.c)
target_include_directories(test_api_messages PRIVATE ${MLA_TEST_DIR}/unit)
target_link_libraries(test_api_messages mla_coord m)
add_test(NAME api_messages COMMAND test_api_messages)
# the UTF-8 of generated text and its offsets (coordinator/api_params.c)
add_executable(test_api_text ${MLA_TEST_DIR}/unit/test_api_text.c)
target_include_directories(test_api_text PRIVATE ${MLA_TEST_DIR}/unit)
target_link_libraries(test_api_text mla_coord m)
add_test(NAME api_text COMMAND test_api_text)

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
add_executable(test_opts ${MLA_TEST_DIR}/unit/test_opts.c)
target_include_directories(test_opts PRIVATE ${MLA_TEST_DIR}/unit)
target_link_libraries(test_opts mla_common m)
add_test(NAME opts COMMAND test_opts)
