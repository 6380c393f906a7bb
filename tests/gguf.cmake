# Tests of the GGUF reader (common/gguf.c).
#  - gguf_make_corpus / gguf_make_split (setup): generate broken + valid edge files and a
#    3-part split of a fixture into the build folder.
#  - test_gguf: broken corpus (each file fails with its own message), getters, fixtures,
#    split == unsplit, opening touches no tensor data.
#  - gguf_dump_*: our reader's canonical dump equals gguf-py's (fixtures, edge files, parts).
#  - gguf_fuzz_replay: the fuzz target over the seed/regression corpus (plain driver).
#  - with -DMLA_FUZZ=ON (clang): fuzz_gguf (libFuzzer) and gguf_fuzz_smoke (500000 inputs, -seed=1).
set(GGUF_CORPUS ${CMAKE_CURRENT_BINARY_DIR}/gguf_corpus)
set(GGUF_SPLIT ${CMAKE_CURRENT_BINARY_DIR}/gguf_split)
set(GGUF_SPLIT_SRC ${MLA_FIXTURES}/tiny-deepseek3/tiny-deepseek3-q4_k_m.gguf)

add_executable(test_gguf ${MLA_TEST_DIR}/unit/test_gguf.c)
target_include_directories(test_gguf PRIVATE ${MLA_TEST_DIR}/unit)
target_link_libraries(test_gguf mla_common)
add_executable(test_gguf_dump ${MLA_TEST_DIR}/unit/test_gguf_dump.c)
target_link_libraries(test_gguf_dump mla_common)
add_executable(replay_gguf ${MLA_TEST_DIR}/fuzz/replay_main.c ${MLA_TEST_DIR}/fuzz/fuzz_gguf.c)
target_link_libraries(replay_gguf mla_common)

add_test(NAME gguf_make_corpus
         COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/gguf/make_broken.py ${GGUF_CORPUS})
add_test(NAME gguf_make_split
         COMMAND sh -c "rm -rf '${GGUF_SPLIT}' && '${Python3_EXECUTABLE}' '${MLA_TEST_DIR}/gguf/make_split.py' '${GGUF_SPLIT_SRC}' '${GGUF_SPLIT}' ds 3 && '${Python3_EXECUTABLE}' '${MLA_TEST_DIR}/gguf/make_split.py' '${GGUF_SPLIT_SRC}' '${GGUF_SPLIT}' dse 3 --first-empty")
set_tests_properties(gguf_make_corpus gguf_make_split PROPERTIES FIXTURES_SETUP gguf_gen)

add_test(NAME test_gguf COMMAND test_gguf ${MLA_FIXTURES} ${GGUF_CORPUS} ${GGUF_SPLIT})
set_tests_properties(test_gguf PROPERTIES FIXTURES_REQUIRED gguf_gen)

file(GLOB gguf_fixture_files ${MLA_FIXTURES}/tiny-*/*.gguf)
if(NOT gguf_fixture_files)
  message(WARNING "gguf tests: no fixture files under ${MLA_FIXTURES}")
endif()
foreach(f ${gguf_fixture_files})
  get_filename_component(n ${f} NAME_WE)
  add_test(NAME gguf_dump_${n}
           COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/gguf/compare_dump.py $<TARGET_FILE:test_gguf_dump> ${f})
endforeach()
add_test(NAME gguf_dump_edge_files
         COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/gguf/compare_dump.py $<TARGET_FILE:test_gguf_dump>
                 --manifest ${GGUF_CORPUS}/manifest.tsv)
add_test(NAME gguf_dump_split_parts
         COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/gguf/compare_dump.py $<TARGET_FILE:test_gguf_dump>
                 --memory-only --glob ${GGUF_SPLIT})
set_tests_properties(gguf_dump_edge_files gguf_dump_split_parts PROPERTIES FIXTURES_REQUIRED gguf_gen)

add_test(NAME gguf_fuzz_replay COMMAND replay_gguf ${GGUF_CORPUS} ${MLA_TEST_DIR}/data/gguf)
set_tests_properties(gguf_fuzz_replay PROPERTIES FIXTURES_REQUIRED gguf_gen)

if(MLA_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "MLA_FUZZ=ON needs clang (configure with CC=clang)")
  endif()
  # The reader is compiled into the target with fuzzer instrumentation; the rest of
  # mla_common comes from the library (its gguf.o is not pulled in: the symbols are defined).
  add_executable(fuzz_gguf ${MLA_TEST_DIR}/fuzz/fuzz_gguf.c ${CMAKE_SOURCE_DIR}/common/gguf.c
                           ${CMAKE_SOURCE_DIR}/common/ggml_types.c)
  target_compile_options(fuzz_gguf PRIVATE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  target_link_options(fuzz_gguf PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_gguf mla_common)
  add_test(NAME gguf_fuzz_smoke
           COMMAND ${MLA_TEST_DIR}/fuzz/run_fuzz.sh $<TARGET_FILE:fuzz_gguf> runs=500000 ${GGUF_CORPUS} ${MLA_TEST_DIR}/data/gguf)
  set_tests_properties(gguf_fuzz_smoke PROPERTIES FIXTURES_REQUIRED gguf_gen
                       ENVIRONMENT "FUZZ_ARTIFACTS=${CMAKE_CURRENT_BINARY_DIR}/fuzz-artifacts")
endif()
