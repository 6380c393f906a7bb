/* ggml_types: the tensor element types a GGUF file can hold, with their block geometry.
 * Ids are the on-disk values of GGUF tensor infos (ggml's enum). Pure data, no ownership. */
#ifndef GGML_TYPES_H
#define GGML_TYPES_H

#include <stddef.h>
#include <stdint.h>

enum ggml_type {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_Q8_K = 15,
    GGML_TYPE_IQ2_XXS = 16,
    GGML_TYPE_IQ2_XS = 17,
    GGML_TYPE_IQ3_XXS = 18,
    GGML_TYPE_IQ1_S = 19,
    GGML_TYPE_IQ4_NL = 20,
    GGML_TYPE_IQ3_S = 21,
    GGML_TYPE_IQ2_S = 22,
    GGML_TYPE_IQ4_XS = 23,
    GGML_TYPE_I8 = 24,
    GGML_TYPE_I16 = 25,
    GGML_TYPE_I32 = 26,
    GGML_TYPE_I64 = 27,
    GGML_TYPE_F64 = 28,
    GGML_TYPE_IQ1_M = 29,
    GGML_TYPE_BF16 = 30,
    GGML_TYPE_TQ1_0 = 34,
    GGML_TYPE_TQ2_0 = 35,
    GGML_TYPE_MXFP4 = 39,
    GGML_TYPE_COUNT = 40
};

typedef struct ggml_type_info {
    const char *name;    /* "Q4_K"; NULL for ids that are not a known type */
    uint32_t block_elems; /* elements per block (1 for plain types) */
    uint32_t block_bytes; /* bytes per block */
} ggml_type_info;

/* NULL when id is not a type this build knows. */
const ggml_type_info *ggml_type_get(uint32_t id);
/* "Q4_K", or "type#<id>" for unknown ids (static storage per call site is not used: the
 * unknown form goes into a thread-local buffer). */
const char *ggml_type_name(uint32_t id);
/* Bytes of n elements of type t (n must be a multiple of the block size; returns 0 when not,
 * or when the type is unknown). */
size_t ggml_row_bytes(uint32_t t, int64_t n);

#endif
