# `mlaserve bench` (coordinator/cmd_bench.c), the Bench frames (proto/wire.c, worker/wk_step.c) and the
# CPU engine's bench hooks (worker/engine_cpu.c). No timing is asserted anywhere.
if(TARGET mlaserve-worker)
  add_test(NAME bench_cli
           COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/bench/test_bench.py $<TARGET_FILE:mlaserve>
                   ${CMAKE_SOURCE_DIR}/models/tiny-deepseek3-bf16.gguf ${CMAKE_CURRENT_BINARY_DIR}/bench_work)
  # a generous heartbeat timeout: sanitizer builds on 2 busy cores
  set_tests_properties(bench_cli PROPERTIES TIMEOUT 300)
  # bench/serve_load.py (the served-load generator, openai client) against serve on the tiny model
  add_test(NAME bench_serve_load
           COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/bench/test_serve_load.py $<TARGET_FILE:mlaserve>
                   ${CMAKE_SOURCE_DIR}/models/tiny-deepseek3-bf16.gguf)
  set_tests_properties(bench_serve_load PROPERTIES TIMEOUT 600)
  # scripts/gpu_serve_bench.sh dry run (CPU backend, a small GLM-4.7-Flash-shaped model, no llama-server),
  # bench/ncu_step.py --families and bench/plot_serve.py on hand-made inputs
  add_test(NAME bench_gpu_serve_dry
           COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/bench/test_gpu_serve_bench.py $<TARGET_FILE:mlaserve>
                   ${CMAKE_CURRENT_BINARY_DIR}/gpu_serve_work)
  set_tests_properties(bench_gpu_serve_dry PROPERTIES TIMEOUT 900 LABELS serve)
  # scripts/gpu_ab_bundles.sh dry run: three trees of this build (TREES), CPU backend, two rounds
  add_test(NAME bench_ab_bundles_dry
           COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/bench/test_ab_bundles.py $<TARGET_FILE:mlaserve>
                   ${CMAKE_CURRENT_BINARY_DIR}/ab_bundles_work)
  set_tests_properties(bench_ab_bundles_dry PROPERTIES TIMEOUT 900)
endif()

add_executable(test_bench_hooks ${MLA_TEST_DIR}/bench/test_bench_hooks.c)
target_include_directories(test_bench_hooks PRIVATE ${MLA_TEST_DIR}/unit)
target_link_libraries(test_bench_hooks mla_coord mla_test_engine m)
add_test(NAME bench_nohook COMMAND test_bench_hooks nohook $<TARGET_FILE:mla-test-worker>)
set_tests_properties(bench_nohook PROPERTIES TIMEOUT 180)
add_test(NAME bench_fill_deepseek3 COMMAND test_bench_hooks fill ${CMAKE_SOURCE_DIR}/models/tiny-deepseek3-bf16.gguf 8)
# glm-dsa: the indexer key cache is filled too; a decode after 32 positions sees 33 keys > top_k (32)
add_test(NAME bench_fill_glm5 COMMAND test_bench_hooks fill ${MLA_FIXTURES}/tiny-glm5/tiny-glm5-q8_0.gguf 32)

# bench/kernel_code.py (each CUDA kernel's code size, read from this build's objects)
if(MLA_HAVE_CUDA AND TARGET mla_kernels_cuda)
  add_test(NAME bench_kernel_code
           COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/bench/test_kernel_code.py ${CMAKE_SOURCE_DIR}/bench/kernel_code.py
                   ${CMAKE_BINARY_DIR})
endif()
