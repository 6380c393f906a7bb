/* quant: CPU reference dequantization and dot products for every GGUF block type.
 * These are the definition of correct for the CUDA versions (kernels/quant.cu).
 *
 * A "row" is n consecutive elements starting at a block boundary; n must be a multiple of the
 * type's block size (ggml_type_get(t)->block_elems). No ownership: callers own all buffers. */
#ifndef QUANT_H
#define QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/ggml_types.h"

/* True when this build can dequantize type t (and quant_dot_row supports it). */
bool quant_supported(uint32_t t);

/* dst[0..n) = dequantized src. Aborts (invariant) on an unsupported type or bad n: callers
 * check quant_supported() and block alignment when they load a tensor. */
void quant_dequant_row(uint32_t t, const void *src, float *dst, int64_t n);

/* sum_i dequant(row)[i] * x[i], computed by dequantizing block by block in registers
 * (no temporary row), accumulating in float. */
float quant_dot_row(uint32_t t, const void *row, const float *x, int64_t n);

/* Half and bfloat16 conversions (exact, round-to-nearest-even for the float->half ones). */
float quant_fp16_to_f32(uint16_t h);
uint16_t quant_f32_to_fp16(float f);
float quant_bf16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f);

#endif
