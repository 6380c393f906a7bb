/* mm_mmaq_cuda: q8 activations x integer-form weights on the int8 tensor cores (mma.sync s8):
 * prompts and large batches, dense and grouped over a MoE plan. API: kernels/cuda_ops.h
 * (mla_cuda_matmul_q8_mma, mla_cuda_matmul_grouped_q8_mma); chosen by mm_choose_cuda.cu. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/mm_cuda.h"

namespace mlacu {

MLACU_GRIDS_TU();

/* ---------------------------------------------------------------- integer tensor cores */
/* Prefill and large batches with q8 activations: mma.sync m16n8k16 s8 x s8 -> s32. A block owns
 * 64 tokens x 64 output rows (4 warps of 32 x 32), walks K IM_KU units (of 32) per stage: the
 * tokens' q8 blocks are copied to shared memory, each weight unit is put in its integer form
 * (unit_i8: any quantized type) by one thread, and every unit's two k16 halves go through the
 * tensor cores; the int32 result of a unit (or of each half, for types with two scales per unit)
 * is scaled into fp32 accumulators: y += d_x * s_w * (q_x . q_w) - m_w * (d_x * sum q_x). Rows of
 * 48 bytes in shared memory: the fragment loads of a warp hit 32 distinct banks. */
constexpr int IM_BM = 64, IM_BN = 64, IM_KU = 4, IM_LD = 48;

__device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b));
}

/* The shared memory of one block of the int8 kernels. xrow[tok]: the q8 row of the block's token
 * tok (-1: none), yrow[tok]: its output row. */
struct mmaq_smem {
    __align__(16) uint8_t As[IM_KU][IM_BM][IM_LD];
    __align__(16) uint8_t Bs[IM_KU][IM_BN][IM_LD];
    float4 Asc[IM_KU][IM_BM]; /* d, d * sum q[0:16], d * sum q[16:32] */
    float4 Bsc[IM_KU][IM_BN]; /* s0, s1, m0, m1 */
    int xrow[IM_BM], yrow[IM_BM];
};

/* acc = rows r0.. of W (64) x the block's tokens (sm.xrow) over all nu units; the caller has
 * filled xrow and synchronised. */
template <int TY>
__device__ __forceinline__ void mmaq_block(const uint8_t *__restrict__ W, size_t rb, int nu, int out, int r0,
                                           const uint4 *__restrict__ qx, const float4 *__restrict__ sx,
                                           mmaq_smem &sm, float (&acc)[2][4][4]) {
    using Q = qtraits<TY>;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
    const int wm = warp >> 1, wn = warp & 1;
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < 4; b++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[a][b][i] = 0.f;
    for (int u0 = 0; u0 < nu; u0 += IM_KU) {
        __syncthreads();
        for (int i = tid; i < IM_KU * IM_BM * 2; i += 128) {
            const int uu = i / (IM_BM * 2), tok = (i >> 1) % IM_BM, half = i & 1;
            const int u = u0 + uu, xr = sm.xrow[tok];
            uint4 v = make_uint4(0, 0, 0, 0);
            if (u < nu && xr >= 0) v = __ldg(qx + ((size_t)xr * nu + u) * 2 + half);
            *(uint4 *)&sm.As[uu][tok][16 * half] = v;
        }
        for (int i = tid; i < IM_KU * IM_BM; i += 128) {
            const int uu = i / IM_BM, tok = i % IM_BM, u = u0 + uu, xr = sm.xrow[tok];
            sm.Asc[uu][tok] = u < nu && xr >= 0 ? __ldg(sx + (size_t)xr * nu + u) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        for (int i = tid; i < IM_KU * IM_BN; i += 128) {
            const int uu = i / IM_BN, row = i % IM_BN, u = u0 + uu;
            unit_i8_t w;
            if (u < nu) {
                unit_i8<TY>(W + (size_t)min(r0 + row, out - 1) * rb + (size_t)(u / Q::BU) * Q::BB, u % Q::BU, w);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) w.q[j] = 0;
                w.s[0] = w.s[1] = w.m[0] = w.m[1] = 0.f;
            }
            uint4 *d = (uint4 *)&sm.Bs[uu][row][0];
            d[0] = make_uint4(w.q[0], w.q[1], w.q[2], w.q[3]);
            d[1] = make_uint4(w.q[4], w.q[5], w.q[6], w.q[7]);
            sm.Bsc[uu][row] = make_float4(w.s[0], w.s[1], w.m[0], w.m[1]);
        }
        __syncthreads();
#pragma unroll 1
        for (int uu = 0; uu < IM_KU && u0 + uu < nu; uu++) {
            float da[2][2];
            float4 sb[4][2];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int k = 0; k < 2; k++) da[mt][k] = sm.Asc[uu][wm * 32 + mt * 16 + g + 8 * k].x;
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int k = 0; k < 2; k++) sb[nt][k] = sm.Bsc[uu][wn * 32 + nt * 8 + tg * 2 + k];
            int c[2][4][4];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (h == 0 || i8_scales2<TY>()) {
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
#pragma unroll
                        for (int nt = 0; nt < 4; nt++)
#pragma unroll
                            for (int i = 0; i < 4; i++) c[mt][nt][i] = 0;
                }
                uint32_t a[2][2], b[4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    const int tok = wm * 32 + mt * 16 + g;
                    a[mt][0] = *(const uint32_t *)&sm.As[uu][tok][16 * h + 4 * tg];
                    a[mt][1] = *(const uint32_t *)&sm.As[uu][tok + 8][16 * h + 4 * tg];
                }
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
                    b[nt] = *(const uint32_t *)&sm.Bs[uu][wn * 32 + nt * 8 + g][16 * h + 4 * tg];
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) mma_s8(c[mt][nt], a[mt][0], a[mt][1], b[nt]);
                if (h == 1 || i8_scales2<TY>()) { /* scale this half (or the whole unit) */
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
#pragma unroll
                        for (int nt = 0; nt < 4; nt++)
#pragma unroll
                            for (int i = 0; i < 4; i++) {
                                const float sw = h == 0 ? sb[nt][i & 1].x : sb[nt][i & 1].y;
                                acc[mt][nt][i] += (float)c[mt][nt][i] * (da[mt][i >> 1] * sw);
                            }
                }
            }
            if (i8_min<TY>()) {
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int k = 0; k < 2; k++) {
                        const float4 xa = sm.Asc[uu][wm * 32 + mt * 16 + g + 8 * k];
#pragma unroll
                        for (int nt = 0; nt < 4; nt++)
#pragma unroll
                            for (int j = 0; j < 2; j++)
                                acc[mt][nt][2 * k + j] -= sb[nt][j].z * xa.y + sb[nt][j].w * xa.z;
                    }
            }
        }
    }
}

/* y[yrow[tok]][r0 + column] = acc for the block's tokens with an output row */
__device__ __forceinline__ void mmaq_store(const float (&acc)[2][4][4], const mmaq_smem &sm, int r0, int out,
                                           float *__restrict__ y) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
    const int wm = warp >> 1, wn = warp & 1;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int yr = sm.yrow[wm * 32 + mt * 16 + g + 8 * (i >> 1)], o = r0 + wn * 32 + nt * 8 + tg * 2 + (i & 1);
                if (yr >= 0 && o < out) y[(size_t)yr * out + o] = acc[mt][nt][i];
            }
}

template <int TY>
__global__ void __launch_bounds__(128)
    mmaq_kernel(const uint8_t *__restrict__ W, size_t rb, int nu, int out, const uint4 *__restrict__ qx,
                const float4 *__restrict__ sx, int T, float *__restrict__ y) {
    mlacu_pdl_enter();
    __shared__ mmaq_smem sm;
    const int t0 = blockIdx.y * IM_BM, r0 = blockIdx.x * IM_BN;
    for (int i = threadIdx.x; i < IM_BM; i += 128) sm.xrow[i] = sm.yrow[i] = t0 + i < T ? t0 + i : -1;
    float acc[2][4][4];
    mmaq_block<TY>(W, rb, nu, out, r0, qx, sx, sm, acc);
    mmaq_store(acc, sm, r0, out, y);
}

/* The experts of a MoE plan on the int8 tensor cores: block (row block, expert e) walks e's pairs
 * (plan.sorted from e's offset, the sum of the counts before it) 64 at a time: pair p reads q8
 * row p / x_div, writes y row p. For prefill-sized steps (many tokens per expert). */
template <int TY>
__global__ void __launch_bounds__(128)
    mmaq_grp_kernel(const uint8_t *__restrict__ W, size_t rb, size_t estride, int nu, int out,
                    const uint4 *__restrict__ qx, const float4 *__restrict__ sx, int x_div,
                    const int32_t *__restrict__ sorted, const int32_t *__restrict__ counts, int world,
                    float *__restrict__ y) {
    mlacu_pdl_enter();
    __shared__ mmaq_smem sm;
    const int e = blockIdx.y, r0 = blockIdx.x * IM_BN, tid = threadIdx.x;
    const int cnt = counts[e];
    if (cnt == 0) return; /* the whole block: no barrier passed yet */
    const int off = plan_first_pair(counts, e);
    const uint8_t *We = W + (size_t)(e / world) * estride;
    for (int c0 = 0; c0 < cnt; c0 += IM_BM) {
        __syncthreads(); /* the previous chunk's stores read yrow */
        for (int i = tid; i < IM_BM; i += 128) {
            const int p = c0 + i < cnt ? sorted[off + c0 + i] : -1;
            sm.xrow[i] = p >= 0 ? p / x_div : -1;
            sm.yrow[i] = p;
        }
        float acc[2][4][4];
        mmaq_block<TY>(We, rb, nu, out, r0, qx, sx, sm, acc);
        mmaq_store(acc, sm, r0, out, y);
    }
}

template <int TY>
static cudaError_t launch_mmaq(const void *w, int64_t in, int64_t out, const void *q8, int64_t T, float *y,
                               cudaStream_t s) {
    const int nu = (int)(in / 32);
    dim3 grid((unsigned)((out + IM_BN - 1) / IM_BN), (unsigned)((T + IM_BM - 1) / IM_BM));
    mlacu_launch(mmaq_kernel<TY>, grid, 128, 0, s, (const uint8_t *)w, ggml_row_bytes(TY, in), nu, (int)out,
                 (const uint4 *)q8, (const float4 *)((const uint8_t *)q8 + mlacu_q8_scale_off(T, in)), (int)T, y);
    return cudaGetLastError();
}

template <int TY>
static cudaError_t launch_mmaq_grp(const void *w, size_t estride, int64_t in, int64_t out, const void *q8,
                                   int64_t x_rows, int x_div, const mla_cuda_moe_plan *pl, int64_t n_expert, float *y,
                                   cudaStream_t s) {
    dim3 grid((unsigned)((out + IM_BN - 1) / IM_BN), (unsigned)n_expert);
    mlacu_launch(mmaq_grp_kernel<TY>, grid, 128, 0, s, (const uint8_t *)w, ggml_row_bytes(TY, in), estride,
                 (int)(in / 32), (int)out, (const uint4 *)q8,
                 (const float4 *)((const uint8_t *)q8 + mlacu_q8_scale_off(x_rows, in)), x_div, pl->sorted, pl->counts,
                 pl->world, y);
    return cudaGetLastError();
}

} // namespace mlacu

using namespace mlacu;

extern "C" int mla_cuda_matmul_q8_mma(uint32_t t, const void *d_w, int64_t in, int64_t out, const void *d_q8, int64_t T,
                                      float *d_y, mla_cuda_stream stream, mla_err *e) {
    check_shape(t, in, out, T);
    MLA_ASSERT(mla_cuda_q8_supported(t) && ((uintptr_t)d_w & 15) == 0 && T < 65535 * (int64_t)IM_BM);
    if (T == 0) return MLA_OK;
    cudaError_t err = with_q8_type(t, [&](auto ty) {
        return launch_mmaq<decltype(ty)::value>(d_w, in, out, d_q8, T, d_y, (cudaStream_t)stream);
    });
    MLACU_CHECK(err, e, "mma q8 %s %lldx%lld T=%lld", ggml_type_name(t), (long long)out, (long long)in, (long long)T);
    return MLA_OK;
}

extern "C" int mla_cuda_matmul_grouped_q8_mma(uint32_t t, const void *d_w, size_t estride, int64_t in, int64_t out,
                                              const void *d_q8, int64_t x_rows, int x_div,
                                              const mla_cuda_moe_plan *plan, int64_t n_expert, float *d_y,
                                              mla_cuda_stream stream, mla_err *e) {
    check_shape(t, in, out, 1);
    MLA_ASSERT(mla_cuda_q8_supported(t) && x_div >= 1 && plan && plan->world >= 1 && n_expert >= 1 &&
               n_expert <= 65535 && ((uintptr_t)d_w & 15) == 0);
    cudaError_t err = with_q8_type(t, [&](auto ty) {
        return launch_mmaq_grp<decltype(ty)::value>(d_w, estride, in, out, d_q8, x_rows, x_div, plan, n_expert, d_y,
                                                    (cudaStream_t)stream);
    });
    MLACU_CHECK(err, e, "grouped mma q8 %s %lldx%lld", ggml_type_name(t), (long long)out, (long long)in);
    return MLA_OK;
}
