/* gemvs_cuda: the streamed integer GEMV, the small-batch decode path of the common quantized
 * types (Q4_K, Q6_K, Q8_0, Q5_0): dense steps of 1 .. GS_NP tokens and the experts of a MoE plan with
 * up to GS_NP pairs a tile. API: kernels/gemvs_cuda.h (internal to kernels/).
 *
 * Why a second GEMV: the per-warp GEMV of mm_gemvq_cuda.cu (any type, 1-8 tokens) gives each lane
 * its own 32-element units along a row: every unit pays a scale decode and its share of a warp
 * sum, and every row makes every lane load its part of x again. Profiled at 18432 x 7168 Q4_K it
 * issues ~200 warp instructions per 32 units and streams at 34-42% of the copy rate. Here:
 *
 * - Items are 128 elements (half a Q4_K or Q6_K block, four Q8_0 or Q5_0 blocks), so one scale decode,
 *   a few wide shared-memory reads and 32 dp4a serve 128 weights. Q4_K's high nibbles are dotted
 *   in place (masked, x16, the factor folded into the scale); its minima and Q6_K's -32 offset go
 *   through the activation block sums.
 * - Columns are stationary: a block is G groups of TPG threads (the row's items rounded up to 16
 *   or to a warp); thread i of a group owns item i of every row and keeps its 128 activations
 *   (int8) and their scales in registers, loaded once (over a MoE plan: again when the x row
 *   changes).
 * - Rows stream: a block owns a contiguous run of stages; a stage is R = G x RG whole rows of each
 *   of NM matrices (NM = 2: gate and up), one contiguous byte range each (about gs_tune's bytes
 *   in all), which one thread brings into shared memory with a bulk copy (TMA) on an mbarrier,
 *   stages - 1 stages ahead. Group j takes rows j RG .. j RG + RG - 1; the warps' sums meet in
 *   shared memory and are stored one stage later.
 * - Over a MoE plan a stage is a tile's row range. Each token of a dense step, each pair of a tile,
 *   is one step over the stage in shared memory: W is read from memory once whatever their number;
 *   the item arithmetic is paid per token (what bounds this kernel from ~4-8 tokens).
 * - Steps of one token (a batch-1 decode step, a plan's tiles of one pair) take a warp-specialized
 *   form of it, gemvw_kernel: one warp copies and stores, the others only wait for a stage and
 *   dot it; stages pass between them on mbarriers, with no block barrier. Its consumers dot two
 *   rows at a time and sum their lanes together (Q4_K, Q8_0, Q5_0). At V3's shapes (H200,
 *   2026-11-30, a launch in a chain, against the other kernel in the same call): dense down
 *   25.6 -> 23.6 us, the output matrix 216 -> 186 (measured on an H200, 2026-11-30).
 *   Both forms give the same bits: gs_dot rounds every float step as written (gemvs_item.h).
 *   Asked for it (gate + up of a token's FFN, the next product's input), that kernel also rounds y
 *   into a q8 buffer itself: the kernel after it (mla_cuda_quantize_q8) is gone, the same bytes.
 *
 * The weights must be padded as mla_cuda_weight_bytes says: a copy ends at the next 16 bytes. */
#include <cuda_runtime.h>
#include <string.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda_internal.h"
#include "kernels/cuda_quant_unit.h"
#include "kernels/gemvs_cuda.h"
#include "kernels/gemvs_item.h"

extern "C" {
#include "common/mla_switch.h"
#include "kernels/quant.h"
}

namespace mlacu {

/* blocks of 256 threads, or of two groups up to 320 (rows of 129-160 items: 18432 elements) */
constexpr int GS_THREADS = 256, GS_THREADS_MAX = 320, GS_STAGES_MAX = 8, GS_RG_MAX = 8;
constexpr int GS_NP = MLACU_MOE_TILE; /* pairs a tile (tokens of a dense step) at most */
/* Stage buffers a block (copies in flight: one fewer) and the bytes of W a stage aims at, for the
 * warp-specialized kernel (one token) and for the other one. The one-token kernel takes two
 * stages of 80 KB (one block an SM): a product's first 160 KB a block are asked for before the
 * wait on the kernel before, and a launch ends in fewer, longer stages. Against three of 32 KB
 * (two blocks an SM) a whole model's batch-1 step on an H200 was 4-5% shorter (DeepSeek-V3 and
 * GLM-5 shapes) and 2% (V2-Lite), 2026-12-04; batch 8 (the other kernel, kept at three of 32 KB)
 * the same. MLA_CUDA_GS=STAGES:BYTES (both) or STAGES:BYTES/STAGES:BYTES (warp-specialized /
 * other; 2-8, 4096-131072) overrides them (a developer switch of common/mla_switch.c, read once a
 * process: for measurements). */
struct gs_cfg {
    int stages, target;
};
struct gs_tune {
    gs_cfg ws = {2, 81920}, other = {3, 32768};
};
static const gs_tune &gs_tuning() {
    static const gs_tune t = [] {
        gs_tune v;
        const char *e = mla_sw_str(MLA_SW_CUDA_GS);
        if (!e || !*e) return v;
        int a = 0, b = 0, c = 0, d = 0;
        const int n = sscanf(e, "%d:%d/%d:%d", &a, &b, &c, &d);
        auto ok = [](int st, int by) { return st >= 2 && st <= GS_STAGES_MAX && by >= 4096 && by <= 131072; };
        if ((n == 2 && ok(a, b)) || (n == 4 && ok(a, b) && ok(c, d))) {
            v.ws = {a, b};
            v.other = n == 4 ? gs_cfg{c, d} : gs_cfg{a, b};
        } else
            fprintf(stderr, "MLA_CUDA_GS=%s ignored: expected STAGES:BYTES[/STAGES:BYTES], 2-%d and 4096-131072\n", e,
                    GS_STAGES_MAX);
        return v;
    }();
    return t;
}
constexpr int GS_SMEM_MAX = 200 << 10; /* longer rows than a stage of this allows: not this kernel */
constexpr int GS_SMEM_STATIC = 4 << 10; /* the kernel's own shared memory (sums, barriers), rounded up */

/* the dynamic shared memory a block may have here: GS_SMEM_MAX, or less on devices that give
 * less (sm_86/89/120: ~100 KB a block; there, longer rows take the per-warp GEMV) */
static int gs_smem_limit() { return std::min(GS_SMEM_MAX, mlacu_smem_optin() - GS_SMEM_STATIC); }

/* Dense (GRP false): y[t][row] = W[0] row . x row t for the T tokens; with G0 > 0 (NM = 1) the
 * row groups from G0 on are those of a second matrix on the same x, W2 (out2 rows) into y2. Grouped (GRP): over a MoE
 * plan's tiles (as gemvq_grp_kernel): tile i holds tile_n[i] (1 .. GS_NP) pairs of expert tile_e[i],
 * p = sorted[tile_s[i] + j], which read x row p / x_div and write y row p; expert e's matrix m
 * starts at W[m] + (e / world) * estride. NM = 2: y = silu(W[0] x) * (W[1] x). */
struct gs_args {
    const uint8_t *W[2], *W2;
    size_t estride;
    int rb, out, ni, R, RG, TPG, msb, x_div, world, T, out2, G0, stages;
    bool singles; /* grouped: only the plan's first n_tiles[1] tiles, of one pair each */
    bool settled; /* grouped: the plan may be read before the wait (mla_cuda_moe_plan.settled) */
    unsigned long long *trace; /* warp-specialized: per-block time stamps (gemvs_set_trace), or NULL */
    int8_t *yq;  /* warp-specialized: y's q8 buffer (its int8 rows, ys its unit scales), or NULL */
    float4 *ys;
    int uslot;   /* yq: the launch's row of gs_units */
    const uint4 *qx;
    const float4 *sx;
    const int32_t *sorted, *tile_e, *tile_s, *tile_n, *n_tiles;
    float *y, *y2;
};

/* the sum over the aligned run of n lanes (16 or 32) holding v (every shuffle taken, the adds
 * predicated: no branch) */
__device__ __forceinline__ float gs_lane_sum(float v, int n) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float t = __shfl_xor_sync(0xffffffffu, v, o);
        if (o < n) v += t;
    }
    return v;
}
/* two of them at once (the same sums, their shuffles interleaved) */
__device__ __forceinline__ void gs_lane_sum2(float &a, float &b, int n) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ta = __shfl_xor_sync(0xffffffffu, a, o), tb = __shfl_xor_sync(0xffffffffu, b, o);
        if (o < n) a += ta, b += tb;
    }
}

/* Where the stages of a launch come from: stage (row group) g of matrix m, for the old kernel and
 * the warp-specialized one alike. Grouped: the plan's tiles times gpm row groups each. */
template <int NM, bool GRP> struct gs_map {
    const gs_args &A;
    int gpm; /* row groups a matrix */
    __device__ __forceinline__ explicit gs_map(const gs_args &a) : A(a), gpm((a.out + a.R - 1) / a.R) {}
    /* the launch's stages (grouped: reads the plan, so after the wait on the kernel before) */
    __device__ __forceinline__ int groups() const {
        return GRP ? gpm * A.n_tiles[A.singles ? 1 : 0] : A.G0 > 0 ? A.G0 + (A.out2 + A.R - 1) / A.R : gpm;
    }
    /* this block's stages g0 .. g1 - 1: an even share, contiguous */
    __device__ __forceinline__ void span(int &g0, int &g1) const {
        const int n = groups();
        g0 = (int)((int64_t)blockIdx.x * n / gridDim.x), g1 = (int)((int64_t)(blockIdx.x + 1) * n / gridDim.x);
    }
    __device__ __forceinline__ int tile_of(int g) const { return GRP ? g / gpm : 0; }
    __device__ __forceinline__ bool second(int g) const { return !GRP && A.G0 > 0 && g >= A.G0; } /* of W2 */
    __device__ __forceinline__ int rg_of(int g) const { return GRP ? g % gpm : second(g) ? g - A.G0 : g; }
    __device__ __forceinline__ int out_of(int g) const { return second(g) ? A.out2 : A.out; }
    __device__ __forceinline__ int nrow(int g) const { return min(A.R, out_of(g) - rg_of(g) * A.R); }
    /* where the rows of group g start in matrix m (e: the tile's expert; grouped only) */
    __device__ __forceinline__ const uint8_t *rows_at(int g, int m, int e) const {
        const size_t eo = GRP ? (size_t)(e / A.world) * A.estride : 0;
        return (second(g) ? A.W2 : m ? A.W[1] : A.W[0]) + eo + (size_t)rg_of(g) * A.R * A.rb;
    }
    /* a row's output from its sums s[m] over each matrix m: y (or y2, s2) [p][row] */
    __device__ __forceinline__ void put(bool s2, int p, int row, const float (&s)[2]) const {
        const int out = s2 ? A.out2 : A.out;
        (s2 ? A.y2 : A.y)[(size_t)p * out + row] = NM == 2 ? mlacu_swiglu(s[0], s[NM - 1]) : s[0];
    }
    /* one thread: group g's rows of each matrix into the stage buffer dst (matrix m at m msb),
     * each copy from the 16-aligned address below its rows, completion on bar */
    __device__ __forceinline__ void issue(int g, int e, uint8_t *dst, uint64_t *bar) const {
        const int n = nrow(g);
        const uint8_t *src[NM];
        uint32_t bytes[NM], all = 0;
#pragma unroll
        for (int m = 0; m < NM; m++) {
            const uint8_t *s0 = rows_at(g, m, e);
            src[m] = (const uint8_t *)((uintptr_t)s0 & ~(uintptr_t)15);
            bytes[m] = (uint32_t)(((uintptr_t)(s0 + (size_t)n * A.rb) + 15) / 16 * 16 - (uintptr_t)src[m]);
            all += bytes[m];
        }
        mlacu_mbar_expect(bar, all);
#pragma unroll
        for (int m = 0; m < NM; m++) mlacu_bulk_g2s_once(dst + m * A.msb, src[m], bytes[m], bar);
    }
};

/* Blocks of G groups of TPG threads (blockDim.x = G TPG); thread ti of a group owns item ti. A
 * block walks its stages; each stage (R rows of a tile, or of W) takes one step per pair (token):
 * the pair's x into registers when its row changes, the stage's rows dotted with it, the sums
 * into red[step & 1], stored after the next step's barrier. */
template <int TY, int NM, bool GRP>
__global__ void __launch_bounds__(GS_THREADS_MAX, 2) gemvs_kernel(const gs_args A) {
    /* the plan of a MoE step (tile list and count) comes from the kernel before */
    if (GRP) mlacu_pdl_enter();
    extern __shared__ __align__(16) uint8_t gs_sm[];
    __shared__ float red[2][GS_THREADS_MAX / 16][NM][GS_RG_MAX];
    __shared__ uint64_t full[GS_STAGES_MAX];
    const gs_map<NM, GRP> M(A);
    const int NS = A.stages;
    const int tid = threadIdx.x, lane = tid & 31;
    const int R = A.R, RG = A.RG;
    int g0, g1;
    M.span(g0, g1);
    const int sb = NM * A.msb;
    const int grp = tid / A.TPG, ti = tid % A.TPG;
    /* a group's partial sums: one per warp (TPG >= 32) or per group (TPG 16: two groups a warp) */
    const int run = min(A.TPG, 32), part = tid / run, ppg = A.TPG / run;
    auto expert = [&](int g) { return GRP ? A.tile_e[M.tile_of(g)] : 0; };
    auto issue = [&](int g, int buf) { /* thread 0 */
        if (g < g1) M.issue(g, expert(g), gs_sm + (size_t)buf * sb, &full[buf]);
    };
    /* step c's sums (pair p, rows of row group rg, of W2 with s2) to y: a thread a row */
    auto store = [&](int c, int p, int rg, bool s2) {
        const int r = tid, row = rg * R + r, out = s2 ? A.out2 : A.out;
        if (r >= R || row >= out) return;
        const int gr = r / RG, rr = r % RG;
        float s[2] = {0.f, 0.f};
#pragma unroll
        for (int m = 0; m < NM; m++)
            for (int w = 0; w < ppg; w++) s[m] += red[c & 1][gr * ppg + w][m][rr];
        M.put(s2, p, row, s);
    };
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < NS; s++) mlacu_mbar_init(&full[s], 1);
        mlacu_mbar_init_fence();
#pragma unroll
        for (int s = 0; s < NS - 1; s++) issue(g0 + s, s);
    }
    /* a dense product's first stages are weights only, so they are already on their way while
     * the kernel before finishes (programmatic launch); x and y wait for it */
    if (!GRP) mlacu_pdl_enter();
    __syncthreads();
    gs_x<TY> x;
    int xrow = -1, c = 0, pp = 0, prg = 0; /* steps so far; the last one's pair and row group */
    bool ps2 = false;
    for (int k = 0; g0 + k < g1; k++) {
        const int g = g0 + k, rg = M.rg_of(g), out = M.out_of(g);
        mlacu_mbar_wait(&full[k % NS], (uint32_t)(k / NS) & 1u); /* stage k landed */
        const int n = GRP ? A.tile_n[M.tile_of(g)] : A.T;
        if (n < 1 || n > GS_NP) __trap(); /* plans hold 1 .. GS_NP pairs a tile; the host checks T */
        const uint8_t *st[NM];
        const int e = expert(g);
#pragma unroll
        for (int m = 0; m < NM; m++) /* the copy started at the 16-aligned address below the rows */
            st[m] = gs_sm + (size_t)(k % NS) * sb + m * A.msb + ((uintptr_t)M.rows_at(g, m, e) & 15);
        for (int j = 0; j < n; j++, c++) {
            __syncthreads(); /* step c - 1's sums are in; at j = 0, stage k - 1's buffer is free */
            if (c > 0) store(c - 1, pp, prg, ps2);
            if (j == 0 && tid == 0) {
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* our reads, then the copy */
                issue(g + NS - 1, (k + NS - 1) % NS);
            }
            const int p = GRP ? A.sorted[A.tile_s[M.tile_of(g)] + j] : j;
            const int xr = GRP ? p / A.x_div : j;
            if (xr != xrow) { /* block-uniform */
                xrow = xr;
                if (ti < A.ni) gs_load_x<TY>(A.qx, A.sx, (size_t)xr * A.ni * 4, ti, x);
            }
            for (int rr = 0; rr < RG; rr++) {
                const int r = grp * RG + rr, row = rg * R + r;
                float acc[NM];
#pragma unroll
                for (int m = 0; m < NM; m++) {
                    acc[m] = 0.f;
                    if (row < out && ti < A.ni) acc[m] = gs_dot<TY>(st[m] + (size_t)r * A.rb, ti, x);
                    acc[m] = gs_lane_sum(acc[m], run);
                }
                if (lane % run == 0)
#pragma unroll
                    for (int m = 0; m < NM; m++) red[c & 1][part][m][rr] = acc[m];
            }
            pp = p, prg = rg, ps2 = M.second(g);
        }
    }
    __syncthreads();
    if (c > 0) store(c - 1, pp, prg, ps2);
}

/* The q8 rounding of y (A.yq) inside the warp-specialized kernel: a 32-row unit of y row p is
 * rounded by the producer warp that stores its last rows. A block's stages are a contiguous run,
 * so most units lie inside one block's run: its producer counts their rows itself and rounds them
 * from its own stores. A unit shared with another block (the first and the last of a run) is
 * counted in gs_units[slot][p out / 32 + u] once the block's stages are all stored (a fence
 * earlier would wait on the copies in flight); the warp that brings the count to 32 rounds it
 * (after the other block's stores, fenced before they were counted) and sets the count back to 0,
 * so that every launch finds its row at 0 (launches rotate over GS_USLOTS rows, host side:
 * kernels on two streams at once do not share one). Values are rounded as q8x_kernel would
 * (mlacu_q8_units_warp). */
constexpr int GS_USLOTS = 8, GS_UNITS_MAX = 4096;
__device__ int gs_units[GS_USLOTS][GS_UNITS_MAX];

/* a unit of y: pair p, unit u (-1: none), n of its rows stored by this block */
struct gs_unit {
    int p = 0, u = -1, n = 0;
    /* round it (shared: after other blocks' stores, read from L2) */
    __device__ __forceinline__ void round(const gs_args &A, int lane, bool shared) const {
        const size_t o = (size_t)p * A.out + (size_t)u * 32;
        const float v[1] = {shared ? __ldcg(A.y + o + lane) : A.y[o + lane]};
        mlacu_q8_units_warp<1>(v, A.yq + o, A.ys + o / 32, 32, 1);
    }
    /* count this block's rows of a shared unit (after a fence over them); the last to count rounds it */
    __device__ __forceinline__ void count(const gs_args &A, int lane) const {
        if (u < 0) return;
        int *cnt = gs_units[A.uslot] + (size_t)p * (A.out / 32) + u;
        int last = 0;
        if (lane == 0) last = atomicAdd(cnt, n) + n == 32;
        if (__shfl_sync(0xffffffffu, last, 0)) {
            __threadfence(); /* the other block's stores, fenced before it counted them */
            round(A, lane, true);
            if (lane == 0) *cnt = 0;
        }
    }
};
/* The producer warp's units (every lane holds the same) */
struct gs_units_of_run {
    gs_unit first, cur; /* the run's first unit, where shared; the unit in progress */
    /* rows row0 .. row0 + nrow - 1 of pair pp are stored (by this warp) */
    __device__ __forceinline__ void stored(const gs_args &A, int pp, int row0, int nrow, int lane) {
        for (int uu = row0 / 32; uu * 32 < row0 + nrow; uu++) {
            const int k = min(row0 + nrow, uu * 32 + 32) - max(row0, uu * 32);
            if (uu != cur.u || pp != cur.p) {
                if (cur.u >= 0) { /* left unfinished: shared with the block before (once a run) */
                    if (first.u >= 0) __trap();
                    first = cur;
                }
                cur.p = pp, cur.u = uu, cur.n = 0;
            }
            cur.n += k;
            if (cur.n == 32) { /* all of it from this warp: no count */
                __syncwarp();
                cur.round(A, lane, false);
                cur.u = -1;
            }
        }
    }
    /* the run is stored: count its shared units */
    __device__ __forceinline__ void end(const gs_args &A, int lane) const {
        if (first.u < 0 && cur.u < 0) return;
        __threadfence(); /* our stores, before the counts */
        __syncwarp();
        first.count(A, lane);
        cur.count(A, lane);
    }
};

/* ---- the warp-specialized form: one step a stage (a dense step of one token, a plan's tiles
 * of one pair), no block barrier a stage.
 *
 * The block's last warp is the producer, the G TPG threads before it consume. The producer posts
 * stage k: its descriptor (below) into desc[k mod 2 NS], and the bulk copy of its rows into
 * buffer k mod NS on full[]. A consumer warp waits on full[], dots its rows, writes its partial
 * sums into slot k mod 2 NS of red, and arrives on empty[] (one arrival a warp). Once empty[] has
 * all of them the producer posts stage k + NS into the buffer, then adds stage k's partial sums
 * (in the order the other kernel adds them: the same bits) and stores them (with A.yq, then
 * rounds their 32-row units: gs_units_of_run above). Slots of desc and red are 2 NS, so that
 * stage k's are still there after stage k + NS is posted; they are reused by stage k + 2 NS,
 * posted only after that. */
struct gs_desc {
    int off[2]; /* where matrix m's rows start in the buffer (the copies start 16-aligned below) */
    int xr, p;  /* x row, y row */
    int row0, nrow, s2, pad; /* the rows (first, count), of W2 */
};
constexpr int GS_WS_CONSUMERS = GS_THREADS; /* consumer threads a block at most; one warp more produces */

template <int TY, int NM, bool GRP>
__global__ void __launch_bounds__(GS_WS_CONSUMERS + 32, 2) gemvw_kernel(const gs_args A) {
    extern __shared__ __align__(16) uint8_t gs_sm[];
    __shared__ gs_desc desc[2 * GS_STAGES_MAX];
    __shared__ uint64_t full[GS_STAGES_MAX], empty[GS_STAGES_MAX];
    const gs_map<NM, GRP> M(A);
    const int NS = A.stages, NC = (int)blockDim.x - 32, tid = threadIdx.x, lane = tid & 31;
    const int RG = A.RG, run = min(A.TPG, 32), parts = NC / run, sb = NM * A.msb;
    float *red = (float *)(gs_sm + (size_t)NS * sb); /* [2 NS][parts][NM][RG] */
    auto red_at = [&](int slot, int part, int m, int rr) -> float & {
        return red[((slot * parts + part) * NM + m) * RG + rr];
    };
    if (tid == 0) {
        for (int s = 0; s < NS; s++) mlacu_mbar_init(&full[s], 1), mlacu_mbar_init(&empty[s], (uint32_t)(NC / 32));
        mlacu_mbar_init_fence();
    }
    __syncthreads();
    int g0 = 0, g1 = 0;
    if (tid >= NC) { /* ---- the producer warp */
        int ce = 0, cp = 0; /* grouped: the expert and pair of stage (k & ~31) + lane */
        auto post = [&](int k) { /* all lanes; lane 0 posts */
            const int e = __shfl_sync(0xffffffffu, ce, k & 31), p = __shfl_sync(0xffffffffu, cp, k & 31);
            if (lane != 0) return;
            const int g = g0 + k;
            gs_desc d;
#pragma unroll
            for (int m = 0; m < 2; m++) d.off[m] = m < NM ? (int)((uintptr_t)M.rows_at(g, m, e) & 15) : 0;
            d.xr = GRP ? p / A.x_div : 0, d.p = p;
            d.row0 = M.rg_of(g) * A.R, d.nrow = M.nrow(g), d.s2 = M.second(g), d.pad = 0;
            desc[k % (2 * NS)] = d;
            M.issue(g, e, gs_sm + (size_t)(k % NS) * sb, &full[k % NS]);
        };
        auto fetch = [&](int k) { /* grouped: stages k .. k + 31's tiles, a lane each */
            const int g = g0 + k + lane;
            if (!GRP || g >= g1) return;
            const int t = M.tile_of(g);
            if (A.tile_n[t] != 1) __trap(); /* the host sends plans of one pair a tile only */
            ce = A.tile_e[t], cp = A.sorted[A.tile_s[t]];
        };
        /* tracing (gemvs_set_trace; dense products only): the block's GS_TRACE_N stamps; the
         * producer's post of stage k at [GS_TRACE_N / 2 + k] */
        unsigned long long *tr = !GRP && A.trace ? A.trace + (size_t)blockIdx.x * GS_TRACE_N : nullptr;
        auto stamp = [&](int k) {
            if (tr && lane == 0 && k < GS_TRACE_N / 2) tr[GS_TRACE_N / 2 + k] = mlacu_gtime();
        };
        gs_units_of_run un; /* A.yq: the units this block stores */
        /* a dense product, or one over a settled plan, posts its first stages before the wait
         * (weights only) */
        const bool early = !GRP || A.settled;
        int pre = 0;
        if (early) {
            M.span(g0, g1);
            for (; pre < NS && pre < g1 - g0; pre++) {
                if ((pre & 31) == 0) fetch(pre);
                post(pre), stamp(pre);
            }
        }
        mlacu_pdl_enter();
        if (!early) M.span(g0, g1);
        const int nk = g1 - g0;
        for (int k = 0; k < nk + NS; k++) {
            __syncwarp();
            if (k >= NS) mlacu_mbar_wait(&empty[k % NS], (uint32_t)(k / NS - 1) & 1u); /* stage k - NS done */
            if (k < nk && k >= pre) {
                if ((k & 31) == 0) fetch(k); /* pre <= NS < 32: stage 0's fetch stays */
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                post(k);
                stamp(k);
            }
            if (k < NS) continue;
            __syncwarp();
            const int slot = (k - NS) % (2 * NS); /* stage k - NS's sums to y */
            const gs_desc d = desc[slot];
            for (int r = lane; r < d.nrow; r += 32) {
                const int gr = r / RG, rr = r % RG, ppg = A.TPG / run;
                float s[2] = {0.f, 0.f};
#pragma unroll
                for (int m = 0; m < NM; m++)
                    for (int w = 0; w < ppg; w++) s[m] += red_at(slot, gr * ppg + w, m, rr);
                M.put(d.s2, d.p, d.row0 + r, s);
            }
            if (A.yq) un.stored(A, d.p, d.row0, d.nrow, lane); /* never with W2 (the host) */
        }
        if (A.yq) un.end(A, lane);
        return;
    }
    /* ---- the consumers (tracing: thread 0 stamps [0] entry, [1] the wait on the kernel before
     * done, [2] its last stage done, [3] the stage count, [4 + k] stage k landed) */
    unsigned long long *tr = !GRP && A.trace && tid == 0 ? A.trace + (size_t)blockIdx.x * GS_TRACE_N : nullptr;
    if (tr) tr[0] = mlacu_gtime();
    mlacu_pdl_enter();
    M.span(g0, g1);
    if (tr) tr[1] = mlacu_gtime(), tr[3] = (unsigned long long)(g1 - g0);
    const int grp = tid / A.TPG, ti = tid % A.TPG, part = tid / run;
    gs_x<TY> x;
    int xrow = -1;
    if (!GRP && ti < A.ni) gs_load_x<TY>(A.qx, A.sx, 0, ti, x), xrow = 0; /* one token: row 0 */
    for (int k = 0, b = 0, ph = 0, slot = 0; k < g1 - g0; k++) {
        mlacu_mbar_wait(&full[b], (uint32_t)ph);
        if (tr && 4 + k < GS_TRACE_N / 2) tr[4 + k] = mlacu_gtime();
        const gs_desc d = desc[slot];
        if (GRP && d.xr != xrow) { /* block-uniform */
            xrow = d.xr;
            if (ti < A.ni) gs_load_x<TY>(A.qx, A.sx, (size_t)d.xr * A.ni * 4, ti, x);
        }
        const uint8_t *st = gs_sm + (size_t)b * sb;
        /* two dots at a time, then their lane sums together: rows rr, rr + 1 of one matrix, or
         * row rr of both (a dot past the group's rows is row rr again, one past the stage's rows
         * is dropped). Q6_K's item is too large for two at once: one row a time. */
        constexpr bool PAIR = TY != GGML_TYPE_Q6_K;
        for (int rr = 0; rr < RG; rr += PAIR ? 3 - NM : 1) {
            const int r = grp * RG + rr;
            if (!PAIR) {
#pragma unroll
                for (int m = 0; m < NM; m++) {
                    float a = 0.f;
                    if (ti < A.ni && r < d.nrow) a = gs_dot<TY>(st + m * A.msb + d.off[m] + (size_t)r * A.rb, ti, x);
                    a = gs_lane_sum(a, run);
                    if ((lane & (run - 1)) == 0) red_at(slot, part, m, rr) = a;
                }
                continue;
            }
            const bool two = NM == 2 || rr + 1 < RG;
            const uint8_t *pa = st + d.off[0] + (size_t)r * A.rb;
            const uint8_t *pb = NM == 2 ? st + A.msb + d.off[1] + (size_t)r * A.rb : two ? pa + A.rb : pa;
            float a = 0.f, c = 0.f;
            if (ti < A.ni) a = gs_dot<TY>(pa, ti, x), c = gs_dot<TY>(pb, ti, x);
            if (r >= d.nrow) a = 0.f;
            if (NM == 1 && r + 1 >= d.nrow) c = 0.f;
            if (NM == 2 && r >= d.nrow) c = 0.f;
            gs_lane_sum2(a, c, run);
            if ((lane & (run - 1)) == 0) {
                red_at(slot, part, 0, rr) = a;
                if (NM == 2) red_at(slot, part, 1, rr) = c;
                else if (two) red_at(slot, part, 0, rr + 1) = c;
            }
        }
        __syncwarp();
        if (lane == 0) mlacu_mbar_arrive(&empty[b]);
        if (++b == NS) b = 0, ph ^= 1;
        if (++slot == 2 * NS) slot = 0;
    }
    if (tr) tr[2] = mlacu_gtime();
    if (tid == 0) MLACU_TRACE_MARK(1);
}

/* ---------------------------------------------------------------- host */
struct gs_geo {
    int TPG, G, RG, R, msb, stages;
    bool ws; /* the warp-specialized kernel (one step a stage) */
    size_t smem;
};

/* whether launches of one step a stage take the warp-specialized kernel: yes, unless
 * mla_cuda_set_gemv_ws(0) (the op checks compare both kernels) */
static int g_gs_ws = 1;
static bool gs_ws_on() { return g_gs_ws != 0; }

/* TPG threads a group (the row's items rounded up to 16 or to a warp), G groups (<= 256 threads,
 * or, but for the warp-specialized kernel, two of up to 160) of RG rows (<= 8), about cf.target
 * bytes a stage, cf.stages of them; rows of whole items */
static bool gs_geometry(int64_t in, int64_t rb, int nm, bool ws, const gs_cfg &cf, gs_geo &g) {
    const int64_t ni = in / 128;
    if (in % 128 || ni < 1 || ni > GS_THREADS) return false;
    g.ws = ws;
    g.TPG = ni <= 16 ? 16 : (int)((ni + 31) / 32 * 32);
    g.G = GS_THREADS / g.TPG;
    if (!ws && g.G == 1 && 2 * g.TPG <= GS_THREADS_MAX) g.G = 2; /* one group of 129-160 threads: five warps a block */
    g.RG = (int)std::max<int64_t>(1, std::min<int64_t>(GS_RG_MAX, (cf.target / nm - 32) / (g.G * rb)));
    g.R = g.G * g.RG;
    g.msb = (int)(((int64_t)g.R * rb + 32 + 15) / 16 * 16);
    const int stages = g.stages = cf.stages;
    g.smem = (size_t)stages * nm * g.msb;
    if (ws) /* the partial sums: 2 NS slots of (threads / run) x NM x RG */
        g.smem += (size_t)2 * stages * (g.G * g.TPG / std::min(g.TPG, 32)) * nm * g.RG * sizeof(float);
    return (int64_t)g.smem <= gs_smem_limit();
}

template <int TY, int NM, bool GRP>
static cudaError_t gs_launch(const gs_args &A, const gs_geo &g, int64_t max_groups, cudaStream_t s) {
    auto kern = g.ws ? gemvw_kernel<TY, NM, GRP> : gemvs_kernel<TY, NM, GRP>;
    static bool attr[2] = {false, false};
    if (!attr[g.ws]) {
        cudaError_t err = mlacu_smem_allow(kern, gs_smem_limit());
        if (err != cudaSuccess) return err;
        attr[g.ws] = true;
    }
    const int threads = g.G * g.TPG + (g.ws ? 32 : 0);
    int bps = 0;
    cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, kern, threads, g.smem);
    if (err != cudaSuccess) return err;
    const int64_t grid = std::min<int64_t>(max_groups, (int64_t)mlacu_sm_count() * std::max(1, bps));
    if (grid <= 0) return cudaSuccess;
    mlacu_launch(kern, (unsigned)grid, threads, g.smem, s, A);
    return cudaGetLastError();
}

template <typename F> static cudaError_t gs_with_type(uint32_t t, F f) {
    switch (t) {
    case GGML_TYPE_Q4_K: return f(std::integral_constant<int, GGML_TYPE_Q4_K>{});
    case GGML_TYPE_Q6_K: return f(std::integral_constant<int, GGML_TYPE_Q6_K>{});
    case GGML_TYPE_Q8_0: return f(std::integral_constant<int, GGML_TYPE_Q8_0>{});
    case GGML_TYPE_Q5_0: return f(std::integral_constant<int, GGML_TYPE_Q5_0>{});
    default: return cudaErrorNotSupported;
    }
}

/* the geometry for type t, rows of `in` elements, nm matrices, steps of one token (one1: the
 * warp-specialized kernel takes them where it fits: in its own stages, else (a device with less
 * shared memory a block) in the other kernel's); false where this kernel does not apply */
static bool gs_plan(uint32_t t, int64_t in, int nm, bool one1, gs_geo &g) {
    const bool k = t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q6_K; /* items are half blocks */
    if (!k && t != GGML_TYPE_Q8_0 && t != GGML_TYPE_Q5_0) return false;
    if (in <= 0 || (k && in % 256) || (nm != 1 && nm != 2)) return false;
    const int64_t rb = (int64_t)ggml_row_bytes(t, in);
    const gs_tune &tu = gs_tuning();
    if (one1 && gs_ws_on() &&
        (gs_geometry(in, rb, nm, true, tu.ws, g) || gs_geometry(in, rb, nm, true, tu.other, g)))
        return true;
    return gs_geometry(in, rb, nm, false, tu.other, g);
}

bool gemvs_supported(uint32_t t, int64_t in, int nm) {
    gs_geo g;
    return gs_plan(t, in, nm, false, g);
}

void gemvs_set_ws(bool on) { g_gs_ws = on; }

static unsigned long long *g_gs_trace = nullptr;
void gemvs_set_trace(unsigned long long *d_stamps) { g_gs_trace = d_stamps; }

static unsigned g_gs_uslot; /* the next launch's row of gs_units, mod GS_USLOTS */

/* A's q8 output: yq (rows rows of A.out) where the warp-specialized kernel takes the launch and
 * gs_units has room; whether it does */
static bool gs_q8out(gs_args &A, const gs_geo &g, void *yq, int64_t rows) {
    if (!yq || !g.ws || A.out % 32 || rows * (A.out / 32) > GS_UNITS_MAX || A.G0 > 0)
        return false;
    A.yq = (int8_t *)yq, A.ys = (float4 *)((uint8_t *)yq + mlacu_q8_scale_off(rows, A.out));
    A.uslot = (int)(__atomic_fetch_add(&g_gs_uslot, 1u, __ATOMIC_RELAXED) % GS_USLOTS);
    return true;
}

static gs_args gs_base(uint32_t t, const void *w0, const void *w1, int64_t in, int64_t out, const void *qx,
                       const void *sx, float *y, const gs_geo &g) {
    gs_args A = {};
    A.W[0] = (const uint8_t *)w0, A.W[1] = (const uint8_t *)(w1 ? w1 : w0);
    A.rb = (int)ggml_row_bytes(t, in), A.out = (int)out, A.ni = (int)(in / 128);
    A.R = g.R, A.RG = g.RG, A.TPG = g.TPG, A.msb = g.msb, A.x_div = 1, A.world = 1, A.T = 1;
    A.stages = g.stages;
    A.qx = (const uint4 *)qx, A.sx = (const float4 *)sx, A.y = y;
    A.trace = g.ws ? g_gs_trace : nullptr;
    return A;
}

cudaError_t gemvs_dense(uint32_t t, const void *w, const void *w1, int64_t in, int64_t out, const void *qx,
                        const void *sx, int64_t T, float *y, void *yq, bool *yq_done, cudaStream_t s) {
    const int nm = w1 ? 2 : 1;
    gs_geo g;
    if (yq_done) *yq_done = false;
    if (T < 1 || T > GS_NP || !gs_plan(t, in, nm, T == 1, g)) return cudaErrorNotSupported;
    gs_args A = gs_base(t, w, w1, in, out, qx, sx, y, g);
    A.T = (int)T;
    if (yq_done) *yq_done = T == 1 && gs_q8out(A, g, yq, 1);
    return gs_with_type(t, [&](auto ty) {
        constexpr int TY = decltype(ty)::value;
        const int64_t groups = (out + g.R - 1) / g.R;
        return w1 ? gs_launch<TY, 2, false>(A, g, groups, s) : gs_launch<TY, 1, false>(A, g, groups, s);
    });
}

cudaError_t gemvs_dense_pair(uint32_t t, const void *wa, int64_t out_a, float *ya, const void *wb, int64_t out_b,
                             float *yb, int64_t in, const void *qx, const void *sx, int64_t T, cudaStream_t s) {
    gs_geo g;
    if (T < 1 || T > GS_NP || !gs_plan(t, in, 1, T == 1, g)) return cudaErrorNotSupported;
    gs_args A = gs_base(t, wa, NULL, in, out_a, qx, sx, ya, g);
    A.T = (int)T;
    A.W2 = (const uint8_t *)wb, A.out2 = (int)out_b, A.y2 = yb;
    A.G0 = (int)((out_a + g.R - 1) / g.R);
    return gs_with_type(t, [&](auto ty) {
        return gs_launch<decltype(ty)::value, 1, false>(A, g, A.G0 + (out_b + g.R - 1) / g.R, s);
    });
}

cudaError_t gemvs_grouped(uint32_t t, const void *w0, const void *w1, size_t estride, int64_t in, int64_t out,
                          const void *qx, const void *sx, int x_div, const mla_cuda_moe_plan *pl, bool singles,
                          float *y, void *yq, int64_t y_rows, bool *yq_done, cudaStream_t s) {
    const int nm = w1 ? 2 : 1;
    gs_geo g;
    if (yq_done) *yq_done = false;
    /* tiles of one pair: those of a singles launch, every one of a plan of one token */
    if (!gs_plan(t, in, nm, singles || pl->tokens <= 1, g)) return cudaErrorNotSupported;
    gs_args A = gs_base(t, w0, w1, in, out, qx, sx, y, g);
    A.estride = estride, A.x_div = x_div, A.world = pl->world;
    A.sorted = pl->sorted, A.tile_e = pl->tile_e, A.tile_s = pl->tile_s, A.tile_n = pl->tile_n;
    A.n_tiles = pl->n_tiles;
    A.singles = singles, A.settled = pl->settled;
    if (yq_done) *yq_done = !singles && pl->tokens <= 1 && gs_q8out(A, g, yq, y_rows);
    const int64_t maxg = pl->max_tiles * ((out + g.R - 1) / g.R);
    return gs_with_type(t, [&](auto ty) {
        constexpr int TY = decltype(ty)::value;
        return w1 ? gs_launch<TY, 2, true>(A, g, maxg, s) : gs_launch<TY, 1, true>(A, g, maxg, s);
    });
}

} // namespace mlacu
