# Serving front: scheduler, HTTP server, OpenAI API (tests only code lives in tests/serve).
add_library(mla_fake_backend STATIC ${MLA_TEST_DIR}/serve/fake_backend.c)
target_include_directories(mla_fake_backend PUBLIC ${MLA_TEST_DIR})
target_link_libraries(mla_fake_backend PUBLIC mla_coord)

add_executable(test_sched ${MLA_TEST_DIR}/unit/test_sched.c)
target_include_directories(test_sched PRIVATE ${MLA_TEST_DIR}/unit ${MLA_TEST_DIR})
target_link_libraries(test_sched mla_fake_backend)
add_test(NAME sched COMMAND test_sched)
set_tests_properties(sched PROPERTIES TIMEOUT 120)
# The same tests over a scheduler whose prefix-cache hash keeps 2 bits: nearly every lookup
# meets blocks with its hash but another key, which only an exact key comparison tells apart.
add_executable(test_sched_collide ${MLA_TEST_DIR}/unit/test_sched.c ${CMAKE_SOURCE_DIR}/coordinator/sched_batch.c)
target_compile_definitions(test_sched_collide PRIVATE SCHED_PREFIX_HASH_MASK=3)
target_include_directories(test_sched_collide PRIVATE ${MLA_TEST_DIR}/unit ${MLA_TEST_DIR})
target_link_libraries(test_sched_collide mla_fake_backend)
add_test(NAME sched_collide COMMAND test_sched_collide)
set_tests_properties(sched_collide PROPERTIES TIMEOUT 120)

add_executable(fake_server ${MLA_TEST_DIR}/serve/fake_server_main.c)
target_link_libraries(fake_server mla_fake_backend)
add_test(NAME serve_http COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/serve/test_http.py $<TARGET_FILE:fake_server>)
set_tests_properties(serve_http PROPERTIES TIMEOUT 180)
add_test(NAME serve_openai COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/serve/test_openai.py $<TARGET_FILE:fake_server>)
set_tests_properties(serve_openai PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)

# HTTP request parsing + API body parsing: corpus replay always, libFuzzer with -DMLA_FUZZ=ON.
add_executable(replay_http ${MLA_TEST_DIR}/fuzz/replay_main.c ${MLA_TEST_DIR}/fuzz/fuzz_http.c)
target_link_libraries(replay_http mla_coord)
add_test(NAME http_fuzz_replay COMMAND replay_http ${MLA_TEST_DIR}/data/http)
if(MLA_FUZZ)
  add_executable(fuzz_http ${MLA_TEST_DIR}/fuzz/fuzz_http.c ${CMAKE_SOURCE_DIR}/coordinator/http_req.c
                           ${CMAKE_SOURCE_DIR}/coordinator/api_params.c)
  target_compile_options(fuzz_http PRIVATE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  target_link_options(fuzz_http PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_http mla_coord)
  add_test(NAME http_fuzz_smoke
           COMMAND ${MLA_TEST_DIR}/fuzz/run_fuzz.sh $<TARGET_FILE:fuzz_http> 20 ${MLA_TEST_DIR}/data/http)
  set_tests_properties(http_fuzz_smoke PROPERTIES
                       ENVIRONMENT "FUZZ_ARTIFACTS=${CMAKE_CURRENT_BINARY_DIR}/fuzz-artifacts")
endif()

# The real stack (tokenizer, chat template, coordinator, CPU workers) behind the HTTP API on the
# tiny fixtures: known answers from the fixtures' HF reference (ref.json), tp 1 and 2.
add_executable(mlaserve_serve_test ${MLA_TEST_DIR}/serve/serve_main.c)
target_link_libraries(mlaserve_serve_test mla_coord)
if(TARGET mlaserve-worker)
  foreach(tp 1 2)
    add_test(NAME serve_model_tp${tp}
             COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/serve/test_serve_model.py
                     $<TARGET_FILE:mlaserve_serve_test> $<TARGET_FILE:mlaserve-worker> ${MLA_FIXTURES} ${tp})
    set_tests_properties(serve_model_tp${tp} PROPERTIES TIMEOUT 240 SKIP_RETURN_CODE 77)
  endforeach()
  # the cache pool under pressure (preemption, eviction, chunked prefill, the prefix cache):
  # 64 concurrent completions equal those of an unpressured server
  add_test(NAME serve_pool_pressure
           COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/serve/test_serve_pool.py
                   $<TARGET_FILE:mlaserve_serve_test> $<TARGET_FILE:mlaserve-worker> ${MLA_FIXTURES})
  set_tests_properties(serve_pool_pressure PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
endif()
