/* layernorm: y = (x - mean) / sqrt(var + eps) * w + b per row (torch LayerNorm, biased
 * variance), used by the DSA indexer's k_norm. y may alias x. No ownership. */
#ifndef LAYERNORM_H
#define LAYERNORM_H

#include <stdint.h>

void layernorm(const float *x, int64_t ldx, int64_t T, int64_t n, const float *w, const float *b,
               float eps, float *y, int64_t ldy);

#endif
