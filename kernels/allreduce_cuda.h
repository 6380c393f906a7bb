/* allreduce_cuda: the one-shot all-reduce of tensor-parallel ranks on one host, through peer
 * memory. Every rank's kernel reads the same slice of every rank's input buffer over NVLink (or
 * its own device's memory) and writes the sum, added in rank order 0, 1, ..., N-1, so every rank
 * gets the same bits. Ranks meet in flag barriers: each rank's signal area holds one start and one
 * end flag per (block, peer); a block stores the call's generation into its slot of every peer's
 * area (release, system scope) and waits until every peer has stored it into its own (acquire).
 * The generation is counted on the device (each block's counter in its own signal area), so a
 * captured CUDA graph replays correctly. The start barrier makes the peers' inputs ready to read;
 * the end barrier keeps a rank from overwriting its input (the next call's) while a peer still
 * reads it. A peer that never arrives fails the wait after about 10 s (the area's `failed` is set;
 * mla_cuda_ar_failed reads it) instead of hanging the GPU.
 *
 * mla_cuda_ar_add_rmsnorm fuses the sum with what follows it in a layer: the residual add
 * (xo = x + sum), the RMSNorm of the new stream (h = xo / sqrt(mean(xo^2) + eps) * w) and, asked
 * for, h's q8 rounding for the products after it: the bits of mla_cuda_ar_sum followed by
 * mla_cuda_rmsnorm_ex (kernels/cuda_ops.h) with the sum as its residual, in one launch instead of
 * three (the copy into the input buffer goes too where the sublayer writes its output there).
 * A row takes a cluster of up to 8 blocks (1024 elements each) on devices with thread-block
 * clusters (sm_90 and later), one block on others (rows of up to 1024).
 *
 * Ownership: the caller allocates every buffer: each rank's input and signal area
 * (mla_cuda_ar_sig_bytes(), zeroed by mla_cuda_ar_sig_init before the first call), maps the peers' (cudaIpcOpenMemHandle across processes, plain pointers across
 * threads of one process) and fills mla_ar_peers. The output must not alias the rank's own input
 * (peers read it while the sum is written). Every rank must make the same calls in the same order
 * with the same sizes, and the kernels of all ranks must be resident at once (grids of at most
 * MLA_AR_MAX_BLOCKS blocks of 256 or 512 threads: on its own GPU a rank's fit; ranks sharing one
 * GPU as streams of a process must together fit it, as tests/gpu/test_allreduce_oneshot.cu
 * keeps them). */
#ifndef ALLREDUCE_CUDA_H
#define ALLREDUCE_CUDA_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
/* common/mla_err.h is C11 (_Noreturn) without C++ guards (as kernels/cuda_ops.h does) */
#ifndef _Noreturn
#define _Noreturn [[noreturn]]
#endif
extern "C" {
#include "common/mla_err.h"
}
#else
#include "common/mla_err.h"
#endif

#define MLA_AR_MAX_RANKS 8
#define MLA_AR_MAX_BLOCKS 128

typedef struct mla_ar_peers {
    int rank, world;                    /* this rank; ranks, 2..MLA_AR_MAX_RANKS */
    const float *buf[MLA_AR_MAX_RANKS]; /* every rank's input buffer, as this process maps it */
    void *sig[MLA_AR_MAX_RANKS];        /* every rank's signal area, as this process maps it */
} mla_ar_peers;

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of one rank's signal area. */
size_t mla_cuda_ar_sig_bytes(void);
/* Zeroes a signal area (once, before the first call of any rank). */
int mla_cuda_ar_sig_init(void *sig, cudaStream_t st, mla_err *err);
/* out[0..n) := sum over ranks of buf[r][0..n), on stream st. */
int mla_cuda_ar_sum(const mla_ar_peers *p, float *out, size_t n, cudaStream_t st, mla_err *err);
/* Whether mla_cuda_ar_add_rmsnorm takes T rows of E on the current device: rows of up to 8192,
 * (blocks a row) x T <= MLA_AR_MAX_BLOCKS, clusters where a row takes more than one block. */
int mla_cuda_ar_add_rmsnorm_fits(int64_t T, int64_t E);
/* T rows of E: s = sum over ranks of buf[r][t*E + i]; xo[t*E + i] = x[t*E + i] + s (xo == x: in
 * place); h[t*E + i] = xo / sqrt(mean over the row of xo^2 + eps) * w[i]; with q8 (E % 32 == 0)
 * also h's q8 buffer (mla_cuda_quantize_q8's layout). Neither x, xo nor h may be the rank's input;
 * h must not overlap x or xo. A shape that does not fit is an error. */
int mla_cuda_ar_add_rmsnorm(const mla_ar_peers *p, int64_t T, int64_t E, const float *x, float *xo, const float *w,
                            float eps, float *h, void *q8, cudaStream_t st, mla_err *err);
/* Whether a barrier wait of this rank timed out (reads its signal area; synchronous). */
int mla_cuda_ar_failed(const void *sig, int *failed, mla_err *err);

#ifdef __cplusplus
}
#endif

#endif
