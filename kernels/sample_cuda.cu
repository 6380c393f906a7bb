/* sample_cuda: token sampling on the device (mla_cuda_sample_pieces, kernels/cuda_ops.h), the
 * meaning of sampler_sample_mod (worker/sample.c) without penalties.
 *
 * One block of 1024 threads a row; the row is read again from memory (L2) by each pass, nothing
 * is written but the id. Values: logit + the row's biases (added in the order given, as the host
 * adds them), then -inf where the mask forbids; a value that is not finite is treated as masked.
 * Probabilities p = exp((w - max) / temperature) (float arithmetic, within a few 1e-7 of the
 * host's double) are in [0, 1] and are summed as 44-bit fixed-point integers (p x 2^44 rounded):
 * sums are exact and the same in any order, so shared-memory integer atomics give the same result
 * on every run (no float atomics, no order-dependent reduction).
 *
 * The sorted order (value descending, id ascending on ties) is built only for its head: the
 * tokens within a distance of the largest value, when at most 4096 (sp_fast), sorted in shared
 * memory; where every cut and the draw fall among them (a model's logits, usually) they are
 * walked there. Else (a flat row) the full order is never built. Each cut of it (the
 * top_k-th token, the smallest prefix whose mass reaches top_p x the top_k mass, the token where
 * the draw falls) is "the first token in sorted order whose cumulative count (or mass) reaches X",
 * found by a radix descent over the monotone 32-bit key of the value: a histogram of count and
 * mass over its top 11 bits (made once a row and shared by every descent), then the next 11 and
 * the last 10 bits of the tokens in the chosen bucket (the passes after a level skipped when its
 * chosen bucket holds one token, known by the bucket's smallest id). Tokens of one key have one
 * value, so one mass: the position inside a group of equal values is arithmetic, and the id
 * there (the r-th smallest id of that key) comes from the bucket's smallest id when r is 1, else
 * from one pass in id order. min_p keeps the tokens with p >= min_p (p of the largest is exactly
 * 1), a prefix whose mass one pass sums. Without top_k, top_p and min_p the draw walks the ids in
 * order, as the host does: the mass of each tile of 8192 ids, then the ids of the tile where the
 * draw falls, eight a thread, scanned across the block. */
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <atomic>

#include "kernels/cuda_internal.h"
#include "kernels/cuda_ops.h"

namespace {

constexpr int SP_T = 1024;                    /* threads a block (the scans assume 32 warps) */
constexpr int SP_NB = 2048;                   /* buckets of the first two levels (11 bits); the last: 1024 */
constexpr uint32_t SP_MAXV = 1u << 19;        /* V x 2^44 < 2^63: sums fit */
constexpr int SP_MAXPIECES = 64;              /* so the id-order draw's tiles fit SP_MAXSEG */
constexpr int SP_MAXSEG = SP_MAXV / (SP_T * 8) + SP_MAXPIECES;

/* Must equal mix64 of worker/sample.c (sampler_uniform) bit for bit. */
__device__ __forceinline__ uint64_t sp_mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* Must equal sampler_uniform of worker/sample.c. */
__device__ __forceinline__ double sp_uniform(uint64_t seed, uint64_t stream) {
    const uint64_t r = sp_mix64(sp_mix64(seed) ^ sp_mix64(stream ^ 0x5851f42d4c957f2dull));
    return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

/* the dynamic shared memory of a block (u64 arrays first for alignment); bits: V bits */
struct sp_smem {
    unsigned long long m1[SP_NB], wm[SP_NB]; /* masses: first level (kept), working level */
    uint32_t c1[SP_NB], wc[SP_NB];           /* counts */
    uint32_t id1[SP_NB], wid[SP_NB];         /* the smallest id a bucket: first level, working level */
    int32_t bid[MLA_CUDA_SAMPLE_MAX_BIAS];   /* biased ids, ascending, each once */
    float bval[MLA_CUDA_SAMPLE_MAX_BIAS];    /* their values with every bias added */
    uint8_t bfirst[MLA_CUDA_SAMPLE_MAX_BIAS];
    uint32_t bits[1]; /* [(V + 31) / 32]: 1 where a token is biased */
};
constexpr size_t sp_smem_bytes(uint32_t V) { return offsetof(sp_smem, bits) + ((V + 31) / 32) * 4; }

struct sp_ctx {
    const float *l;  /* the row's piece 0; piece r at l + r * pstride */
    int64_t pstride; /* T x n_piece */
    uint32_t np, V;
    int pieces;
    const uint8_t *allow; /* NULL: every token */
    const uint32_t *bits;
    const int32_t *bid;
    const float *bval;
    int nb; /* distinct biased ids */
    float mx, ih, il; /* the largest value; 1 / temperature as ih + il */
};

/* the value sampler_sample_mod works with (bias, then mask: ok 0), -inf when not finite; -0 is +0 */
__device__ __forceinline__ float sp_fix(const sp_ctx &c, uint32_t i, float v, bool ok) {
    if (!ok) return -INFINITY; /* masked, or past the end */
    if (c.nb && (c.bits[i >> 5] >> (i & 31) & 1u)) {
        int lo = 0, hi = c.nb - 1;
        while (lo < hi) {
            const int m = (lo + hi) >> 1;
            if (c.bid[m] < (int32_t)i) lo = m + 1;
            else hi = m;
        }
        v = c.bval[lo];
    }
    return isfinite(v) ? v + 0.0f : -INFINITY;
}
__device__ __forceinline__ float sp_raw(const sp_ctx &c, uint32_t i) {
    const uint32_t r = i / c.np;
    return c.l[r * c.pstride + (i - r * c.np)];
}

/* f(i, v) for the ids [i0, i1) in order on one thread, until f returns true */
template <class F> __device__ __forceinline__ void sp_range(const sp_ctx &c, uint32_t i0, uint32_t i1, F f) {
    if (i0 >= i1) return;
    uint32_t j = i0 % c.np;
    const float *l = c.l + (i0 / c.np) * c.pstride;
    for (uint32_t i = i0; i < i1; i++) {
        if (f(i, sp_fix(c, i, l[j], !c.allow || c.allow[i]))) return;
        if (++j == c.np) j = 0, l += c.pstride;
    }
}

/* monotone: a larger value has a larger key (finite values, -0 already +0) */
__device__ __forceinline__ uint32_t sp_key(float v) {
    const uint32_t b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
/* exp((v - mx) x invt), the host's double expression, to a few 1e-7 relative in float arithmetic
 * alone (conversions run at a quarter of the float rate): v - mx exact as a float pair (two-sum),
 * times invt as a float pair (c.ih + c.il), the low part applied as exp(dl) = 1 + dl (|dl| < 4e-6) */
__device__ __forceinline__ float sp_p(const sp_ctx &c, float v) {
    const float sh = v - c.mx, bb = sh - v, sl = (v - (sh - bb)) + (-c.mx - bb);
    const float dh = sh * c.ih, dl = fmaf(sh, c.ih, -dh) + fmaf(sh, c.il, sl * c.ih);
    if (!(dh > -40.0f)) return 0.0f; /* below 2^-57: 0 in fixed point */
    return expf(dh) * (1.0f + dl);
}
/* p (in [0, 1]) x 2^44 rounded, from the float's bits */
__device__ __forceinline__ uint64_t sp_fixp(float p) {
    const uint32_t b = __float_as_uint(p), e = b >> 23;
    if (e == 0) return 0; /* zero or below 2^-126 */
    const uint32_t mant = (b & 0x7fffffu) | 0x800000u;
    if (e >= 106) return (uint64_t)mant << (e - 106); /* p = mant 2^(e - 150): x 2^44 = mant 2^(e - 106) */
    const uint32_t sh = 106 - e;
    return sh > 24 ? 0 : (uint64_t)((mant + (1u << (sh - 1))) >> sh);
}

/* f(i, v) for every token in id order per piece, coalesced, SP_U loads in flight a thread, and
 * g(tile) after each tile of SP_TILE ids (tile r x tiles a piece + j0 / SP_TILE); both called by
 * every thread the same number of times (v = -inf past the end), so they may use warp-wide
 * intrinsics */
constexpr int SP_U = 8;
constexpr uint32_t SP_TILE = SP_T * SP_U;
template <class F, class G> __device__ __forceinline__ void sp_each_tiles(const sp_ctx &c, F f, G g) {
    uint32_t tile = 0;
    for (int r = 0; r < c.pieces; r++) {
        const float *l = c.l + r * c.pstride;
        const uint8_t *a = c.allow ? c.allow + (size_t)r * c.np : nullptr;
        for (uint32_t j0 = 0; j0 < c.np; j0 += SP_TILE) {
            float v[SP_U];
            uint32_t ok = 0;
#pragma unroll
            for (int k = 0; k < SP_U; k++) {
                const uint32_t j = j0 + k * SP_T + threadIdx.x;
                v[k] = j < c.np ? l[j] : 0.0f;
                ok |= (uint32_t)(j < c.np && (!a || a[j])) << k;
            }
#pragma unroll
            for (int k = 0; k < SP_U; k++) {
                const uint32_t i = (uint32_t)r * c.np + j0 + k * SP_T + threadIdx.x;
                f(i, sp_fix(c, i, v[k], ok >> k & 1u));
            }
            g(tile++);
        }
    }
}
template <class F> __device__ __forceinline__ void sp_each(const sp_ctx &c, F f) {
    sp_each_tiles(c, f, [](uint32_t) {});
}

/* inclusive sum over the threads in order (every thread calls it); *tot: the block's sum */
__device__ uint64_t sp_scan(uint64_t x, uint64_t *tot = nullptr) {
    __shared__ uint64_t ws[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        const uint64_t y = __shfl_up_sync(~0u, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads(); /* ws free from the call before */
    if (lane == 31) ws[warp] = x;
    __syncthreads();
    if (warp == 0) {
        uint64_t y = ws[lane];
        for (int o = 1; o < 32; o <<= 1) {
            const uint64_t z = __shfl_up_sync(~0u, y, o);
            if (lane >= o) y += z;
        }
        ws[lane] = y;
    }
    __syncthreads();
    if (warp) x += ws[warp - 1];
    if (tot) *tot = ws[31];
    return x;
}

/* adds (1, m) to bucket b for each lane with in (every lane calls it), the lanes of one bucket
 * summed first (match, then integer reductions: m <= 2^44 split in two 22-bit halves) so that a
 * flat row does not serialize on one address; hid: the bucket's smallest id, or NULL */
__device__ __forceinline__ void sp_hadd(bool in, uint32_t b, uint64_t m, uint32_t id, uint32_t *hc,
                                        unsigned long long *hm, uint32_t *hid) {
    if (!__any_sync(~0u, in)) return; /* the usual case past the first level */
    const unsigned peers = __match_any_sync(~0u, in ? b : 0xffffffffu);
    if (!in) return;
    const unsigned lo = __reduce_add_sync(peers, (unsigned)(m & 0x3fffffu));
    const unsigned hi = __reduce_add_sync(peers, (unsigned)(m >> 22));
    const unsigned mid = hid ? __reduce_min_sync(peers, id) : 0u;
    if ((int)(threadIdx.x & 31) == __ffs(peers) - 1) {
        atomicAdd(&hc[b], (unsigned)__popc(peers));
        const unsigned long long s = ((unsigned long long)hi << 22) + lo;
        if (s) atomicAdd(&hm[b], s);
        if (hid) atomicMin(&hid[b], mid);
    }
}

struct sp_pick {
    int b;
    uint64_t ac, am; /* count and mass of the buckets before b (descending) */
};

/* the first bucket in descending order at which the cumulative count (by_mass: mass) reaches X,
 * 1 <= X <= the total; nb = 2048 or 1024 */
__device__ sp_pick sp_cross(const uint32_t *hc, const unsigned long long *hm, int nb, bool by_mass, uint64_t X) {
    __shared__ sp_pick res;
    const int q = nb / SP_T, t = threadIdx.x;
    if (t == 0) res.b = -1;
    uint64_t sc = 0, sm = 0;
    for (int k = 0; k < q; k++) {
        const int b = nb - 1 - (t * q + k);
        sc += hc[b];
        sm += hm[b];
    }
    uint64_t ac = sp_scan(sc) - sc;
    uint64_t am = sp_scan(sm) - sm;
    for (int k = 0; k < q; k++) {
        const int b = nb - 1 - (t * q + k);
        const uint64_t c = hc[b], m = hm[b];
        const uint64_t before = by_mass ? am : ac, meas = by_mass ? m : c;
        if (before < X && X <= before + meas) res = {b, ac, am};
        ac += c;
        am += m;
    }
    __syncthreads();
    const sp_pick r = res;
    __syncthreads(); /* res free for the next call */
    return r;
}

/* the r-th smallest id (r >= 1) of the tokens with key K: per-thread ranges of ids, counted,
 * scanned, walked by the thread where the r-th falls */
__device__ uint32_t sp_nth_id(const sp_ctx &c, uint32_t K, uint64_t r) {
    __shared__ uint32_t res;
    const uint32_t chunk = (c.V + SP_T - 1) / SP_T, i0 = min(c.V, threadIdx.x * chunk), i1 = min(c.V, i0 + chunk);
    if (threadIdx.x == 0) res = 0xffffffffu;
    uint64_t n = 0;
    sp_range(c, i0, i1, [&](uint32_t, float v) {
        n += v != -INFINITY && sp_key(v) == K;
        return false;
    });
    const uint64_t incl = sp_scan(n);
    uint64_t before = incl - n;
    if (before < r && r <= incl)
        sp_range(c, i0, i1, [&](uint32_t i, float v) {
            if (v == -INFINITY || sp_key(v) != K || ++before != r) return false;
            res = i;
            return true;
        });
    __syncthreads();
    const uint32_t id = res;
    __syncthreads();
    return id;
}

struct sp_hit {
    uint32_t id;
    uint64_t cnt, mass; /* cumulative count and mass through it, inclusive */
    bool ok;
};

/* the first token in sorted order whose cumulative count (by_mass: mass) reaches X, 1 <= X <= the
 * total; s->c1/m1 hold the first level's histogram */
__device__ sp_hit sp_descend(const sp_ctx &c, sp_smem *s, bool by_mass, uint64_t X) {
    sp_hit h = {0xffffffffu, 0, 0, false};
    const sp_pick p1 = sp_cross(s->c1, s->m1, SP_NB, by_mass, X);
    if (p1.b < 0) return h;
    uint64_t ac = p1.ac, am = p1.am;
    if (s->c1[p1.b] == 1) { /* one token in the bucket: the largest values, often */
        h.id = s->id1[p1.b];
        h.cnt = ac + 1;
        h.mass = am + s->m1[p1.b];
        h.ok = h.id < c.V;
        return h;
    }
    const uint32_t b1 = (uint32_t)p1.b;
    for (int k = threadIdx.x; k < SP_NB; k += SP_T) s->wc[k] = 0, s->wm[k] = 0, s->wid[k] = 0xffffffffu;
    __syncthreads();
    sp_each(c, [&](uint32_t i, float v) {
        const uint32_t key = sp_key(v);
        const bool in = v != -INFINITY && (key >> 21) == b1;
        sp_hadd(in, (key >> 10) & (SP_NB - 1), in ? sp_fixp(sp_p(c, v)) : 0, i, s->wc, s->wm, s->wid);
    });
    __syncthreads();
    const sp_pick p2 = sp_cross(s->wc, s->wm, SP_NB, by_mass, X - (by_mass ? am : ac));
    if (p2.b < 0) return h;
    ac += p2.ac, am += p2.am;
    if (s->wc[p2.b] == 1) { /* one token in the bucket (the usual case in the tail of real logits) */
        h.id = s->wid[p2.b];
        h.cnt = ac + 1;
        h.mass = am + s->wm[p2.b];
        h.ok = h.id < c.V;
        __syncthreads(); /* the working histogram free */
        return h;
    }
    const uint32_t pre = (b1 << 11) | (uint32_t)p2.b;
    for (int k = threadIdx.x; k < SP_NB / 2; k += SP_T) s->wc[k] = 0, s->wm[k] = 0, s->wid[k] = 0xffffffffu;
    __syncthreads();
    sp_each(c, [&](uint32_t i, float v) {
        const uint32_t key = sp_key(v);
        const bool in = v != -INFINITY && (key >> 10) == pre;
        sp_hadd(in, key & (SP_NB / 2 - 1), in ? sp_fixp(sp_p(c, v)) : 0, i, s->wc, s->wm, s->wid);
    });
    __syncthreads();
    const sp_pick p3 = sp_cross(s->wc, s->wm, SP_NB / 2, by_mass, X - (by_mass ? am : ac));
    if (p3.b < 0) return h;
    ac += p3.ac, am += p3.am;
    const uint32_t K = (pre << 10) | (uint32_t)p3.b, cK = s->wc[p3.b], id0 = s->wid[p3.b];
    const uint64_t mK = s->wm[p3.b] / cK; /* one value, one mass */
    uint64_t r = by_mass ? (X - am + mK - 1) / mK : X - ac;
    r = r < 1 ? 1 : r > cK ? cK : r;
    h.id = r == 1 ? id0 : sp_nth_id(c, K, r);
    h.cnt = ac + r;
    h.mass = am + r * mK;
    h.ok = h.id < c.V;
    __syncthreads(); /* the working histogram free */
    return h;
}

/* The cuts and the draw over the tokens near the largest value, sorted in shared memory: the
 * common case of a model's logits, where top_k, top_p, min_p and the draw all fall among the
 * first few hundred tokens of the sorted order. Candidates: the tokens with v >= tau_j =
 * mx - D_j x temperature, for the largest of SP_ND distances whose set holds at most SP_CAND
 * tokens (one pass counts every set). A set of values at or above a threshold is a prefix of the
 * sorted order, ties whole, so walking it sorted takes the token the radix descents take. The
 * pass also gives the total mass and the mass of p >= min_p; a cut or draw that falls past the
 * candidates (a flat row) is left to the descents: returns -2. Else the token's id. */
constexpr int SP_CAND = 4096, SP_ND = 8;
__constant__ float sp_dist[SP_ND] = {0.125f, 0.25f, 0.5f, 1.f, 2.f, 4.f, 9.f, 28.f};
static_assert(offsetof(sp_smem, wm) == offsetof(sp_smem, m1) + SP_NB * 8 && 2 * SP_NB >= SP_CAND &&
                  offsetof(sp_smem, c1) % 8 == 0 && 2 * SP_NB * 4 >= 32 * (SP_ND + 2) * 8 && SP_CAND % SP_T == 0,
              "the fast path's candidates fill m1 and wm, its partial sums c1 and wc");

__device__ int64_t sp_fast(const sp_ctx &c, sp_smem *s, const mla_cuda_samp &rs, uint64_t n_finite, double u,
                           bool has_k) {
    constexpr int NP = SP_ND + 2; /* the sums: the sets' counts, the total mass, the min_p mass */
    unsigned long long(*part)[NP] = (unsigned long long(*)[NP])s->c1; /* [32][NP]: 2.5 KB of c1 and wc's 16 */
    __shared__ unsigned long long tot[NP];
    __shared__ uint32_t nc;
    __shared__ int64_t found;
    __shared__ uint64_t fthrough;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __shared__ float tau[SP_ND]; /* in shared memory: 64 registers a thread leave no room */
    if (threadIdx.x < SP_ND) tau[threadIdx.x] = c.mx - sp_dist[threadIdx.x] * rs.temperature;
    __syncthreads();
    /* the sets' counts (16 bits each, two a word: a thread sees at most SP_MAXV / SP_T tokens), the
     * total mass, the mass of p >= min_p */
    static_assert(SP_MAXV / SP_T < 65536 && SP_ND % 2 == 0, "packed counts");
    uint32_t pk[SP_ND / 2] = {};
    uint64_t mt = 0, mm = 0;
    const float minp = rs.min_p;
    sp_each(c, [&](uint32_t, float v) {
        if (v == -INFINITY) return;
        const float p = sp_p(c, v);
        const uint64_t m = sp_fixp(p);
        mt += m;
        if (p >= minp) mm += m;
#pragma unroll
        for (int j = 0; j < SP_ND; j++) pk[j >> 1] += (uint32_t)(v >= tau[j]) << (16 * (j & 1));
    });
    auto wsum = [&](uint64_t x) {
        for (int o = 16; o; o >>= 1) x += __shfl_xor_sync(~0u, x, o);
        return x;
    };
#pragma unroll
    for (int j = 0; j < SP_ND; j++) {
        const uint64_t a = wsum(pk[j >> 1] >> (16 * (j & 1)) & 0xffffu);
        if (lane == 0) part[warp][j] = a;
    }
    {
        const uint64_t a = wsum(mt), b = wsum(mm);
        if (lane == 0) part[warp][SP_ND] = a, part[warp][SP_ND + 1] = b;
    }
    __syncthreads();
    if (threadIdx.x < NP) {
        uint64_t x = 0;
        for (int w = 0; w < SP_T / 32; w++) x += part[w][threadIdx.x];
        tot[threadIdx.x] = x;
    }
    if (threadIdx.x == 0) nc = 0, found = -1;
    __syncthreads();
    const uint64_t total = tot[SP_ND];
    uint64_t mass_minp = tot[SP_ND + 1];
    int js = -1;
    for (int j = 0; j < SP_ND; j++)
        if (tot[j] <= SP_CAND) js = j;
    if (js < 0) return -2;
    const uint64_t ncand = tot[js];
    const bool cut_k = has_k && (uint64_t)rs.top_k < n_finite;
    if (cut_k && ncand < (uint64_t)rs.top_k) return -2;
    /* the candidates as (key, ~id): sorted descending, value descending and id ascending on ties */
    unsigned long long *cand = s->m1; /* m1 and wm: 2 x SP_NB u64 */
    const float tj = tau[js];
    sp_each(c, [&](uint32_t i, float v) {
        const bool in = v != -INFINITY && v >= tj;
        const unsigned b = __ballot_sync(~0u, in);
        if (!b) return;
        uint32_t base = 0;
        if (lane == __ffs(b) - 1) base = atomicAdd(&nc, (unsigned)__popc(b));
        base = __shfl_sync(~0u, base, __ffs(b) - 1);
        if (in) cand[base + __popc(b & ((1u << lane) - 1))] = (unsigned long long)sp_key(v) << 32 | (uint32_t)~i;
    });
    __syncthreads();
    int N = 1;
    while (N < (int)ncand) N <<= 1;
    for (int i = (int)ncand + threadIdx.x; i < N; i += SP_T) cand[i] = 0; /* below every candidate */
    __syncthreads();
    for (int k = 2; k <= N; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < N; i += SP_T) {
                const int x = i ^ j;
                if (x <= i) continue;
                const unsigned long long a = cand[i], b = cand[x];
                if (((i & k) == 0) == (a < b)) cand[i] = b, cand[x] = a; /* descending where i & k is 0 */
            }
            __syncthreads();
        }
    /* four consecutive candidates a thread, their masses and the cumulative mass before them */
    constexpr int Q = SP_CAND / SP_T;
    uint64_t m[Q], mine = 0;
    const int i0 = Q * threadIdx.x;
#pragma unroll
    for (int q = 0; q < Q; q++) {
        m[q] = 0;
        if (i0 + q < (int)ncand) {
            const uint32_t key = (uint32_t)(cand[i0 + q] >> 32);
            const float v = __uint_as_float(key & 0x80000000u ? key & 0x7fffffffu : ~key);
            m[q] = sp_fixp(sp_p(c, v));
        }
        mine += m[q];
    }
    uint64_t cmass = 0; /* the candidates' mass */
    const uint64_t before = sp_scan(mine, &cmass) - mine;
    /* the first candidate whose cumulative mass (by_mass) or count reaches X (-1: none), and the
     * cumulative mass through it in *thr; every thread calls it */
    auto first = [&](bool by_mass, uint64_t X, uint64_t *thr) -> int64_t {
        uint64_t cm = before;
#pragma unroll
        for (int q = 0; q < Q; q++) {
            const int idx = i0 + q;
            const uint64_t was = by_mass ? cm : (uint64_t)idx;
            cm += m[q];
            const uint64_t now = by_mass ? cm : (uint64_t)idx + 1;
            if (idx < (int)ncand && was < X && X <= now) found = idx, fthrough = cm;
        }
        __syncthreads();
        const int64_t f = found;
        *thr = fthrough;
        __syncthreads();
        if (threadIdx.x == 0) found = -1;
        __syncthreads(); /* reset before the next call's writes */
        return f;
    };
    uint64_t mass_k = total, thr = 0;
    if (cut_k) {
        if (first(false, (uint64_t)rs.top_k, &thr) < 0) return -2;
        mass_k = thr;
    }
    uint64_t kept = mass_k;
    if (rs.top_p < 1.0f) {
        const double lim = ceil((double)rs.top_p * (double)mass_k);
        uint64_t X = lim < 1 ? 1 : (uint64_t)lim;
        if (X > mass_k) X = mass_k;
        if (X > cmass) return -2;
        if (first(true, X, &thr) < 0) return -2;
        kept = thr;
    }
    if (rs.min_p > 0) {
        if (mass_minp == 0) mass_minp = sp_fixp(1.0f); /* min_p > 1: the first token alone */
        if (mass_minp < kept) kept = mass_minp;
    }
    uint64_t tg = (uint64_t)(u * (double)kept);
    if (tg >= kept) tg = kept - 1;
    if (tg + 1 > cmass) return -2;
    const int64_t f = first(true, tg + 1, &thr);
    if (f < 0) return -2;
    return (int64_t)(uint32_t)~(uint32_t)cand[f];
}

__global__ void __launch_bounds__(SP_T)
    sample_kernel(const float *__restrict__ logits, int64_t n_piece, int pieces, const mla_cuda_samp *__restrict__ rows,
                  const uint8_t *__restrict__ masks, const int32_t *__restrict__ bias_ids,
                  const float *__restrict__ bias_vals, int32_t *__restrict__ out) {
    mlacu_pdl_enter();
    extern __shared__ __align__(16) unsigned char sp_dyn[];
    sp_smem *s = (sp_smem *)sp_dyn;
    __shared__ float red_v[32];
    __shared__ uint32_t red_i[32];
    const int64_t T = gridDim.x, t = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const mla_cuda_samp rs = rows[t];
    sp_ctx c;
    c.np = (uint32_t)n_piece;
    c.V = (uint32_t)(n_piece * pieces);
    c.pieces = pieces;
    c.pstride = T * n_piece;
    c.l = logits + t * n_piece;
    c.allow = rs.mask >= 0 ? masks + (int64_t)rs.mask * c.V : nullptr;
    c.bits = s->bits;
    c.bid = s->bid;
    c.bval = s->bval;
    c.nb = 0;
    c.mx = 0;
    c.ih = 1;
    c.il = 0;
    if (rs.n_bias > MLA_CUDA_SAMPLE_MAX_BIAS) { /* documented: more than the table holds */
        if (threadIdx.x == 0) out[t] = -1;
        return;
    }

    /* the biases: each distinct id's value with its entries added in order, a sorted table */
    if (rs.n_bias > 0) {
        const int32_t *ids = bias_ids + rs.bias_off;
        const float *vals = bias_vals + rs.bias_off;
        const int nb = rs.n_bias;
        for (uint32_t w = threadIdx.x; w < (c.V + 31) / 32; w += SP_T) s->bits[w] = 0;
        for (int k = threadIdx.x; k < nb; k += SP_T) {
            const int32_t id = ids[k];
            bool first = id >= 0 && (uint32_t)id < c.V;
            for (int j = 0; j < k && first; j++) first = ids[j] != id;
            s->bfirst[k] = first;
        }
        __syncthreads();
        int nu = 0;
        for (int k = threadIdx.x; k < nb; k += SP_T) {
            if (!s->bfirst[k]) continue;
            const int32_t id = ids[k];
            float v = sp_raw(c, (uint32_t)id);
            for (int j = k; j < nb; j++)
                if (ids[j] == id) v += vals[j];
            int rank = 0;
            for (int j = 0; j < nb; j++) rank += s->bfirst[j] && ids[j] < id;
            s->bid[rank] = id;
            s->bval[rank] = v;
            atomicOr(&s->bits[id >> 5], 1u << (id & 31));
            nu++;
        }
        uint64_t tot = 0;
        sp_scan((uint64_t)nu, &tot);
        c.nb = (int)tot;
        __syncthreads();
    }

    /* pass 1: the largest value (lowest id on ties) and how many are finite */
    float bv = -INFINITY;
    uint32_t bi = 0xffffffffu, nfin = 0;
    sp_each(c, [&](uint32_t i, float v) {
        if (v == -INFINITY) return;
        nfin++;
        if (v > bv || (v == bv && i < bi)) bv = v, bi = i;
    });
    for (int o = 16; o; o >>= 1) {
        const float ov = __shfl_xor_sync(~0u, bv, o);
        const uint32_t oi = __shfl_xor_sync(~0u, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    if (lane == 0) red_v[warp] = bv, red_i[warp] = bi;
    uint64_t n_finite = 0;
    sp_scan(nfin, &n_finite); /* its barriers publish red_v / red_i */
    bv = red_v[lane];
    bi = red_i[lane];
    for (int o = 16; o; o >>= 1) {
        const float ov = __shfl_xor_sync(~0u, bv, o);
        const uint32_t oi = __shfl_xor_sync(~0u, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    if (n_finite == 0) {
        if (threadIdx.x == 0) out[t] = -1;
        return;
    }
    if (!(rs.temperature > 0) || rs.top_k == 1) {
        if (threadIdx.x == 0) out[t] = (int32_t)bi;
        return;
    }
    c.mx = bv;
    {
        const double invt = 1.0 / (double)rs.temperature; /* as the host computes it */
        c.ih = (float)fmin(invt, 1e30); /* past it every value below the largest is 0 alike */
        c.il = invt > 1e30 ? 0.0f : (float)(invt - (double)c.ih);
    }
    const double u = sp_uniform(rs.seed, rs.stream);
    const bool has_k = rs.top_k > 0 && (uint32_t)rs.top_k < c.V;
    const bool sorted = has_k || rs.top_p < 1.0f || rs.min_p > 0;

    if (!sorted) { /* the draw in id order: the mass of each tile of ids, then the tile's ids */
        __shared__ unsigned long long seg[SP_MAXSEG];
        __shared__ uint64_t s_before, s_X;
        __shared__ int s_seg;
        __shared__ uint32_t res;
        const uint32_t nsp = (c.np + SP_TILE - 1) / SP_TILE, nseg = nsp * (uint32_t)c.pieces;
        for (uint32_t k = threadIdx.x; k < nseg; k += SP_T) seg[k] = 0;
        if (threadIdx.x == 0) res = 0xffffffffu;
        __syncthreads();
        uint64_t m = 0;
        sp_each_tiles(
            c,
            [&](uint32_t, float v) {
                if (v != -INFINITY) m += sp_fixp(sp_p(c, v));
            },
            [&](uint32_t g) {
                for (int o = 16; o; o >>= 1) m += __shfl_xor_sync(~0u, m, o);
                if (lane == 0 && m) atomicAdd(&seg[g], (unsigned long long)m);
                m = 0;
            });
        __syncthreads();
        if (threadIdx.x == 0) { /* the total, the draw, the tile where it falls (a few dozen tiles) */
            uint64_t tot = 0, before = 0;
            for (uint32_t g = 0; g < nseg; g++) tot += seg[g];
            uint64_t tg = (uint64_t)(u * (double)tot);
            if (tg >= tot) tg = tot - 1;
            s_X = tg + 1;
            s_seg = -1;
            for (uint32_t g = 0; g < nseg; g++) {
                if (before + seg[g] >= tg + 1) {
                    s_seg = (int)g;
                    break;
                }
                before += seg[g];
            }
            s_before = before;
        }
        __syncthreads();
        const int gs = s_seg;
        const uint64_t X = s_X;
        if (gs < 0) {
            if (threadIdx.x == 0) out[t] = -1;
            return;
        }
        /* the tile's ids, SP_U consecutive a thread, in order */
        const uint32_t r = (uint32_t)gs / nsp, ja = ((uint32_t)gs % nsp) * SP_TILE, jb = min(c.np, ja + SP_TILE);
        const uint32_t a0 = min(jb, ja + SP_U * threadIdx.x), a1 = min(jb, a0 + SP_U);
        const float *l = c.l + r * c.pstride;
        const uint8_t *al = c.allow ? c.allow + (size_t)r * c.np : nullptr;
        uint64_t mine = 0;
        for (uint32_t j = a0; j < a1; j++) {
            const float v = sp_fix(c, r * c.np + j, l[j], !al || al[j]);
            if (v != -INFINITY) mine += sp_fixp(sp_p(c, v));
        }
        const uint64_t incl = s_before + sp_scan(mine);
        uint64_t cum = incl - mine;
        if (cum < X && X <= incl)
            for (uint32_t j = a0; j < a1; j++) {
                const float v = sp_fix(c, r * c.np + j, l[j], !al || al[j]);
                if (v == -INFINITY) continue;
                cum += sp_fixp(sp_p(c, v));
                if (cum >= X) {
                    res = r * c.np + j;
                    break;
                }
            }
        __syncthreads();
        if (threadIdx.x == 0) out[t] = res < c.V ? (int32_t)res : -1;
        return;
    }

    {
        const int64_t f = sp_fast(c, s, rs, n_finite, u, has_k);
        if (f != -2) {
            if (threadIdx.x == 0) out[t] = (int32_t)f;
            return;
        }
        __syncthreads(); /* the candidates' memory is the histograms' */
    }

    /* the first level's histogram (top 11 bits of the key), the total mass, the mass of p >= min_p */
    for (int k = threadIdx.x; k < SP_NB; k += SP_T) s->c1[k] = 0, s->m1[k] = 0, s->id1[k] = 0xffffffffu;
    __syncthreads();
    uint64_t mt = 0, mm = 0;
    const float minp = rs.min_p;
    sp_each(c, [&](uint32_t i, float v) {
        const bool in = v != -INFINITY;
        const float p = in ? sp_p(c, v) : 0.0f;
        const uint64_t m = sp_fixp(p);
        mt += m;
        if (in && p >= minp) mm += m;
        sp_hadd(in, sp_key(v) >> 21, m, i, s->c1, s->m1, s->id1);
    });
    uint64_t total = 0, mass_minp = 0;
    sp_scan(mt, &total);
    sp_scan(mm, &mass_minp);
    __syncthreads();

    uint64_t mass_k = total;
    if (has_k && (uint64_t)rs.top_k < n_finite) {
        const sp_hit h = sp_descend(c, s, false, (uint64_t)rs.top_k);
        if (!h.ok) {
            if (threadIdx.x == 0) out[t] = -1;
            return;
        }
        mass_k = h.mass;
    }
    uint64_t kept = mass_k;
    if (rs.top_p < 1.0f) {
        double lim = ceil((double)rs.top_p * (double)mass_k);
        uint64_t X = lim < 1 ? 1 : (uint64_t)lim;
        if (X > mass_k) X = mass_k;
        const sp_hit h = sp_descend(c, s, true, X);
        if (!h.ok) {
            if (threadIdx.x == 0) out[t] = -1;
            return;
        }
        kept = h.mass;
    }
    if (rs.min_p > 0) {
        if (mass_minp == 0) mass_minp = sp_fixp(1.0f); /* min_p > 1: the first token alone */
        if (mass_minp < kept) kept = mass_minp;
    }
    uint64_t tg = (uint64_t)(u * (double)kept);
    if (tg >= kept) tg = kept - 1;
    const sp_hit h = sp_descend(c, s, true, tg + 1);
    if (threadIdx.x == 0) out[t] = h.ok ? (int32_t)h.id : -1;
}

} // namespace

extern "C" int mla_cuda_sample_pieces(const float *d_logits, int64_t T, int64_t n_piece, int pieces,
                                      const mla_cuda_samp *d_rows, const uint8_t *d_masks, const int32_t *d_bias_ids,
                                      const float *d_bias_vals, int32_t *d_ids, mla_cuda_stream stream, mla_err *e) {
    MLA_ASSERT(n_piece > 0 && pieces >= 1 && pieces <= SP_MAXPIECES && n_piece * pieces < (int64_t)SP_MAXV &&
               T < INT32_MAX);
    if (T <= 0) return MLA_OK;
    /* the shared memory allowed once a process (one vocabulary), again only if a call needs more */
    static std::atomic<size_t> allowed{0};
    const size_t smem = sp_smem_bytes((uint32_t)(n_piece * pieces));
    if (smem > allowed.load(std::memory_order_relaxed)) {
        MLACU_CHECK(mlacu_smem_allow(sample_kernel, smem), e, "sample: %zu bytes of shared memory a block (V=%lld)",
                    smem, (long long)(n_piece * pieces));
        allowed.store(smem, std::memory_order_relaxed);
    }
    mlacu_launch(sample_kernel, (unsigned)T, SP_T, smem, stream, d_logits, n_piece, pieces, d_rows, d_masks,
                 d_bias_ids, d_bias_vals, d_ids);
    MLACU_CHECK(cudaGetLastError(), e, "sample T=%lld n=%lld x %d", (long long)T, (long long)n_piece, pieces);
    return MLA_OK;
}
