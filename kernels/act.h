/* act: element-wise activations and small vector ops. No ownership; outputs may alias inputs
 * where noted. */
#ifndef ACT_H
#define ACT_H

#include <stdint.h>

static inline float act_silu1(float x) { return x / (1.0f + __builtin_expf(-x)); }
static inline float act_sigmoid1(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }

/* y[i] = silu(g[i]) * u[i] (y may alias g or u). */
void act_swiglu(const float *g, const float *u, float *y, int64_t n);
void act_silu(const float *x, float *y, int64_t n);
/* In place, numerically stable; entries equal to -INFINITY get probability 0. */
void act_softmax(float *x, int64_t n);
/* y[i] += a[i] */
void act_add(float *y, const float *a, int64_t n);
/* y[i] += s * a[i] */
void act_axpy(float *y, float s, const float *a, int64_t n);

#endif
