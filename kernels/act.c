#include "act.h"

#include <math.h>

void act_swiglu(const float *g, const float *u, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = act_silu1(g[i]) * u[i];
}

void act_silu(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = act_silu1(x[i]);
}

void act_softmax(float *x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    if (mx == -INFINITY) {
        for (int64_t i = 0; i < n; i++) x[i] = 0.0f;
        return;
    }
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        s += x[i];
    }
    float inv = (float)(1.0 / s);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void act_add(float *y, const float *a, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a[i];
}

void act_axpy(float *y, float s, const float *a, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += s * a[i];
}
