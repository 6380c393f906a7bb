# The gRPC API (proto/api.proto, coordinator/grpc_*, common/apiclient.*, `mlaserve client`,
# docs/grpc.md) and the serving acceptance tests on the real tiny-deepseek3 model.
#  - grpc_fuzz_replay: the connection layer's fuzz target over tests/pbapi/corpus (plain driver).
#  - grpc_api: a real `mlaserve serve --tp 2` on the fixture against grpcio (a Python client
#    generated from proto/api.proto with grpcio-tools) and `mlaserve client`: every method =
#    HF reference, streaming, cancel mid-stream, deadlines, 64 concurrent streams on one channel
#    = the same requests made singly, a bad field failing only its call, wrong key, garbage on
#    the port, grpc.health.v1, TLS with a self-signed certificate.
#  - serve_accept: HTTP single requests = HF greedy, 64 concurrent streaming clients, /metrics sums.
#  - readme_api_examples: the docs/api.md "HTTP API" / "gRPC API" sh blocks run as printed.
#  - with -DMLA_FUZZ=ON (clang): fuzz_grpc (libFuzzer) and grpc_fuzz_smoke (200000 inputs, -seed=1).
add_executable(replay_grpc ${MLA_TEST_DIR}/fuzz/replay_main.c ${MLA_TEST_DIR}/fuzz/fuzz_grpc.c)
target_link_libraries(replay_grpc mla_coord)
add_test(NAME grpc_fuzz_replay COMMAND replay_grpc ${MLA_TEST_DIR}/pbapi/corpus)

if(TARGET mlaserve-worker AND TARGET mlaserve)
  add_test(NAME grpc_api
           COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/pbapi/test_grpc.py
                   $<TARGET_FILE:mlaserve> $<TARGET_FILE:mlaserve-worker> ${MLA_FIXTURES} ${CMAKE_SOURCE_DIR}/proto)
  add_test(NAME serve_accept
           COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/pbapi/serve_accept.py
                   $<TARGET_FILE:mlaserve> $<TARGET_FILE:mlaserve-worker> ${MLA_FIXTURES})
  add_test(NAME readme_api_examples
           COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/pbapi/readme_examples.py ${CMAKE_SOURCE_DIR}/docs/api.md
                   ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR}/models ${MLA_FIXTURES})
  set_tests_properties(grpc_api serve_accept readme_api_examples PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77
                       ENVIRONMENT "PYTHONDONTWRITEBYTECODE=1")
  # readme_api_examples may use the fixed ports 8080/8081 (the README's); keep it alone
  set_tests_properties(readme_api_examples PROPERTIES RESOURCE_LOCK readme_ports)
endif()

if(MLA_FUZZ)
  add_executable(fuzz_grpc ${MLA_TEST_DIR}/fuzz/fuzz_grpc.c ${CMAKE_SOURCE_DIR}/coordinator/grpc_conn.c
                           ${CMAKE_SOURCE_DIR}/coordinator/grpc_msg.c ${CMAKE_SOURCE_DIR}/coordinator/api_params.c)
  target_compile_options(fuzz_grpc PRIVATE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  target_link_options(fuzz_grpc PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_grpc mla_coord)
  add_test(NAME grpc_fuzz_smoke
           COMMAND ${MLA_TEST_DIR}/fuzz/run_fuzz.sh $<TARGET_FILE:fuzz_grpc> runs=200000 ${MLA_TEST_DIR}/pbapi/corpus)
  set_tests_properties(grpc_fuzz_smoke PROPERTIES
                       ENVIRONMENT "FUZZ_ARTIFACTS=${CMAKE_CURRENT_BINARY_DIR}/fuzz-artifacts")
endif()

# the HTTP/2 layer and request decoding in memory, against an nghttp2 client
mla_unit_test(grpc_conn mla_coord)
