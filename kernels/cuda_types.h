/* cuda_types: the weight types the CUDA backend computes with (their units are in
 * kernels/cuda_quant_unit.h), as a plain C list: the CUDA worker checks a model against it before
 * it uploads a byte, and `mlaserve inspect` reports it on a host without a GPU. One list, read by
 * both. Nothing to own. */
#ifndef MLA_CUDA_TYPES_H
#define MLA_CUDA_TYPES_H

#include <stdbool.h>
#include <stdint.h>

#include "common/ggml_types.h"

/* Calls M(type) for every weight type the CUDA kernels take. */
#define MLA_CUDA_WEIGHT_TYPES(M)                                                                \
    M(GGML_TYPE_F32) M(GGML_TYPE_F16) M(GGML_TYPE_BF16) M(GGML_TYPE_Q8_0) M(GGML_TYPE_Q5_0)     \
    M(GGML_TYPE_Q2_K) M(GGML_TYPE_Q3_K) M(GGML_TYPE_Q4_K) M(GGML_TYPE_Q5_K) M(GGML_TYPE_Q6_K)   \
    M(GGML_TYPE_IQ4_XS) M(GGML_TYPE_IQ2_XXS) M(GGML_TYPE_IQ2_XS) M(GGML_TYPE_IQ2_S)             \
    M(GGML_TYPE_IQ3_XXS) M(GGML_TYPE_IQ3_S) M(GGML_TYPE_IQ1_S) M(GGML_TYPE_IQ1_M) M(GGML_TYPE_Q4_0)    \
    M(GGML_TYPE_Q4_1) M(GGML_TYPE_Q5_1) M(GGML_TYPE_IQ4_NL)

/* the same list as array elements: `uint32_t types[] = {MLA_CUDA_WEIGHT_TYPE_LIST};` */
#define MLA_CUDA_TYPE_ITEM_(T_) T_,
#define MLA_CUDA_WEIGHT_TYPE_LIST MLA_CUDA_WEIGHT_TYPES(MLA_CUDA_TYPE_ITEM_)

/* whether the CUDA backend computes with weights of type t */
static inline bool mla_cuda_weight_type(uint32_t t) {
    switch (t) {
#define MLA_CUDA_TYPE_CASE(T_) case T_:
        MLA_CUDA_WEIGHT_TYPES(MLA_CUDA_TYPE_CASE)
#undef MLA_CUDA_TYPE_CASE
        return true;
    default:
        return false;
    }
}

#endif
