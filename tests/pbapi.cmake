# The protobuf client API (proto/api.proto, coordinator/pbapi_*, common/apiclient.*,
# `mlaserve client`) and the serving acceptance tests on the real tiny-deepseek3 model.
#  - pbapi_fuzz_replay: the frame decoder's fuzz target over tests/pbapi/corpus (plain driver).
#  - pbapi_model: a real `mlaserve serve --tp 2` on the fixture: client command answers = HF
#    reference, tokenize, health, models, several requests per connection, each malformed frame
#    case, cancel, disconnect frees the request, API key.
#  - serve_accept: HTTP single requests = HF greedy, 64 concurrent streaming clients, /metrics sums.
#  - readme_api_examples: the docs/api.md "HTTP API" / "Protobuf API" sh blocks run as printed.
#  - with -DMLA_FUZZ=ON (clang): fuzz_pbframe (libFuzzer) and pbapi_fuzz_smoke (300000 inputs, -seed=1).
add_executable(replay_pbframe ${MLA_TEST_DIR}/fuzz/replay_main.c ${MLA_TEST_DIR}/fuzz/fuzz_pbframe.c)
target_link_libraries(replay_pbframe mla_coord)
add_test(NAME pbapi_fuzz_replay COMMAND replay_pbframe ${MLA_TEST_DIR}/pbapi/corpus)

if(TARGET mlaserve-worker AND TARGET mlaserve)
  add_test(NAME pbapi_model
           COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/pbapi/test_pbapi.py
                   $<TARGET_FILE:mlaserve> $<TARGET_FILE:mlaserve-worker> ${MLA_FIXTURES})
  add_test(NAME serve_accept
           COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/pbapi/serve_accept.py
                   $<TARGET_FILE:mlaserve> $<TARGET_FILE:mlaserve-worker> ${MLA_FIXTURES})
  add_test(NAME readme_api_examples
           COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/pbapi/readme_examples.py ${CMAKE_SOURCE_DIR}/docs/api.md
                   ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR}/models ${MLA_FIXTURES})
  # the port's limits: idle and frame timeouts, small frames before the key (issue 36)
  add_test(NAME pbapi_limits
           COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/pbapi/test_pb_limits.py
                   $<TARGET_FILE:mlaserve> $<TARGET_FILE:mlaserve-worker> ${MLA_FIXTURES})
  set_tests_properties(pbapi_model serve_accept readme_api_examples pbapi_limits PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77
                       ENVIRONMENT "PYTHONDONTWRITEBYTECODE=1")
  # readme_api_examples may use the fixed ports 8080/8081 (the README's); keep it alone
  set_tests_properties(readme_api_examples PROPERTIES RESOURCE_LOCK readme_ports)
endif()

if(MLA_FUZZ)
  add_executable(fuzz_pbframe ${MLA_TEST_DIR}/fuzz/fuzz_pbframe.c ${CMAKE_SOURCE_DIR}/coordinator/pbapi_frame.c
                              ${CMAKE_SOURCE_DIR}/coordinator/api_params.c ${CMAKE_SOURCE_DIR}/common/apiclient.c)
  target_compile_options(fuzz_pbframe PRIVATE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  target_link_options(fuzz_pbframe PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_pbframe mla_coord)
  add_test(NAME pbapi_fuzz_smoke
           COMMAND ${MLA_TEST_DIR}/fuzz/run_fuzz.sh $<TARGET_FILE:fuzz_pbframe> runs=300000 ${MLA_TEST_DIR}/pbapi/corpus)
  set_tests_properties(pbapi_fuzz_smoke PROPERTIES
                       ENVIRONMENT "FUZZ_ARTIFACTS=${CMAKE_CURRENT_BINARY_DIR}/fuzz-artifacts")
endif()
