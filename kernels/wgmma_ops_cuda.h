/* wgmma_ops_cuda: the warpgroup tensor cores' (wgmma, sm_90a) small device helpers that the
 * kernels on them share (attn_wg_cuda.cu, attn_pfwg_cuda.cu, dsa_wg_cuda.cu): the fences, commit
 * and wait of wgmma groups, the 64 x 64 and 64 x 128 products, a tile of scores, the rescale of an
 * accumulator's rows, the shared-memory operand descriptors of the 128-byte swizzle and the byte
 * offset of a 16-byte chunk in that layout. Internal to kernels/; defined only when compiling for
 * sm_90a (__CUDA_ARCH_FEAT_SM90_ALL). Nothing here owns memory.
 *
 * The layout: 64 fp16 columns (128 bytes) a row of a k-block, 16-byte chunk c of row r at chunk
 * c ^ (r % 8), 8-row groups 1024 bytes apart. */
#ifndef WGMMA_OPS_CUDA_H
#define WGMMA_OPS_CUDA_H

#include <cuda_fp16.h>
#include <stdint.h>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
static __device__ __forceinline__ void wga_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
/* pins accumulator registers in place: their other writes stay before the wgmma.fence that follows,
 * their reads after the wait before (the compiler would otherwise move register-only arithmetic
 * across the fence) */
template <int N> static __device__ __forceinline__ void wga_pin(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
static __device__ __forceinline__ void wga_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wga_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/* all but the latest committed group complete */
static __device__ __forceinline__ void wga_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
/* pins registers that an in-flight wgmma reads (its A operand) until the wait before: the compiler
 * must not reuse them earlier */
template <int N> static __device__ __forceinline__ void wga_pin_r(uint32_t (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(r[i])::"memory");
}
/* 2^x (flushing results below 2^-126 to 0) */
static __device__ __forceinline__ float wga_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
/* what the threads stored in shared memory, visible to wgmma's (async) proxy */
static __device__ __forceinline__ void wga_fence_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
static __device__ __forceinline__ uint32_t wga_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
static __device__ __forceinline__ uint32_t wga_h2(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *(uint32_t *)&h;
}
/* K-major, 128-byte swizzle: SBO 1024 (8 rows), LBO unused */
static __device__ __forceinline__ uint64_t wga_desc_k(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
/* MN-major, 128-byte swizzle: LBO = blk bytes to the next 64 columns (a k-block of the tile), SBO
 * the next 8 rows (1024) */
template <int BLK> static __device__ __forceinline__ uint64_t wga_desc_mn(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)(BLK >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}
/* d += A B^T: m64n64k16, A and B K-major by descriptor (S = Q K^T over a tile of 64 keys) */
static __device__ __forceinline__ void wga_mma_s64(float (&d)[32], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db));
}
/* d = A B^T (acc 0) or d += A B^T (acc 1): m64n128k16, A K-major by descriptor, B K-major (BMN 0)
 * or MN-major (BMN 1: B's N contiguous, wga_desc_mn) by descriptor. acc 0 starts an accumulator
 * without zeroing its registers first. */
template <int BMN>
static __device__ __forceinline__ void wga_mma_n128_acc(float (&d)[64], uint64_t da, uint64_t db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "%64, %65, p, 1, 1, 0, %67;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(acc), "n"(BMN));
}
/* d = A B^T (acc 0) or d += A B^T (acc 1): m64n64k16, A K-major by descriptor, B K-major (BMN 0)
 * or MN-major (BMN 1) by descriptor; as wga_mma_n128_acc, 64 columns */
template <int BMN>
static __device__ __forceinline__ void wga_mma_n64_acc(float (&d)[32], uint64_t da, uint64_t db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "%32, %33, p, 1, 1, 0, %35;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(acc), "n"(BMN));
}
/* d += A B^T: m64n128k16, A and B K-major by descriptor (128 rows of B a call) */
static __device__ __forceinline__ void wga_mma_n128(float (&d)[64], uint64_t da, uint64_t db) {
    wga_mma_n128_acc<0>(d, da, db, 1);
}
/* an accumulator's rows times their softmax rescale: o[4 i], o[4 i + 1] (the thread's row g) by
 * al[0], o[4 i + 2], o[4 i + 3] (row g + 8) by al[1] */
template <int N> static __device__ __forceinline__ void wga_scale_rows(float (&o)[N], const float (&al)[2]) {
#pragma unroll
    for (int i = 0; i < N / 4; i++) {
        o[4 * i] *= al[0];
        o[4 * i + 1] *= al[0];
        o[4 * i + 2] *= al[1];
        o[4 * i + 3] *= al[1];
    }
}
/* byte offset of 16-byte chunk c (0..7) of row r in a k-block */
static __device__ __forceinline__ uint32_t wga_sw(int r, int c) { return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)); }
/* s = A B^T for 64 rows of A (shared address a) and 64 of B (b): KB k-blocks of 64 columns, BLK
 * bytes apart, both K-major with the 128-byte swizzle; complete (waited for) on return. The
 * thread's part: rows r0, r0 + 8 (r0 = 16 warp-in-group + lane / 4) x columns 8 i + 2 (lane % 4)
 * + e in s[4 i + 2 hf + e]. */
template <int KB, int BLK> static __device__ __forceinline__ void wga_scores64(float (&s)[32], uint32_t a, uint32_t b) {
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = 0.f;
    wga_pin(s);
    wga_fence();
#pragma unroll
    for (int kk = 0; kk < KB * 4; kk++) {
        const uint32_t off = (uint32_t)((kk >> 2) * BLK + (kk & 3) * 32);
        wga_mma_s64(s, wga_desc_k(a + off), wga_desc_k(b + off));
    }
    wga_commit();
    wga_wait0();
    wga_pin(s);
}
#endif

#endif
