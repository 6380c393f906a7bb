/* attn_wg_cuda: absorbed MLA attention on the warpgroup tensor cores (sm_90a): decode over long
 * caches and prompt steps over DSA-selected keys; see attn_wg_cuda.h.
 *
 * Block = (group of 64 heads, split, token), two warpgroups (256 threads), one block an SM. The
 * heads are wgmma's M (64 rows), keys the N of S = Q K^T and the K of O = P V, the 576 latent +
 * rope columns the K of S and the 512 latent ones the N of P V. Shared memory (220 KB): the
 * block's queries (times the softmax scale and log2 e, fp16), two key tiles of 64 cache rows, the
 * rows' maxima and sums, four mbarriers and the cache rows of two pairs of tiles. Every operand
 * sits in the K-major layout with the 128-byte swizzle, 64 columns (128 bytes) a k-block, 16-byte
 * chunk c of row r at chunk c ^ (r % 8), 8-row groups 1024 bytes apart:
 * - queries: 9 k-blocks of 64 rows; keys: 9 k-blocks of 64 rows a tile (8 latent, the rope last).
 * - P V: V is the same key tile, read as the B operand in its MN-major form (the latent columns
 *   are V's N, contiguous in a row): the descriptor steps 64 columns by LBO (8192, a k-block) and
 *   8 keys by SBO (1024). Warpgroup w keeps O's columns 256 w .. +256 (m64n256k16, 128 fp32
 *   accumulators a thread), from k-blocks 4 w .. 4 w + 3 of every tile.
 * The schedule (FlashMLA's "seesaw" idea, our code) takes the tiles in pairs, 2 i in buffer 0 and
 * 2 i + 1 in buffer 1, warpgroup w the scores of tile 2 i + w (36 m64n64k16 steps, both operands
 * by descriptor), both warpgroups at once:
 * - each writes its rows' maxima; after a barrier both take the pair's new maximum m (the same
 *   bits), turn their scores into P = 2^(S - m) (registers, fp16) and rescale O and the row sums
 *   by 2^(m_old - m);
 * - each writes its P over its tile's rope k-block (read by no one after the scores) and puts O
 *   += P V of its own tile on the tensor cores with P from registers; after a second barrier, O
 *   += P' V' of the other tile with the other warpgroup's P from shared memory.
 * Copies: cp.async (16 bytes, zeros past the split's keys), eight threads a row's 128 bytes of a
 * k-block, the rows listed in shared memory a pair ahead (a DSA selection looked up there); a
 * tile in two parts, each landing on its own mbarrier and copied again (tile + 2) by the
 * warpgroup that reads it last, right after its last product on it: warpgroup w's latent half of
 * its own tile after its first product, its half of the other tile (with the other's P in the
 * rope k-block) after its second. The scores take their own warpgroup's part first (copied
 * earlier). On an H200 (2026-12-03, V3's 128 heads, batch 8, 128k keys, kernel and combine)
 * 645 us, where the kernel before (warpgroup 0's scores and softmax, then both products, one
 * after the other, one tile at a time) took 808; the same schedule with each thread copying
 * 32-byte pieces of one row took 961 (a warp's copy then touched 16 rows, not 4). Checked against
 * the CPU reference in mla-gpu-check (--attnlong, the "wg" rows). */
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
constexpr int AW_PKB = AW_KB - 1;           /* the rope k-block, where P goes once the scores are done */
/* the queries, two tiles, the rows' maxima and sums ([2][64] each), four mbarriers, the rows of
 * two pairs of tiles, alignment */
constexpr size_t AW_SMEM = (size_t)AW_Q + 2 * AW_TILE + 4 * AW_M * 4 + 4 * 8 + 4 * AW_NK * sizeof(void *) + 1024;
static_assert(AW_NK == 64 && AW_M == 64, "P one k-block, one warpgroup's M");
static_assert(AW_L == 2 * 4 * 64 && AW_PKB == 8, "each warpgroup four latent k-blocks; the rope one last");

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
/* O += P V: m64n256k16, A = P from registers (S's accumulator layout packed to fp16 pairs: the
 * pair of keys 2 t4, +1 of rows g, g + 8, then keys 8 + 2 t4), B (MN-major) by descriptor */
static __device__ __forceinline__ void aw_mma_pv_r(float (&d)[128], const uint32_t *p, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, "
        "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(p[0]), "r"(p[1]), "r"(p[2]), "r"(p[3]), "l"(db));
}
#endif

__global__ void __launch_bounds__(AW_T, 1) awg_kernel(mlacu_awg_args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(16) uint8_t aw_raw[];
    uint8_t *sm = aw_raw + ((1024u - (wga_u32(aw_raw) & 1023u)) & 1023u);
    uint8_t *qs = sm, *ks = sm + AW_Q;
    float *xm = (float *)(ks + 2 * AW_TILE); /* [2][64]: each warpgroup's rows' maxima of its tile */
    float *red = xm + 2 * AW_M;              /* [2][64]: the rows' sums at the end */
    uint64_t *full = (uint64_t *)(red + 2 * AW_M); /* [buffer][warpgroup]: a part of a tile landed */
    const __half **rows = (const __half **)(full + 4); /* [pair & 1][tile & 1][64]: the rows (NULL: none) */
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
    const int ntile = k0 < k1 ? (int)((k1 - k0 + AW_NK - 1) / AW_NK) : 0;
    auto row_at = [&](int64_t k) -> const __half * {
        if (k >= k1) return nullptr;
        const int64_t key = a.sel ? a.sel[t * a.sel_stride + k] : k;
        return tab ? paged_row_t<__half>(tab, a.tab_off, AW_ROW, key) : a.kv + key * AW_ROW;
    };
    /* tile j's list of rows (pair j / 2), filled by 64 of warpgroup w's threads */
    auto rows_list = [&](int j) { return rows + ((j >> 1) & 1) * 2 * AW_NK + (j & 1) * AW_NK; };
    auto rows_of = [&](int j) {
        if ((tid & 127) < AW_NK) rows_list(j)[tid & 127] = row_at(k0 + (int64_t)j * AW_NK + (tid & 127));
    };
    if (tid == 0) {
        for (int i = 0; i < 4; i++) mlacu_mbar_init(&full[i], 128); /* a warpgroup's threads */
        mlacu_mbar_init_fence();
    }
    rows_of(wg);
    __syncthreads();
    /* Warpgroup w's part of tile j (in buffer j & 1): latent k-blocks 4 w .. 4 w + 3, and the rope
     * k-block where the other warpgroup takes the tile's scores (it reads that k-block last, as
     * its P). Thread: chunk cc of rows cr + 16 v of each k-block (eight threads a row's 128
     * bytes). Lands on full[j & 1][w]. */
    const int cr = (tid & 127) >> 3, cc = tid & 7;
    auto issue = [&](int j) {
        uint8_t *kd = ks + (j & 1) * AW_TILE;
        const bool rope = (j & 1) != wg;
        const __half *const *rj = rows_list(j);
        const __half *src[4];
#pragma unroll
        for (int v = 0; v < 4; v++) src[v] = rj[cr + 16 * v];
#pragma unroll
        for (int q = 0; q < 5; q++) {
            if (q == 4 && !rope) break;
            const int kb = q < 4 ? 4 * wg + q : AW_PKB;
#pragma unroll
            for (int v = 0; v < 4; v++)
                cp_async16_zfill(kd + kb * AW_BLK + wga_sw(cr + 16 * v, cc),
                                 src[v] ? (const void *)(src[v] + kb * 64 + cc * 8) : (const void *)a.qa, src[v] != nullptr);
        }
        mlacu_cp_async_arrive(&full[(j & 1) * 2 + wg]);
    };
    if (ntile > 0) issue(0);
    if (ntile > 1) issue(1);
    if (early) mlacu_pdl_wait();
    /* split: the next kernel (the combine) is scheduled at the last pair of tiles; else now */
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
    wga_fence_proxy(); /* the queries, to wgmma's proxy */
    __syncthreads();
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.f;
    /* the thread's rows: r0 and r0 + 8 of the 64 (its warp's 16) */
    const int r0 = wq * 16 + g;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
    uint32_t p[16] = {};
    const uint32_t q0 = wga_u32(qs), kmine = wga_u32(ks) + (uint32_t)wg * AW_TILE, koth = wga_u32(ks) + (uint32_t)(wg ^ 1) * AW_TILE;
    for (int i = 0; 2 * i < ntile; i++) {
        const int ta = 2 * i, tm = ta + wg, to = ta + (wg ^ 1); /* the pair; this warpgroup's tile, the other's */
        const bool mine = tm < ntile, oth = to < ntile;
        const uint32_t par = (uint32_t)i & 1u;
        if (late && ta + 2 >= ntile) mlacu_pdl_trigger();
        rows_of(ta + 2 + wg); /* the next pair's rows, read at this pair's end (after the barriers) */
        float s[32];
        float mx[2] = {-INFINITY, -INFINITY};
        if (mine) { /* S of tile tm: rows r0, r0 + 8 x keys 8 i + 2 t4 + e in s[4 i + 2 hf + e] */
#pragma unroll
            for (int k = 0; k < 32; k++) s[k] = 0.f;
            wga_pin(s);
            mlacu_mbar_wait(&full[wg * 2 + wg], par); /* its own part first: copied earlier */
            wga_fence_proxy();
            wga_fence();
#pragma unroll
            for (int kk = 0; kk < 16; kk++) {
                const uint32_t off = (uint32_t)((4 * wg + (kk >> 2)) * AW_BLK + (kk & 3) * 32);
                wga_mma_s64(s, wga_desc_k(q0 + off), wga_desc_k(kmine + off));
            }
            mlacu_mbar_wait(&full[wg * 2 + (wg ^ 1)], par);
            wga_fence_proxy();
#pragma unroll
            for (int kk = 0; kk < 20; kk++) {
                const int kb = kk < 16 ? 4 * (wg ^ 1) + (kk >> 2) : AW_PKB;
                const uint32_t off = (uint32_t)(kb * AW_BLK + (kk & 3) * 32);
                wga_mma_s64(s, wga_desc_k(q0 + off), wga_desc_k(kmine + off));
            }
            wga_commit();
            wga_wait0();
            wga_pin(s);
            const int64_t nvalid = k1 - (k0 + (int64_t)tm * AW_NK);
#pragma unroll
            for (int k = 0; k < 8; k++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float v = 8 * k + 2 * t4 + (e & 1) < nvalid ? s[4 * k + e] : -INFINITY;
                    s[4 * k + e] = v;
                    mx[e >> 1] = fmaxf(mx[e >> 1], v);
                }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            }
        }
        if (t4 == 0) {
            xm[wg * AW_M + r0] = mx[0];
            xm[wg * AW_M + r0 + 8] = mx[1];
        }
        mlacu_bar_sync(1, AW_T); /* both tiles' maxima */
        float al[2], sum[2] = {0.f, 0.f};
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float mn = fmaxf(m_r[r], fmaxf(xm[r0 + 8 * r], xm[AW_M + r0 + 8 * r]));
            al[r] = wga_ex2(m_r[r] - mn);
            m_r[r] = mn;
        }
        if (mine) { /* P = 2^(S - m): registers for this warpgroup's product, the rope k-block for the other's */
            uint8_t *pd = ks + wg * AW_TILE + AW_PKB * AW_BLK;
#pragma unroll
            for (int k = 0; k < 8; k++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[4 * k + e] = wga_ex2(s[4 * k + e] - m_r[e >> 1]);
                    sum[e >> 1] += s[4 * k + e];
                }
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    p[2 * k + hf] = wga_h2(s[4 * k + 2 * hf], s[4 * k + 2 * hf + 1]);
                    *(uint32_t *)(pd + wga_sw(r0 + 8 * hf, k) + 4 * t4) = p[2 * k + hf];
                }
            }
            wga_fence_proxy(); /* P, to wgmma's proxy */
        }
#pragma unroll
        for (int r = 0; r < 2; r++) l_r[r] = l_r[r] * al[r] + sum[r];
        wga_scale_rows(o, al);
        /* O[:, 256 wg ..] += P V of its own tile (columns 256 wg .. = k-blocks 4 wg .. 4 wg + 3;
         * keys 16 kk .. +16 = rows 16 kk of each) */
        wga_pin(o);
        wga_pin_r(p);
        wga_fence();
        if (mine) {
#pragma unroll
            for (int kk = 0; kk < AW_NK / 16; kk++)
                aw_mma_pv_r(o, p + 4 * kk, wga_desc_mn<AW_BLK>(kmine + (uint32_t)(4 * wg * AW_BLK + kk * 16 * 128)));
        }
        wga_commit();
        mlacu_bar_sync(2, AW_T); /* both P in shared memory */
        if (oth) { /* and of the other tile, with the other warpgroup's P */
            mlacu_mbar_wait(&full[(wg ^ 1) * 2 + wg], par);
            wga_fence_proxy();
#pragma unroll
            for (int kk = 0; kk < AW_NK / 16; kk++)
                aw_mma_pv(o, wga_desc_k(koth + (uint32_t)(AW_PKB * AW_BLK + kk * 32)),
                          wga_desc_mn<AW_BLK>(koth + (uint32_t)(4 * wg * AW_BLK + kk * 16 * 128)));
        }
        wga_commit();
        wga_wait1(); /* the product of its own tile: its part of that tile is read for the last time */
        wga_pin_r(p);
        if (tm + 2 < ntile) issue(tm + 2);
        wga_wait0();
        wga_pin(o);
        if (to + 2 < ntile) issue(to + 2);
    }
    cp_async_commit(); /* no copy outlives the block (every part copied was waited for) */
    cp_async_wait_all();
    /* the rows' sums: the four lanes of a row, then the two warpgroups */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l_r[r] += __shfl_xor_sync(0xffffffffu, l_r[r], 1);
        l_r[r] += __shfl_xor_sync(0xffffffffu, l_r[r], 2);
    }
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
