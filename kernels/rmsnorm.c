#include "rmsnorm.h"

#include <math.h>

void rmsnorm(const float *x, int64_t ldx, int64_t T, int64_t n, const float *w, float eps, float *y,
             int64_t ldy) {
    for (int64_t t = 0; t < T; t++) {
        const float *xr = x + t * ldx;
        float *yr = y + t * ldy;
        double ss = 0.0;
        for (int64_t i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        float r = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
        for (int64_t i = 0; i < n; i++) yr[i] = xr[i] * r * w[i];
    }
}
