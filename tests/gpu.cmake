# CUDA op harness and CUDA host checks (only when the CUDA backend is built).
# mla-gpu-check needs a GPU: it is BUILT here and in CI (a ctest checks that it builds) and run
# on the GPU machine by scripts/gpu_check.sh. test_cuda_quant_host needs no GPU and runs in CI.
if(MLA_HAVE_CUDA AND TARGET mla_kernels_cuda)
  set(mla_gpu_dir ${CMAKE_SOURCE_DIR}/tests/gpu)
  add_executable(mla-gpu-check ${mla_gpu_dir}/gpu_check.cu)
  add_executable(test_cuda_quant_host ${mla_gpu_dir}/test_cuda_quant_host.cu)
  foreach(t mla-gpu-check test_cuda_quant_host)
    target_include_directories(${t} PRIVATE ${CMAKE_SOURCE_DIR})
    target_compile_options(${t} PRIVATE -Xcompiler=-Wall,-Wextra -Werror=all-warnings)
  endforeach()
  target_link_libraries(mla-gpu-check mla_kernels_cuda mla_kernels mla_common)
  target_link_libraries(test_cuda_quant_host mla_kernels mla_common)
  if(BUILD_TESTING)
    add_test(NAME gpu_check_builds
             COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target mla-gpu-check)
    add_test(NAME cuda_quant_host COMMAND test_cuda_quant_host)
    set_tests_properties(gpu_check_builds PROPERTIES TIMEOUT 900)
    set_tests_properties(cuda_quant_host PROPERTIES TIMEOUT 120)
  endif()
endif()
