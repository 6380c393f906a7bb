/* wgmma_ops_cuda: the warpgroup tensor cores' (wgmma, sm_90a) small device helpers that the
 * attention kernels on them share (attn_wg_cuda.cu, attn_pfwg_cuda.cu): the fences, commit and
 * wait of wgmma groups, the shared-memory operand descriptors of the 128-byte swizzle and the byte
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
/* byte offset of 16-byte chunk c (0..7) of row r in a k-block */
static __device__ __forceinline__ uint32_t wga_sw(int r, int c) { return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)); }
#endif

#endif
