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
# reasoning_content / tool_calls / template variables of the DeepSeek, GLM and Kimi dialects:
# a scripted model under the released templates, through the openai client
add_test(NAME serve_chat_dialects COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/serve/test_chat_dialects.py
                                          $<TARGET_FILE:fake_server> ${MLA_TEST_DIR}/data/chat)
set_tests_properties(serve_chat_dialects PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
# the Responses API (/v1/responses): the same dialect cases as output items, streamed and whole;
# input items, usage, refusals
add_test(NAME serve_responses COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/serve/test_responses.py
                                      $<TARGET_FILE:fake_server> ${MLA_TEST_DIR}/data/chat)
set_tests_properties(serve_responses PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
# Anthropic's Messages API (/v1/messages): the same dialect cases as content blocks, streamed and
# whole; tool loops, thinking, usage, refusals
add_test(NAME serve_messages COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/serve/test_messages.py
                                     $<TARGET_FILE:fake_server> ${MLA_TEST_DIR}/data/chat)
set_tests_properties(serve_messages PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
# tool calls held to the format (strict tools, tool_choice required / named) on a real engine:
# small synthetic DeepSeek-V3 and GLM-5 files served on the CPU backend
add_test(NAME serve_tool_strict
         COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/serve/test_tool_strict.py $<TARGET_FILE:mlaserve>
                 $<TARGET_FILE:mlaserve-worker> ${CMAKE_CURRENT_BINARY_DIR}/tool_strict_work)
set_tests_properties(serve_tool_strict PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)

# HTTP request parsing + API body parsing: corpus replay always, libFuzzer with -DMLA_FUZZ=ON.
add_executable(replay_http ${MLA_TEST_DIR}/fuzz/replay_main.c ${MLA_TEST_DIR}/fuzz/fuzz_http.c)
target_link_libraries(replay_http mla_coord)
add_test(NAME http_fuzz_replay COMMAND replay_http ${MLA_TEST_DIR}/data/http)
if(MLA_FUZZ)
  add_executable(fuzz_http ${MLA_TEST_DIR}/fuzz/fuzz_http.c ${CMAKE_SOURCE_DIR}/coordinator/http_req.c
                           ${CMAKE_SOURCE_DIR}/coordinator/api_params.c ${CMAKE_SOURCE_DIR}/coordinator/api_body.c)
  target_compile_options(fuzz_http PRIVATE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  target_link_options(fuzz_http PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_http mla_coord)
  add_test(NAME http_fuzz_smoke
           COMMAND ${MLA_TEST_DIR}/fuzz/run_fuzz.sh $<TARGET_FILE:fuzz_http> runs=300000 ${MLA_TEST_DIR}/data/http)
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
  # completions with echo: the prompt's logprobs against HF on both fixtures, TP 1 and 2
  foreach(case "tiny-deepseek3;2" "tiny-glm5;1")
    list(GET case 0 fx)
    list(GET case 1 tp)
    add_test(NAME serve_echo_${fx}_tp${tp}
             COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/serve/test_echo.py
                     $<TARGET_FILE:mlaserve_serve_test> $<TARGET_FILE:mlaserve-worker> ${MLA_FIXTURES} ${fx} ${tp})
    set_tests_properties(serve_echo_${fx}_tp${tp} PROPERTIES TIMEOUT 240 SKIP_RETURN_CODE 77)
  endforeach()
  # the cache pool under pressure (preemption, eviction, chunked prefill, the prefix cache):
  # 64 concurrent completions equal those of an unpressured server
  add_test(NAME serve_pool_pressure
           COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/serve/test_serve_pool.py
                   $<TARGET_FILE:mlaserve_serve_test> $<TARGET_FILE:mlaserve-worker> ${MLA_FIXTURES})
  set_tests_properties(serve_pool_pressure PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
endif()

# Hardening of the HTTP front (issue 36): big responses, key before body, body budget, idle
# connections, header timeout, trailing data, HEAD, HTTP/1.0 streaming, wrong keys, tokenizing
# off the loop thread.
add_test(NAME serve_harden COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/serve/test_harden.py $<TARGET_FILE:fake_server>)
set_tests_properties(serve_harden PROPERTIES TIMEOUT 240)

# Operational hardening on the real stack (issue 36): recovery from a coordinator stall, exit 1
# once restarts are given up, the private control socket, the key file, the message guard, the
# start-up warnings.
if(TARGET mlaserve-worker)
  add_test(NAME serve_ops
           COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/serve/test_serve_ops.py
                   $<TARGET_FILE:mlaserve_serve_test> $<TARGET_FILE:mlaserve-worker> ${MLA_FIXTURES})
  set_tests_properties(serve_ops PROPERTIES TIMEOUT 400 SKIP_RETURN_CODE 77)
  # a tokenizer longer than the model's vocabulary: warned, its extra ids refused per request
  add_test(NAME serve_vocab_past
           COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/serve/test_vocab_past.py
                   $<TARGET_FILE:mlaserve_serve_test> $<TARGET_FILE:mlaserve-worker> $<TARGET_FILE:mlaserve>
                   ${MLA_FIXTURES})
  set_tests_properties(serve_vocab_past PROPERTIES TIMEOUT 200 SKIP_RETURN_CODE 77)
endif()

# The HTTP connection layer and the streaming framing over a real loopback connection
# (tests/fuzz/fuzz_httpconn.c): corpus replay always, a deterministic libFuzzer run with
# -DMLA_FUZZ=ON.
add_executable(replay_httpconn ${MLA_TEST_DIR}/fuzz/replay_main.c ${MLA_TEST_DIR}/fuzz/fuzz_httpconn.c)
target_link_libraries(replay_httpconn mla_coord)
add_test(NAME httpconn_fuzz_replay COMMAND replay_httpconn ${MLA_TEST_DIR}/data/httpconn)
set_tests_properties(httpconn_fuzz_replay PROPERTIES TIMEOUT 120)
if(MLA_FUZZ)
  add_executable(fuzz_httpconn ${MLA_TEST_DIR}/fuzz/fuzz_httpconn.c ${CMAKE_SOURCE_DIR}/coordinator/http_server.c
                               ${CMAKE_SOURCE_DIR}/coordinator/http_req.c ${CMAKE_SOURCE_DIR}/coordinator/uvnet.c)
  target_compile_options(fuzz_httpconn PRIVATE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  target_link_options(fuzz_httpconn PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_httpconn mla_coord)
  add_test(NAME httpconn_fuzz_smoke
           COMMAND ${MLA_TEST_DIR}/fuzz/run_fuzz.sh $<TARGET_FILE:fuzz_httpconn> runs=1500 ${MLA_TEST_DIR}/data/httpconn)
  set_tests_properties(httpconn_fuzz_smoke PROPERTIES TIMEOUT 300
                       ENVIRONMENT "FUZZ_ARTIFACTS=${CMAKE_CURRENT_BINARY_DIR}/fuzz-artifacts")
endif()

# The scheduler's state machine under random submit / cancel / step / failure events over the
# fake backend (tests/fuzz/fuzz_sched.c): corpus replay always, a deterministic libFuzzer run
# with -DMLA_FUZZ=ON.
add_executable(replay_sched ${MLA_TEST_DIR}/fuzz/replay_main.c ${MLA_TEST_DIR}/fuzz/fuzz_sched.c)
target_include_directories(replay_sched PRIVATE ${MLA_TEST_DIR})
target_link_libraries(replay_sched mla_fake_backend)
add_test(NAME sched_fuzz_replay COMMAND replay_sched ${MLA_TEST_DIR}/data/sched)
if(MLA_FUZZ)
  add_executable(fuzz_sched ${MLA_TEST_DIR}/fuzz/fuzz_sched.c ${MLA_TEST_DIR}/serve/fake_backend.c
                            ${CMAKE_SOURCE_DIR}/coordinator/sched_batch.c)
  target_include_directories(fuzz_sched PRIVATE ${MLA_TEST_DIR})
  target_compile_options(fuzz_sched PRIVATE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  target_link_options(fuzz_sched PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_sched mla_coord)
  add_test(NAME sched_fuzz_smoke
           COMMAND ${MLA_TEST_DIR}/fuzz/run_fuzz.sh $<TARGET_FILE:fuzz_sched> runs=20000 ${MLA_TEST_DIR}/data/sched)
  set_tests_properties(sched_fuzz_smoke PROPERTIES TIMEOUT 300
                       ENVIRONMENT "FUZZ_ARTIFACTS=${CMAKE_CURRENT_BINARY_DIR}/fuzz-artifacts")
endif()

# Streaming response assembly (detokenized text, stop strings, UTF-8 over token boundaries,
# EOS, length, cancellation) through api_server_generate and the real scheduler
# (tests/fuzz/fuzz_stream.c): corpus replay always, a deterministic libFuzzer run with
# -DMLA_FUZZ=ON.
add_executable(replay_stream ${MLA_TEST_DIR}/fuzz/replay_main.c ${MLA_TEST_DIR}/fuzz/fuzz_stream.c)
target_link_libraries(replay_stream mla_coord)
add_test(NAME stream_fuzz_replay COMMAND replay_stream ${MLA_TEST_DIR}/data/stream)
if(MLA_FUZZ)
  add_executable(fuzz_stream ${MLA_TEST_DIR}/fuzz/fuzz_stream.c ${CMAKE_SOURCE_DIR}/coordinator/api_server.c
                             ${CMAKE_SOURCE_DIR}/coordinator/api_params.c ${CMAKE_SOURCE_DIR}/coordinator/api_body.c)
  target_compile_options(fuzz_stream PRIVATE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  target_link_options(fuzz_stream PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_stream mla_coord)
  add_test(NAME stream_fuzz_smoke
           COMMAND ${MLA_TEST_DIR}/fuzz/run_fuzz.sh $<TARGET_FILE:fuzz_stream> runs=10000 ${MLA_TEST_DIR}/data/stream)
  set_tests_properties(stream_fuzz_smoke PROPERTIES TIMEOUT 300
                       ENVIRONMENT "FUZZ_ARTIFACTS=${CMAKE_CURRENT_BINARY_DIR}/fuzz-artifacts")
endif()

# the chat output parsers (tests/fuzz/fuzz_chat_parse.c: reasoning_content and tool calls,
# streamed parses never taken back): corpus replay always, a deterministic libFuzzer run with
# -DMLA_FUZZ=ON
add_executable(replay_chat_parse ${MLA_TEST_DIR}/fuzz/replay_main.c ${MLA_TEST_DIR}/fuzz/fuzz_chat_parse.c)
target_link_libraries(replay_chat_parse mla_coord)
add_test(NAME chat_parse_fuzz_replay COMMAND replay_chat_parse ${MLA_TEST_DIR}/data/chat-parse)
if(MLA_FUZZ)
  add_executable(fuzz_chat_parse ${MLA_TEST_DIR}/fuzz/fuzz_chat_parse.c ${CMAKE_SOURCE_DIR}/coordinator/chat_reasoning.c
                                 ${CMAKE_SOURCE_DIR}/coordinator/chat_toolcall.c)
  target_compile_options(fuzz_chat_parse PRIVATE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  target_link_options(fuzz_chat_parse PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_chat_parse mla_coord)
  add_test(NAME chat_parse_fuzz_smoke
           COMMAND ${MLA_TEST_DIR}/fuzz/run_fuzz.sh $<TARGET_FILE:fuzz_chat_parse> runs=30000 ${MLA_TEST_DIR}/data/chat-parse)
  set_tests_properties(chat_parse_fuzz_smoke PROPERTIES TIMEOUT 300
                       ENVIRONMENT "FUZZ_ARTIFACTS=${CMAKE_CURRENT_BINARY_DIR}/fuzz-artifacts")
endif()
