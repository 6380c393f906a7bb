/* attn_wg_cuda: absorbed MLA attention on the warpgroup tensor cores (sm_90a): decode over long
 * caches and prompt steps over DSA-selected keys; see attn_wg_cuda.h.
 *
 * Block = (group of 64 heads, split, token), two warpgroups (256 threads), one block an SM. The
 * heads are wgmma's M (64 rows, one warpgroup's), keys the N of S = Q K^T and the K of O = P V,
 * the 576 latent + rope columns the K of S and the 512 latent ones the N of P V. Shared memory
 * (226.5 KB): the block's queries (times the softmax scale and log2 e, fp16), two key tiles of 64
 * cache rows, P (64 heads x 64 keys, fp16), the row exchanges and the tiles' row addresses. Every
 * operand sits in the K-major layout with the 128-byte swizzle, 64 columns (128 bytes) a k-block,
 * 16-byte chunk c of row r at chunk c ^ (r % 8), 8-row groups 1024 bytes apart:
 * - queries: 9 k-blocks of 64 rows; keys: 9 k-blocks of 64 rows a tile; P: one k-block.
 * - S: warpgroup 0 scores the 64 heads against the tile's 64 keys (36 m64n64k16 steps, both
 *   operands by descriptor).
 * - P V: V is the same key tile, read as the B operand in its MN-major form (the latent columns
 *   are V's N, contiguous in a row): k-block j of the tile holds columns 64 j .. +64 of every key,
 *   the MN-major 128-byte-swizzle atom of 64 columns x 8 keys; the descriptor steps 64 columns by
 *   LBO (8192, a k-block) and 8 keys by SBO (1024). Warpgroup w accumulates columns 256 w .. +256
 *   (m64n256k16, A = P by descriptor, 4 steps of 16 keys), 128 fp32 accumulators a thread.
 * - softmax: warpgroup 0 takes it whole (running maxima and sums) and leaves the rows' rescale
 *   factors in shared memory for warpgroup 1.
 * Key tiles are copied by cp.async (16 bytes, zeros past the split's keys), two tiles in flight,
 * the tile after next issued once both products of a tile are done. Checked against the CPU
 * reference in mla-gpu-check (--attnlong, the "wg" rows). */
#include "kernels/attn_wg_cuda.h"

#include <math.h>

#include "kernels/cuda_internal.h"
#include "kernels/wgmma_ops_cuda.h"

namespace {

constexpr int AW_L = 512, AW_R = 64, AW_ROW = AW_L + AW_R, AW_KB = AW_ROW / 64; /* 9 k-blocks of 64 */
constexpr int AW_NK = MLACU_AWG_KEYS, AW_M = MLACU_AWG_HEADS, AW_T = 256;
constexpr int AW_BLK = 64 * 128;            /* a k-block of 64 rows: 8192 bytes */
constexpr int AW_Q = AW_KB * AW_BLK;        /* queries: 73728 */
constexpr int AW_TILE = AW_KB * AW_BLK;     /* a key tile: 73728 */
constexpr int AW_P = AW_M * 128;            /* P: 8192 */
constexpr size_t AW_SMEM = (size_t)AW_Q + 2 * AW_TILE + AW_P + 2 * AW_M * 4 + 2 * AW_NK * sizeof(void *) + 1024;
static_assert(AW_NK == 64 && AW_M == 64, "one k-block of P, one warpgroup's M");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* O += P V: m64n256k16, A (K-major) and B (MN-major) by descriptor */
static __device__ __forceinline__ void aw_mma_pv(float (&d)[128], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, "
        "%128, %129, p, 1, 1, 0, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db));
}
#endif

/* S by warpgroup 0 alone (m64n64k16, the whole tile's keys; its softmax needs no exchange,
 * warpgroup 1 takes the rows' rescale factors from shared memory). One warpgroup reads each 64 x
 * 16 query step once for 64 keys: 144 KB of shared-memory reads a tile for S, where both
 * warpgroups on 32 keys each read 216 (and measured 4-7% slower on an H200 at 32k-128k keys). */
__global__ void __launch_bounds__(AW_T, 1) awg_kernel(mlacu_awg_args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(16) uint8_t aw_raw[];
    uint8_t *sm = aw_raw + ((1024u - (wga_u32(aw_raw) & 1023u)) & 1023u);
    uint8_t *qs = sm, *ks = sm + AW_Q, *ps = ks + 2 * AW_TILE;
    float *red = (float *)(ps + AW_P); /* [2][64]: the rows' rescale factors (warpgroup 0 to 1), then sums */
    const __half **rowp = (const __half **)(red + 2 * AW_M); /* [2][64]: the rows of a tile (NULL: none) */
    /* wg broadcast from lane 0: warp-uniform to the compiler, so that the wgmmas of one warpgroup
     * alone are not serialized */
    const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, (int)threadIdx.x >> 7, 0), wq = (tid >> 5) & 3,
              lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int t = blockIdx.z, split = blockIdx.y, h0 = blockIdx.x * AW_M;
    /* A paged cache: the first two tiles' copies go before the wait on the kernel before (which
     * wrote the queries; the rows were stored two or more launches back: cuda_internal.h). Not
     * with selected keys: the kernel before wrote them. */
    const bool early = a.tabs != nullptr && !a.sel;
    if (!early) mlacu_pdl_wait();
    const float *const *tab = a.tabs ? a.tabs[t] : nullptr;
    /* the split's keys [k0, k1): equal shares of whole tiles, as attn_mla_cuda.cu's split_keys */
    const int64_t nk = a.sel ? (int64_t)a.nsel[t] : (a.post ? (int64_t)a.post[t] : a.pos0 + t) + 1;
    const int64_t per = a.splits == 1 ? nk : ((nk + a.splits - 1) / a.splits + AW_NK - 1) / AW_NK * AW_NK;
    const int64_t k0 = (int64_t)split * per, k1 = nk < k0 + per ? nk : k0 + per;
    auto row_at = [&](int64_t k) -> const __half * {
        if (k >= k1) return nullptr;
        const int64_t key = a.sel ? a.sel[t * a.sel_stride + k] : k;
        return tab ? paged_row_t<__half>(tab, a.tab_off, AW_ROW, key) : a.kv + key * AW_ROW;
    };
    /* a tile: 64 rows x 72 chunks of 16 bytes, 18 a thread, into the swizzled k-blocks; one group */
    constexpr int CPR = AW_ROW / 8, CPT = AW_NK * CPR / AW_T;
    static_assert(AW_NK * CPR % AW_T == 0, "whole copies a thread");
    auto issue_tile = [&](const __half *const *rp, uint8_t *kd) {
#pragma unroll
        for (int u = 0; u < CPT; u++) {
            const int i = tid + u * AW_T, j = i / CPR, c = i % CPR;
            const __half *src = rp[j];
            cp_async16_zfill(kd + (c >> 3) * AW_BLK + wga_sw(j, c & 7), src ? (const void *)(src + c * 8) : (const void *)a.qa,
                             src != nullptr);
        }
        cp_async_commit();
    };
    if (tid < AW_NK) {
        rowp[tid] = row_at(k0 + tid);
        rowp[AW_NK + tid] = row_at(k0 + AW_NK + tid);
    }
    __syncthreads();
    if (k0 < k1) issue_tile(rowp, ks);
    else cp_async_commit();
    if (k0 + AW_NK < k1) issue_tile(rowp + AW_NK, ks + AW_TILE);
    else cp_async_commit();
    if (early) mlacu_pdl_wait();
    /* split: the next kernel (the combine) is scheduled at the last tile; else now */
    const bool late = a.splits > 1;
    if (!late) mlacu_pdl_trigger();
    { /* the queries: 64 rows x 288 float2, 72 a thread, 36 loads in flight */
        const float sl2 = a.scale * 1.44269504088896341f; /* scores in log2 units */
        constexpr int QP = AW_M * (AW_ROW / 2) / AW_T, QB = 36;
#pragma unroll 1
        for (int b = 0; b < QP; b += QB) {
            float2 v[QB];
#pragma unroll
            for (int u = 0; u < QB; u++) {
                const int i = tid + (b + u) * AW_T, h = i / (AW_ROW / 2), c = i % (AW_ROW / 2) * 2, hh = h0 + h;
                v[u] = c < AW_L ? *(const float2 *)(a.qa + ((int64_t)t * a.H + hh) * AW_L + c)
                                : *(const float2 *)(a.qp + t * a.qp_ld_t + hh * a.qp_ld_h + (c - AW_L));
            }
#pragma unroll
            for (int u = 0; u < QB; u++) {
                const int i = tid + (b + u) * AW_T, h = i / (AW_ROW / 2), c = i % (AW_ROW / 2) * 2;
                *(uint32_t *)(qs + (c >> 6) * AW_BLK + wga_sw(h, (c & 63) >> 3) + (c & 7) * 2) = wga_h2(v[u].x * sl2, v[u].y * sl2);
            }
        }
    }
    wga_fence_proxy(); /* the queries, to wgmma's proxy (made visible by the loop's first barrier) */
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.f;
    /* the thread's rows: r0 and r0 + 8 of the 64 (its warp's 16) */
    const int r0 = wq * 16 + g;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
    const uint32_t q0 = wga_u32(qs), kbase = wga_u32(ks), p0 = wga_u32(ps);
    int buf = 0;
    for (int64_t kb = k0; kb < k1; kb += AW_NK, buf ^= 1) {
        if (late && kb + AW_NK >= k1) mlacu_pdl_trigger();
        cp_async_wait<1>(); /* this thread's copies of tile buf have landed */
        wga_fence_proxy();
        __syncthreads(); /* every thread's copies of tile buf; the previous tile's readers are done */
        const __half *row2 = tid < AW_NK ? row_at(kb + 2 * AW_NK + tid) : nullptr;
        const uint32_t kt = kbase + (uint32_t)buf * AW_TILE;
        const int nvalid = (int)(k1 - kb < AW_NK ? k1 - kb : AW_NK);
        float al[2];
        if (wg == 0) {
            /* S: rows r0, r0 + 8 x keys 8 i + 2 t4 + j in s[4 i + 2 hf + j] */
            float s[32];
            wga_scores64<AW_KB, AW_BLK>(s, q0, kt);
            if (tid < AW_NK) rowp[buf * AW_NK + tid] = row2; /* issued into buffer buf after this tile */
            float mx[2] = {-INFINITY, -INFINITY}, sum[2] = {0.f, 0.f};
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = 8 * i + 2 * t4 + (e & 1);
                    const float v = key < nvalid ? s[4 * i + e] : -INFINITY;
                    s[4 * i + e] = v;
                    mx[e >> 1] = fmaxf(mx[e >> 1], v);
                }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                const float mn = fmaxf(m_r[r], mx[r]);
                al[r] = exp2f(m_r[r] - mn);
                m_r[r] = mn;
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[4 * i + e] = exp2f(s[4 * i + e] - m_r[e >> 1]);
                    sum[e >> 1] += s[4 * i + e];
                }
                /* keys 8 i + 2 t4, +1: chunk i of P's row, bytes 4 t4 */
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int row = r0 + 8 * hf;
                    *(uint32_t *)(ps + wga_sw(row, i) + 4 * t4) = wga_h2(s[4 * i + 2 * hf], s[4 * i + 2 * hf + 1]);
                }
            }
#pragma unroll
            for (int r = 0; r < 2; r++) l_r[r] = l_r[r] * al[r] + sum[r];
            if (t4 == 0) { /* the rows' rescale factors, for warpgroup 1 */
                red[r0] = al[0];
                red[r0 + 8] = al[1];
            }
            wga_fence_proxy(); /* P, to wgmma's proxy */
        }
        __syncthreads();
        if (wg == 1) {
            al[0] = red[r0];
            al[1] = red[r0 + 8];
        }
#pragma unroll
        for (int i = 0; i < 32; i++) {
            o[4 * i] *= al[0];
            o[4 * i + 1] *= al[0];
            o[4 * i + 2] *= al[1];
            o[4 * i + 3] *= al[1];
        }
        /* O[:, 256 wg ..] += P V: columns 256 wg .. = k-blocks 4 wg .. 4 wg + 3 of the tile; keys
         * 16 ks .. +16 = rows 16 ks of each */
        wga_pin(o);
        wga_fence();
#pragma unroll
        for (int kk = 0; kk < AW_NK / 16; kk++)
            aw_mma_pv(o, wga_desc_k(p0 + kk * 32), wga_desc_mn<AW_BLK>(kt + (uint32_t)(4 * wg * AW_BLK + kk * 16 * 128)));
        wga_commit();
        wga_wait0();
        wga_pin(o);
        __syncthreads(); /* both products done with tile buf and P */
        if (kb + 2 * AW_NK < k1) issue_tile(rowp + buf * AW_NK, ks + buf * AW_TILE);
        else cp_async_commit();
    }
    cp_async_wait<0>(); /* no copy outlives the block (only empty groups remain) */
    /* the rows' sums: the four lanes of a row, then the two warpgroups (warpgroup 1's are 0:
     * warpgroup 0 keeps them all) */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l_r[r] += __shfl_xor_sync(0xffffffffu, l_r[r], 1);
        l_r[r] += __shfl_xor_sync(0xffffffffu, l_r[r], 2);
    }
    __syncthreads();
    if (t4 == 0) {
        red[wg * AW_M + r0] = l_r[0];
        red[wg * AW_M + r0 + 8] = l_r[1];
    }
    __syncthreads();
    /* O: rows r0, r0 + 8 x columns 256 wg + 8 i + 2 t4 + j in o[4 i + 2 hf + j] */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int hh = h0 + r0 + 8 * r;
        const float l = red[r0 + 8 * r] + red[AW_M + r0 + 8 * r];
        if (a.splits == 1) {
            const float inv = l > 0.f ? 1.f / l : 0.f;
            float *dst = a.out + ((int64_t)t * a.H + hh) * AW_L + wg * 256 + 2 * t4;
#pragma unroll
            for (int i = 0; i < 32; i++) *(float2 *)(dst + 8 * i) = make_float2(o[4 * i + 2 * r] * inv, o[4 * i + 2 * r + 1] * inv);
        } else {
            float *w = a.work + (((int64_t)t * a.H + hh) * a.splits + split) * (AW_L + 2);
            if (wg == 0 && t4 == 0) {
                w[0] = m_r[r] * 0.69314718055994531f; /* natural units, as the combine reads */
                w[1] = l;
            }
            float *dst = w + 2 + wg * 256 + 2 * t4;
#pragma unroll
            for (int i = 0; i < 32; i++) *(float2 *)(dst + 8 * i) = make_float2(o[4 * i + 2 * r], o[4 * i + 2 * r + 1]);
        }
    }
    if (late && k0 >= k1) mlacu_pdl_trigger();
#else
    (void)a;
    __trap();
#endif
}

} // namespace

bool mlacu_awg_device_ok(void) { return mlacu_hopper_isa() && (size_t)mlacu_smem_optin() >= AW_SMEM; }

static cudaError_t awg_setup(int *bps) {
    static bool done = false;
    static int occ = 0;
    if (!done) {
        cudaError_t err = mlacu_smem_allow(awg_kernel, AW_SMEM);
        if (err != cudaSuccess) return err;
        err = cudaFuncSetAttribute(awg_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
        if (err != cudaSuccess) return err;
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, awg_kernel, AW_T, AW_SMEM);
        if (err != cudaSuccess) return err;
        done = true;
    }
    if (bps) *bps = occ;
    return cudaSuccess;
}

int mlacu_awg_blocks_per_sm(void) {
    if (!mlacu_awg_device_ok()) return 0;
    int n = 0;
    return awg_setup(&n) == cudaSuccess ? n : -1;
}

cudaError_t mlacu_awg_launch(const mlacu_awg_args *a, int64_t T, cudaStream_t s) {
    if (a->H <= 0 || a->H % AW_M || T <= 0 || T > 65535 || a->splits < 1) return cudaErrorInvalidValue;
    cudaError_t err = awg_setup(nullptr);
    if (err != cudaSuccess) return err;
    const dim3 grid((unsigned)(a->H / AW_M), (unsigned)a->splits, (unsigned)T);
    mlacu_launch(awg_kernel, grid, AW_T, AW_SMEM, s, *a);
    return cudaGetLastError();
}
