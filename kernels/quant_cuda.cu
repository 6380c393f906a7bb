/* quant_cuda: the quantized types on the device: the per-process init (the IQ grids) and the
 * embedding gather, for every type in cuda_quant_unit.h. The matmuls are the mm_*_cuda.cu files
 * (docs/kernels.md). API: kernels/cuda_ops.h. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/mm_cuda.h"

namespace mlacu {

MLACU_GRIDS_TU();

/* ---------------------------------------------------------------- embedding gather */

/* Embedding gather: thread per (token, unit). */
template <int TY>
__global__ void get_rows_kernel(const uint8_t *__restrict__ W, size_t rb, int64_t units, const int32_t *__restrict__ ids,
                                float *__restrict__ out) {
    mlacu_pdl_enter();
    using Q = qtraits<TY>;
    int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= units) return;
    const int t = blockIdx.y;
    float v[32];
    deq_unit<TY>(W + (size_t)ids[t] * rb + (u / Q::BU) * Q::BB, (int)(u % Q::BU), v);
    float4 *o = (float4 *)(out + ((size_t)t * units + u) * 32);
#pragma unroll
    for (int i = 0; i < 8; i++) o[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
}

template <int TY>
static cudaError_t launch_get_rows(const void *w, int64_t n, const int32_t *ids, int64_t T, float *out, cudaStream_t s) {
    int64_t units = n / 32;
    for (int64_t t0 = 0; t0 < T; t0 += 65535) {
        int64_t tn = T - t0 < 65535 ? T - t0 : 65535;
        dim3 grid((unsigned)((units + 127) / 128), (unsigned)tn);
        mlacu_launch(get_rows_kernel<TY>, grid, 128, 0, s, (const uint8_t *)w, ggml_row_bytes(TY, n), units, ids + t0,
                     out + t0 * n);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

} // namespace mlacu

using namespace mlacu;

extern "C" bool mla_cuda_quant_supported(uint32_t t) {
    return mla_cuda_weight_type(t); /* the list of kernels/cuda_types.h, which MLACU_FOR_TYPES expands */
}

extern "C" size_t mla_cuda_weight_bytes(uint32_t t, int64_t n, int64_t rows) {
    size_t b = ggml_row_bytes(t, n) * (size_t)rows;
    return (b + 15) / 16 * 16;
}

extern "C" int mla_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

/* The uploaders of the grid copies (cuda_quant_unit.h: one set per .cu file that reads them),
 * registered at start-up; static (zero) initialization, so registering from any file's
 * initializer is safe. */
static mlacu_grids_upload_fn g_grids_up[MLACU_GRIDS_MAX];
static int g_grids_n;
bool mlacu::mlacu_grids_register(mlacu_grids_upload_fn f) {
    MLA_ASSERT(g_grids_n < MLACU_GRIDS_MAX);
    g_grids_up[g_grids_n++] = f;
    return true;
}

extern "C" int mla_cuda_init(int device, mla_err *e) {
    MLACU_CHECK(cudaSetDevice(device), e, "cudaSetDevice(%d)", device);
    for (int i = 0; i < g_grids_n; i++)
        MLACU_CHECK(g_grids_up[i](), e, "upload the IQ grids (%d of %d)", i + 1, g_grids_n);
    return MLA_OK;
}

extern "C" int mla_cuda_get_rows(uint32_t t, const void *d_w, int64_t n, const int32_t *d_ids, int64_t T,
                                 float *d_out, mla_cuda_stream stream, mla_err *e) {
    check_shape(t, n, 1, T);
    if (T == 0) return MLA_OK;
    cudaError_t err = cudaErrorInvalidValue;
    switch (t) {
#define MLACU_CASE(T_)                                                                                              \
    case T_:                                                                                                        \
        err = launch_get_rows<T_>(d_w, n, d_ids, T, d_out, stream);                                                 \
        break;
        MLACU_FOR_TYPES(MLACU_CASE)
#undef MLACU_CASE
    }
    MLACU_CHECK(err, e, "get_rows %s n=%lld T=%lld", ggml_type_name(t), (long long)n, (long long)T);
    return MLA_OK;
}
