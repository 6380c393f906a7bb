/* cuda_check: how the GPU harnesses (the .cu programs of tests/gpu and bench) check a CUDA call:
 * on an error, the file, the line, the call and CUDA's message on stderr, then exit(code). For
 * programs that need a GPU and stop at the first failure; the library's own calls return a status
 * instead (MLACU_CHECK, kernels/cuda_internal.h). */
#ifndef MLA_TESTS_CUDA_CHECK_H
#define MLA_TESTS_CUDA_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define MLA_CUDA_EXIT_ON_ERROR(call, code)                                                          \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(code);                                                                             \
        }                                                                                           \
    } while (0)

#endif
