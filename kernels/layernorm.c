#include "layernorm.h"

#include <math.h>

void layernorm(const float *x, int64_t ldx, int64_t T, int64_t n, const float *w, const float *b,
               float eps, float *y, int64_t ldy) {
    for (int64_t t = 0; t < T; t++) {
        const float *xr = x + t * ldx;
        float *yr = y + t * ldy;
        double mu = 0.0, var = 0.0;
        for (int64_t i = 0; i < n; i++) mu += xr[i];
        mu /= (double)n;
        for (int64_t i = 0; i < n; i++) var += ((double)xr[i] - mu) * ((double)xr[i] - mu);
        var /= (double)n;
        double r = 1.0 / sqrt(var + (double)eps);
        for (int64_t i = 0; i < n; i++)
            yr[i] = (float)(((double)xr[i] - mu) * r) * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
    }
}
