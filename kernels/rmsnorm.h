/* rmsnorm: y = x / sqrt(mean(x^2) + eps) * w, row by row (HF DeepSeek/GLM RMSNorm). y may
 * alias x. No ownership. */
#ifndef RMSNORM_H
#define RMSNORM_H

#include <stdint.h>

/* T rows of n elements: x at x + t*ldx, y at y + t*ldy. */
void rmsnorm(const float *x, int64_t ldx, int64_t T, int64_t n, const float *w, float eps, float *y,
             int64_t ldy);

#endif
