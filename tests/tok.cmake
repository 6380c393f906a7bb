# Tokenizer and chat-template tests (coordinator/tok_*, coordinator/chat_*).
# The tests build the tokenizer sources into their own small library, so that they do not depend
# on the rest of mla_coord (and its dependencies) building.
pkg_check_modules(TOKT_PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(TOKT_CJSON REQUIRED IMPORTED_TARGET libcjson)
file(GLOB tokt_srcs CONFIGURE_DEPENDS
  ${CMAKE_SOURCE_DIR}/coordinator/tok_*.c ${CMAKE_SOURCE_DIR}/coordinator/chat_*.c)
set(tokt_have_gguf OFF)
if(EXISTS ${CMAKE_SOURCE_DIR}/common/gguf.c)
  set(tokt_have_gguf ON)
else()
  list(FILTER tokt_srcs EXCLUDE REGEX "tok_gguf\\.c$")
endif()
add_library(mla_tok_test STATIC ${tokt_srcs})
target_include_directories(mla_tok_test PUBLIC ${CMAKE_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/coordinator ${CMAKE_SOURCE_DIR}/tests)
target_link_libraries(mla_tok_test PUBLIC mla_common PkgConfig::TOKT_PCRE2 PkgConfig::TOKT_CJSON)
if(tokt_have_gguf)
  target_compile_definitions(mla_tok_test PUBLIC MLA_TOK_HAVE_GGUF=1)
endif()

set(tokt_dir ${CMAKE_BINARY_DIR}/tests/tok)
file(MAKE_DIRECTORY ${tokt_dir})

add_executable(test_tok ${MLA_TEST_DIR}/unit/test_tok.c)
target_link_libraries(test_tok mla_tok_test)
add_executable(test_chat ${MLA_TEST_DIR}/unit/test_chat.c)
target_link_libraries(test_chat mla_tok_test)

foreach(fx deepseek3 glm5)
  set(fxdir ${MLA_FIXTURES}/tiny-${fx})
  set(gguf ${fxdir}/tiny-${fx}-bf16.gguf)
  # the vocabulary as gguf-py reads it (independent of our GGUF reader)
  add_test(NAME tok_dump_${fx}
    COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/tok/dump_vocab.py ${gguf} ${tokt_dir}/vocab-${fx}.json)
  set_tests_properties(tok_dump_${fx} PROPERTIES FIXTURES_SETUP tokvocab_${fx})
  add_test(NAME tok_${fx} COMMAND test_tok ${tokt_dir}/vocab-${fx}.json ${fxdir}/ref.json ${gguf})
  set_tests_properties(tok_${fx} PROPERTIES FIXTURES_REQUIRED tokvocab_${fx})
  # random texts against HF tokenizers on the fixture's tokenizer.json (skipped without it)
  add_test(NAME tok_hf_${fx}
    COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/tok/hf_compare.py $<TARGET_FILE:test_tok>
            ${tokt_dir}/vocab-${fx}.json ${fxdir}/tokenizer.json)
  set_tests_properties(tok_hf_${fx} PROPERTIES FIXTURES_REQUIRED tokvocab_${fx} SKIP_RETURN_CODE 77)
  add_test(NAME chat_${fx} COMMAND test_chat ${tokt_dir}/vocab-${fx}.json ${fxdir}/ref.json ${MLA_TEST_DIR}/data/chat ${gguf})
  set_tests_properties(chat_${fx} PROPERTIES FIXTURES_REQUIRED tokvocab_${fx})
endforeach()
# the pre-tokenizers of DeepSeek-V2 / V2-Lite (deepseek-llm) and Kimi-K2 (kimi-k2), each model's own
# form in HF tokenizers against ours, over the deepseek3 fixture's vocabulary and merges
foreach(pre deepseek-llm kimi-k2)
  add_test(NAME tok_hf_pre_${pre}
    COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/tok/hf_compare.py $<TARGET_FILE:test_tok>
            ${tokt_dir}/vocab-deepseek3.json ${MLA_FIXTURES}/tiny-deepseek3/tokenizer.json --pre ${pre})
  set_tests_properties(tok_hf_pre_${pre} PROPERTIES FIXTURES_REQUIRED tokvocab_deepseek3 SKIP_RETURN_CODE 77)
endforeach()

# the released templates against jinja2 as an independent renderer (skipped without jinja2)
add_test(NAME chat_jinja2_ref
  COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/tok/jinja_compare.py $<TARGET_FILE:test_chat> ${MLA_TEST_DIR}/data/chat)
set_tests_properties(chat_jinja2_ref PROPERTIES SKIP_RETURN_CODE 77)

if(MLA_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "MLA_FUZZ=ON needs clang (CC=clang)")
  endif()
  # the sources are compiled into each target so that they carry the fuzzer's coverage
  set(tokt_fuzz_srcs ${tokt_srcs})
  list(FILTER tokt_fuzz_srcs EXCLUDE REGEX "tok_gguf\\.c$")
  foreach(fz fuzz_tok fuzz_chat)
    add_executable(${fz} ${MLA_TEST_DIR}/fuzz/${fz}.c ${tokt_fuzz_srcs})
    target_include_directories(${fz} PRIVATE ${CMAKE_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/coordinator)
    target_compile_options(${fz} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_options(${fz} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_libraries(${fz} mla_common PkgConfig::TOKT_PCRE2 PkgConfig::TOKT_CJSON m)
  endforeach()
  add_test(NAME fuzz_tok_smoke COMMAND fuzz_tok -runs=30000 -max_len=2048 -seed=1)
  # seeded with the released templates (tests/data/chat) and the chat-fuzz corpus, in a scratch
  # corpus (run_fuzz.sh): unseeded it missed what real templates reach in seconds
  add_test(NAME fuzz_chat_smoke
           COMMAND ${MLA_TEST_DIR}/fuzz/run_fuzz.sh $<TARGET_FILE:fuzz_chat> runs=20000 ${MLA_TEST_DIR}/data/chat
                   ${MLA_TEST_DIR}/data/chat-fuzz)
  set_tests_properties(fuzz_chat_smoke PROPERTIES ENVIRONMENT "FUZZ_ARTIFACTS=${CMAKE_CURRENT_BINARY_DIR}/fuzz-artifacts")
endif()

# chat messages cannot forge control tokens: the fixtures' own tokenizers and templates
if(tokt_have_gguf)
  add_executable(test_chat_guard ${MLA_TEST_DIR}/unit/test_chat_guard.c)
  target_link_libraries(test_chat_guard mla_tok_test)
  add_test(NAME chat_guard COMMAND test_chat_guard ${MLA_FIXTURES}/tiny-deepseek3/tiny-deepseek3-bf16.gguf
                                   ${MLA_FIXTURES}/tiny-glm5/tiny-glm5-bf16.gguf)
endif()

# chat templates over varied conversations and the message guard, seeded with the released
# DeepSeek, Kimi and GLM templates (tests/data/chat-fuzz): corpus replay always (leak checks
# under -DMLA_SANITIZE=ON), a deterministic libFuzzer run with -DMLA_FUZZ=ON
add_executable(replay_chat_msgs ${MLA_TEST_DIR}/fuzz/replay_main.c ${MLA_TEST_DIR}/fuzz/fuzz_chat_msgs.c)
target_link_libraries(replay_chat_msgs mla_tok_test)
add_test(NAME chat_msgs_replay COMMAND replay_chat_msgs ${MLA_TEST_DIR}/data/chat-fuzz)
if(MLA_FUZZ)
  add_executable(fuzz_chat_msgs ${MLA_TEST_DIR}/fuzz/fuzz_chat_msgs.c ${tokt_fuzz_srcs})
  target_include_directories(fuzz_chat_msgs PRIVATE ${CMAKE_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/coordinator)
  target_compile_options(fuzz_chat_msgs PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_chat_msgs PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_chat_msgs mla_common PkgConfig::TOKT_PCRE2 PkgConfig::TOKT_CJSON m)
  add_test(NAME chat_msgs_fuzz_smoke
           COMMAND ${MLA_TEST_DIR}/fuzz/run_fuzz.sh $<TARGET_FILE:fuzz_chat_msgs> runs=30000 ${MLA_TEST_DIR}/data/chat-fuzz)
  set_tests_properties(chat_msgs_fuzz_smoke PROPERTIES
                       ENVIRONMENT "FUZZ_ARTIFACTS=${CMAKE_CURRENT_BINARY_DIR}/fuzz-artifacts")
endif()
