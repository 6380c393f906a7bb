# CUDA op harness and CUDA host checks (only when the CUDA backend is built).
# mla-gpu-check needs a GPU: it is built with everything else here and in CI (that build, for
# sm_90, sm_100 and sm_120, is the compile-only check of the CUDA code) and run on the GPU
# machine by scripts/gpu_check.sh. test_cuda_quant_host needs no GPU and runs in CI.
if(MLA_HAVE_CUDA AND TARGET mla_kernels_cuda)
  set(mla_gpu_dir ${CMAKE_SOURCE_DIR}/tests/gpu)
  add_executable(mla-gpu-check ${mla_gpu_dir}/gpu_check.cu)
  add_executable(test_cuda_quant_host ${mla_gpu_dir}/test_cuda_quant_host.cu)
  foreach(t mla-gpu-check test_cuda_quant_host)
    target_include_directories(${t} PRIVATE ${CMAKE_SOURCE_DIR})
    target_compile_options(${t} PRIVATE -Xcompiler=-Wall,-Wextra,-Wno-unused-function -Werror=all-warnings)
  endforeach()
  # the host's sampler (worker/sample.c), the reference of the device sampling checks
  add_library(mla_gpu_check_sampler STATIC ${CMAKE_SOURCE_DIR}/worker/sample.c)
  target_include_directories(mla_gpu_check_sampler PUBLIC ${CMAKE_SOURCE_DIR}/proto)
  target_link_libraries(mla_gpu_check_sampler PUBLIC mla_common)
  target_link_libraries(mla-gpu-check mla_gpu_check_sampler)
  target_link_libraries(mla-gpu-check mla_kernels_cuda mla_kernels mla_common)
  target_link_libraries(test_cuda_quant_host mla_kernels mla_common)
  # the matmul chooser's rules (docs/kernels.md) and the attention's split count, host code of the
  # CUDA library: no GPU needed
  add_executable(test_cuda_choose ${mla_gpu_dir}/test_cuda_choose.cu)
  target_include_directories(test_cuda_choose PRIVATE ${CMAKE_SOURCE_DIR})
  target_compile_options(test_cuda_choose PRIVATE -Xcompiler=-Wall,-Wextra,-Wno-unused-function -Werror=all-warnings)
  target_link_libraries(test_cuda_choose mla_kernels_cuda mla_kernels mla_common)
  # the one-shot all-reduce through peer memory (kernels/allreduce_cuda.h): 2 and 4 ranks sharing
  # one GPU, the sum bit for bit against the host's, the fused add + RMSNorm against the CPU's;
  # exits 77 (skipped) without a GPU, run on a GPU host from build-gpu-carried/
  add_executable(test_allreduce_oneshot ${mla_gpu_dir}/test_allreduce_oneshot.cu)
  target_include_directories(test_allreduce_oneshot PRIVATE ${CMAKE_SOURCE_DIR})
  target_compile_options(test_allreduce_oneshot PRIVATE -Xcompiler=-Wall,-Wextra,-Wno-unused-function -Werror=all-warnings)
  target_link_libraries(test_allreduce_oneshot mla_kernels_cuda mla_kernels mla_common)
  if(BUILD_TESTING)
    add_test(NAME cuda_allreduce_oneshot COMMAND test_allreduce_oneshot)
    set_tests_properties(cuda_allreduce_oneshot PROPERTIES TIMEOUT 60 SKIP_RETURN_CODE 77)
    add_test(NAME cuda_quant_host COMMAND test_cuda_quant_host)
    set_tests_properties(cuda_quant_host PROPERTIES TIMEOUT 120)
    add_test(NAME cuda_mm_choose COMMAND test_cuda_choose)
    set_tests_properties(cuda_mm_choose PROPERTIES TIMEOUT 60)
  endif()
endif()

# The CUDA forward pass (worker/model_cuda.cu) and mla-e2e, `mlaserve logits` on it for the GPU
# machine (GPU-only build: no zmq/uv/protobuf-c there). Built here and in CI, run by
# scripts/gpu_check.sh through tests/model/check_logits.py.
if(MLA_HAVE_CUDA AND TARGET mla_kernels_cuda)
  if(NOT TARGET mla_model_cuda)
    add_library(mla_model_cuda STATIC ${CMAKE_SOURCE_DIR}/worker/model_cuda.cu)
    target_include_directories(mla_model_cuda PUBLIC ${CMAKE_SOURCE_DIR})
    target_compile_options(mla_model_cuda PRIVATE -Xcompiler=-Wall,-Wextra,-Wno-unused-function -Werror=all-warnings)
    target_link_libraries(mla_model_cuda PUBLIC mla_kernels_cuda mla_kernels mla_common)
  endif()
  add_executable(mla-e2e ${mla_gpu_dir}/e2e_main.cu)
  target_include_directories(mla-e2e PRIVATE ${CMAKE_SOURCE_DIR})
  target_compile_options(mla-e2e PRIVATE -Xcompiler=-Wall,-Wextra,-Wno-unused-function -Werror=all-warnings)
  target_link_libraries(mla-e2e mla_model_cuda Threads::Threads)
endif()

# `--backend cpu|cuda` of mlaserve logits/generate/serve (coordinator/coord_opts.c): a
# backend means worker processes, also at TP 1; checked against the HF logits through them (CPU
# backend here; scripts/gpu_check.sh --stack runs the cuda backend on a GPU host), and a
# bad value is refused with a message naming it.
if(TARGET mlaserve AND BUILD_TESTING)
  add_test(NAME backend_cpu_processes_tp1
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/model/check_logits.py
                   --mlaserve ${CMAKE_SOURCE_DIR}/tests/gpu/mlaserve_backend.sh
                   --fixture ${MLA_FIXTURES}/tiny-deepseek3 --model ${MLA_FIXTURES}/tiny-deepseek3/tiny-deepseek3-bf16.gguf
                   --prompts 0,5 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy)
  set_tests_properties(backend_cpu_processes_tp1 PROPERTIES TIMEOUT 120
                       ENVIRONMENT "MLASERVE_TEST_EXE=$<TARGET_FILE:mlaserve>;MLASERVE_TEST_BACKEND=cpu")
  add_test(NAME backend_bad_refused
           COMMAND mlaserve logits -m ${MLA_FIXTURES}/tiny-deepseek3/tiny-deepseek3-bf16.gguf --tokens /dev/null
                   --out /dev/null --backend gpu)
  set_tests_properties(backend_bad_refused PROPERTIES TIMEOUT 30 PASS_REGULAR_EXPRESSION "--backend: 'gpu' is not cpu or cuda")
  # `mlaserve logits` through worker processes sizes the workers' steps by its longest prompt (600
  # tokens, past the default 512: a larger step after the cache pool took the memory ran a GPU out
  # of it), and refuses up front a step whose logits would pass the wire's frame limit (2048 a
  # token: 32760 tokens at most), naming --chunk
  string(REPEAT "5 " 600 _ids600)
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/ids-600.txt "${_ids600}\n")
  string(REPEAT "5 " 32761 _ids32761)
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/ids-32761.txt "${_ids32761}\n")
  add_test(NAME logits_processes_step_sized
           COMMAND bash -c "set -o pipefail; \"$0\" logits -m \"$1\" --tokens \"$2\" --out /dev/null --backend cpu 2>&1 |
                            grep 'worker group ready: 1 ranks, vocabulary 2048, steps of up to 600 tokens'"
                   $<TARGET_FILE:mlaserve> ${MLA_FIXTURES}/tiny-deepseek3/tiny-deepseek3-bf16.gguf
                   ${CMAKE_CURRENT_BINARY_DIR}/ids-600.txt)
  set_tests_properties(logits_processes_step_sized PROPERTIES TIMEOUT 120)
  add_test(NAME logits_frame_limit_refused
           COMMAND mlaserve logits -m ${MLA_FIXTURES}/tiny-deepseek3/tiny-deepseek3-bf16.gguf
                   --tokens ${CMAKE_CURRENT_BINARY_DIR}/ids-32761.txt --out /dev/null --backend cpu)
  set_tests_properties(logits_frame_limit_refused PROPERTIES TIMEOUT 60
                       PASS_REGULAR_EXPRESSION "a step of 32761 tokens returns its logits .* give --chunk 32760 or less")
  # --allreduce oneshot (kernels/allreduce_cuda.h) is a CUDA all-reduce: the CPU backend refuses it
  add_test(NAME allreduce_oneshot_cpu_refused
           COMMAND mlaserve logits -m ${MLA_FIXTURES}/tiny-deepseek3/tiny-deepseek3-bf16.gguf --tokens /dev/null
                   --out /dev/null --backend cpu --tp 2 --allreduce oneshot)
  set_tests_properties(allreduce_oneshot_cpu_refused PROPERTIES TIMEOUT 60
                       PASS_REGULAR_EXPRESSION "--allreduce oneshot is an all-reduce between GPUs")
endif()

# bench/boundary_cuda.cu: what a dependency between two phases of a decode step costs by the
# mechanism that orders them (chained launches, programmatic launch, a flag, one persistent
# launch), and with -c what a launch's cold code and a joined branch cost; needs a GPU, built here and in CI as a compile check, carried by scripts/gpu_carry.sh
if(MLA_HAVE_CUDA)
  add_executable(mla-boundary ${CMAKE_SOURCE_DIR}/bench/boundary_cuda.cu)
  target_include_directories(mla-boundary PRIVATE ${CMAKE_SOURCE_DIR})
  target_compile_options(mla-boundary PRIVATE -Xcompiler=-Wall,-Wextra -Werror=all-warnings)
endif()
