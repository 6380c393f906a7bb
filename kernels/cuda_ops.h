/* cuda_ops: the CUDA versions of the kernels/ ops, callable from C host code.
 *
 * Every op has the same meaning as its CPU reference (kernels/<op>.h, the definition of
 * correct); pointers named d_* are DEVICE pointers, and each op is enqueued on `stream`
 * (NULL = the legacy default stream) and returns before it has run. Ownership: the caller owns
 * every buffer; nothing here allocates device memory except where a function says so.
 *
 * Errors: a function returning int gives MLA_OK, or MLA_ERR with a message in *e when the CUDA
 * runtime reports a failure (launch error, no device). Bad arguments (an unsupported type,
 * sizes that break an op's documented rules) are caller bugs and abort through MLA_ASSERT.
 *
 * Call mla_cuda_init() once per process after choosing the device: it uploads the IQ grid
 * tables (kernels/quant_grids.c) to device memory. */
#ifndef CUDA_OPS_H
#define CUDA_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
/* common/mla_err.h is C11 (_Noreturn) without C++ guards: shim both for .cu files. */
#ifndef _Noreturn
#define _Noreturn [[noreturn]]
#endif
extern "C" {
#endif

#include "common/mla_err.h"
#include "kernels/moe.h"
#include "kernels/rope.h"

/* Same type as cudaStream_t, without needing the CUDA headers in C code. */
typedef struct CUstream_st *mla_cuda_stream;

/* Selects `device` (cudaSetDevice) and uploads the quantization tables. Idempotent. */
int mla_cuda_init(int device, mla_err *e);

/* Number of CUDA devices visible (0 when none or no driver). */
int mla_cuda_device_count(void);

/* True when the CUDA kernels handle type t (the gather and the float-activation matmuls). */
bool mla_cuda_quant_supported(uint32_t t);

/* Bytes to allocate for `rows` rows of `n` elements of type t: ggml_row_bytes(t, n) * rows,
 * rounded up to 16 (the matmul kernels read weights with 16-byte loads). */
size_t mla_cuda_weight_bytes(uint32_t t, int64_t n, int64_t rows);

/* y[T][out] = x[T][in] · W^T, W = `out` rows of `in` elements of type t (GGUF layout: ne0 = in,
 * ne1 = out, rows of ggml_row_bytes(t, in) bytes back to back; the buffer padded as
 * mla_cuda_weight_bytes says). in must be a multiple of 32 and of t's block size. x and y are
 * float, row-major. mla_cuda_matmul picks the path (mla_cuda_mm_choose with nothing allowed):
 * GEMV (fp32 math) for T <= 8 (T <= 64 for a float W of at most 512 outputs), otherwise the
 * tensor-core path (x and the dequantized W rounded to bf16, fp32 accumulation), or for a float W
 * of at most 512 outputs and a row length a multiple of 128, the narrow kernel above 64 rows. */
int mla_cuda_matmul(uint32_t t, const void *d_w, int64_t in, int64_t out, const float *d_x,
                    int64_t T, float *d_y, mla_cuda_stream stream, mla_err *e);
/* The two paths, callable directly (tests, benchmarks). gemv: any T >= 1 (launches of 8 tokens,
 * each reading W; 16 rows per block sharing x in shared memory); mma: any T >= 1. */
int mla_cuda_matmul_gemv(uint32_t t, const void *d_w, int64_t in, int64_t out,
                         const float *d_x, int64_t T, float *d_y, mla_cuda_stream stream,
                         mla_err *e);
int mla_cuda_matmul_mma(uint32_t t, const void *d_w, int64_t in, int64_t out, const float *d_x,
                        int64_t T, float *d_y, mla_cuda_stream stream, mla_err *e);
/* Float weights (F32, F16, BF16) with at most 512 outputs (a MoE router) over many rows
 * (kernels/mm_narrow_cuda.cu): blocks of 16 tokens x 64 outputs, K split over a block's warps and
 * summed in a fixed order; TF32 hi/lo products (three MMAs, two for 16-bit weights): about fp32
 * accuracy. mla_cuda_narrow_supported: those types, in a multiple of 128; any other shape, or x or
 * W not 16-byte aligned, takes mla_cuda_matmul_mma3 instead (as accurate); launches of at most
 * 65535 x 16 rows. */
bool mla_cuda_narrow_supported(uint32_t t, int64_t in, int64_t out);
int mla_cuda_matmul_narrow(uint32_t t, const void *d_w, int64_t in, int64_t out, const float *d_x,
                           int64_t T, float *d_y, mla_cuda_stream stream, mla_err *e);
/* The tensor-core path with fp32-class accuracy: x and the dequantized W split into bf16 hi + lo,
 * three MMAs (hi*hi + hi*lo + lo*hi), fp32 accumulate (relative error ~1e-5 instead of ~3e-3).
 * mla_cuda_matmul_split: the GEMV for T <= 128 (faster there on the H200), mma3 above (the
 * prefill path of --split / MLA_CUDA_FAST=split). */
int mla_cuda_matmul_mma3(uint32_t t, const void *d_w, int64_t in, int64_t out, const float *d_x,
                         int64_t T, float *d_y, mla_cuda_stream stream, mla_err *e);
int mla_cuda_matmul_split(uint32_t t, const void *d_w, int64_t in, int64_t out, const float *d_x,
                          int64_t T, float *d_y, mla_cuda_stream stream, mla_err *e);

/* The matmul chooser (kernels/mm_choose_cuda.cu; the rules in docs/kernels.md): the kernel family
 * of a product, from the weights' types and row lengths, the rows of x a matrix and what the
 * caller allows. The model's dense products and the MoE's expert products both ask it. */
typedef enum mla_cuda_mm_family {
    MLA_CUDA_MM_GEMV,   /* float x, GEMV (mla_cuda_matmul_gemv; grouped: the grouped GEMVs) */
    MLA_CUDA_MM_MMA,    /* float x, bf16 tensor cores (mla_cuda_matmul_mma) */
    MLA_CUDA_MM_SPLIT,  /* float x, GEMV then the hi/lo tensor cores (mla_cuda_matmul_split) */
    MLA_CUDA_MM_Q8,     /* q8 x, integer GEMV (mla_cuda_matmul_q8 and its _swiglu, _pair forms) */
    MLA_CUDA_MM_Q8_MMA, /* q8 x, int8 tensor cores (mla_cuda_matmul_q8_mma, _grouped_q8_mma) */
    MLA_CUDA_MM_H,      /* fp16 x, fp16 tensor cores (mla_cuda_matmul_h, _grouped_h) */
    MLA_CUDA_MM_NARROW, /* float x, one float matrix of few outputs (mla_cuda_matmul_narrow) */
} mla_cuda_mm_family;
typedef struct mla_cuda_mm_policy {
    bool q8;            /* q8 activations for the types with an integer form */
    bool split;         /* float x past the GEMV on the hi/lo split */
    bool exact;         /* float x on the GEMV at any batch */
    int64_t h_min;      /* the fp16 tensor cores from this many rows a matrix (0: never) */
    int64_t q8_mma_min; /* the int8 tensor cores from this many rows a matrix (0: never) */
    int64_t gm_max;     /* with q8, steps of up to this many rows whose every matrix the streamed int8
                         * tensor-core GEMV takes (mla_cuda_gemvm_takes) stay on MLA_CUDA_MM_Q8, before
                         * the fp16 tensor cores (0: never; dense products only) */
} mla_cuda_mm_policy;
/* The one family that n products (types[i], rows of ins[i] elements, `rows` rows of x each; an
 * MoE: the pairs over the experts, rounded down; `out`: the most outputs of the n) take
 * together. A grouped product has no float tensor-core form: for it anything but MLA_CUDA_MM_H
 * and MLA_CUDA_MM_Q8_MMA means the grouped GEMVs. */
mla_cuda_mm_family mla_cuda_mm_choose(const mla_cuda_mm_policy *p, const uint32_t *types, const int64_t *ins, int n,
                                      int64_t rows, int64_t out);

/* The integer GEMV for quantized weights (the decode path when the model enables it): the
 * activations are first quantized per 32 elements to int8 with a float scale (round to nearest
 * even of x * 127 / max|x|: llama.cpp's q8_1 scheme), then each weight unit's integers dot them
 * with dp4a. Relative error ~3e-3 from the activation rounding, fp32 otherwise.
 * mla_cuda_q8_supported: every quantized type (not F32/F16/BF16). A q8 buffer for T rows of `in`
 * elements takes mla_cuda_q8_bytes(T, in) bytes (16-aligned); mla_cuda_quantize_q8 fills it from
 * x [T][in]; mla_cuda_matmul_q8 then computes y [T][out] as mla_cuda_matmul does (any T; 8
 * tokens per pass over W). */
bool mla_cuda_q8_supported(uint32_t t);
/* Small-batch products of Q4_K, Q6_K, Q8_0 and Q5_0 weights (mla_cuda_matmul_q8 with T up to
 * dense_tmax, mla_cuda_matmul_grouped_q8 over a plan for up to grouped_tmax tokens) stream W
 * through shared memory once, x held in registers a token at a time (kernels/gemvs_cuda.cu).
 * The item arithmetic is paid per token, so that from 2 tokens (2 pairs a tile) the per-warp
 * GEMV of every type (8 tokens a pass over W) is faster: it takes the rest (0: everything).
 * grouped_tmax MLA_CUDA_GEMVS_SINGLES: plans of one token whole, and of more tokens the tiles
 * of the experts with one pair, the per-warp GEMV the others. Defaults MLA_CUDA_GEMVS_DENSE /
 * _GROUPED (the worker's); one setting for the process (the op checks compare others).
 * dense_tmax <= 8. */
#define MLA_CUDA_GEMVS_DENSE 1
#define MLA_CUDA_GEMVS_SINGLES (-1)
#define MLA_CUDA_GEMVS_GROUPED MLA_CUDA_GEMVS_SINGLES
void mla_cuda_set_gemv_stream(int dense_tmax, int grouped_tmax);
/* Dense steps of tmin .. tmax tokens (mla_cuda_matmul_q8, _swiglu, _pair) of Q4_K, Q6_K and Q8_0
 * weights stream W once through int8 tensor cores, the tokens as the n of the mma
 * (kernels/gemvm_cuda.cu; 9 .. 16 tokens as two n-tiles of 8); before the rules above. Defaults
 * MLA_CUDA_GEMVM_TMIN / _TMAX (2 .. 16: whole V2-Lite steps of 2 / 3 tokens 8% / 10% shorter than
 * on the per-warp GEMV, H100 2026-12-06, bench/results/gemvm-tmin-h100-2026-12-06.md; the
 * worker's, its tmin the developer switch of that name); tmax 0: never (the op
 * checks compare them). 2 <= tmin, tmax <= MLA_CUDA_GEMVM_TMAX. mla_cuda_gemvm_takes: whether a
 * dense product of T tokens of type t, rows of `in` elements (one matrix) takes it under the
 * present setting and device (false without a device); the chooser's gm_max rule. */
#define MLA_CUDA_GEMVM_TMIN 2
#define MLA_CUDA_GEMVM_TMAX 16
void mla_cuda_set_gemv_mma(int tmin, int tmax);
bool mla_cuda_gemvm_takes(uint32_t t, int64_t in, int64_t T);
/* The experts of steps of 2 .. tmax tokens (mla_cuda_matmul_grouped_q8 over a plan whose tiles
 * hold 1-8 pairs) of Q4_K, Q6_K, Q8_0 and Q5_0 weights take that GEMV's grouped form for the
 * tiles the streamed GEMV leaves (by default those of the experts with more than one pair; with
 * its grouped_tmax 0, every tile) in place of the per-warp GEMV: those tiles in one launch a
 * product, a tile's pairs as the 8 tokens of the mma. Default MLA_CUDA_GEMVM_GRP_TMAX (the
 * worker's, or MLA_CUDA_GEMVM_GRP); 0: never (the op checks compare them). */
#define MLA_CUDA_GEMVM_GRP_TMAX 64
void mla_cuda_set_gemv_mma_grouped(int tmax);
/* Steps of one token (plans of one pair a tile) on the streamed GEMV take its warp-specialized
 * kernel (a producer warp, no block barrier a stage; the same bits) unless on is 0: for the op
 * checks, which compare the two. */
void mla_cuda_set_gemv_ws(int on);
/* The warp-specialized kernel's dense launches from now on write time stamps (the global nanosecond
 * clock) into d_stamps, MLA_CUDA_GEMV_TRACE_N words a block of the grid (at most 2 blocks an SM):
 * thread 0 of the consumers [0] at entry, [1] once the kernel before is done, [2] once it has
 * dotted its last stage, [3] the block's stage count, [4 + k] when stage k landed; the producer
 * [64 + k] when it posted stage k (stages past 60 / 64 unstamped; a dense product's first posts
 * are stamped before the wait on the kernel before). NULL (the default): none. For the op
 * harness's timeline (mla-gpu-check --gemvtrace). */
#define MLA_CUDA_GEMV_TRACE_N 128
void mla_cuda_set_gemv_trace(unsigned long long *d_stamps);
size_t mla_cuda_q8_bytes(int64_t T, int64_t in);
int mla_cuda_quantize_q8(const float *d_x, int64_t T, int64_t in, void *d_q8, mla_cuda_stream stream, mla_err *e);
int mla_cuda_matmul_q8(uint32_t t, const void *d_w, int64_t in, int64_t out, const void *d_q8, int64_t T,
                       float *d_y, mla_cuda_stream stream, mla_err *e);
/* y = silu(x Wg^T) * (x Wu^T) from one q8 buffer (Wg, Wu: type t, out x in), as
 * mla_cuda_matmul_q8 twice then mla_cuda_swiglu (the same bits); where the streamed GEMV takes
 * the step, one kernel reads both matrices, else d_u ([T][out] floats) holds x Wu^T. d_yq: NULL,
 * or a q8 buffer of T rows of out (mla_cuda_q8_bytes) that also gets y, as mla_cuda_quantize_q8
 * after it would give it (the same bytes; the GEMV's warp-specialized kernel rounds its own rows,
 * no kernel more). */
int mla_cuda_matmul_q8_swiglu(uint32_t t, const void *d_wg, const void *d_wu, int64_t in, int64_t out,
                              const void *d_q8, int64_t T, float *d_y, float *d_u, void *d_yq,
                              mla_cuda_stream stream, mla_err *e);
/* ya = x Wa^T and yb = x Wb^T from one q8 buffer (both of type t, rows of `in`), as
 * mla_cuda_matmul_q8 twice (the same bits); one kernel where the streamed GEMV takes the step */
int mla_cuda_matmul_q8_pair(uint32_t t, const void *d_wa, int64_t out_a, float *d_ya, const void *d_wb, int64_t out_b,
                            float *d_yb, int64_t in, const void *d_q8, int64_t T, mla_cuda_stream stream, mla_err *e);
/* The same product on the tensor cores (int8 mma, 64 tokens x 64 rows a block): for prefill and
 * large batches, where the GEMV's passes over W (one per 8 tokens) cost more. */
int mla_cuda_matmul_q8_mma(uint32_t t, const void *d_w, int64_t in, int64_t out, const void *d_q8, int64_t T,
                           float *d_y, mla_cuda_stream stream, mla_err *e);

/* The prefill path for quantized weights on the fp16 tensor cores: x is first converted to fp16,
 * each row scaled by a power of two that puts its largest element below 2^14 (11 significant bits
 * of every element; the scale comes back out exactly), W is dequantized to fp16 in shared memory
 * (one more rounding, 2^-11 relative), products summed in fp32. Relative error ~3e-4, below the
 * int8 path's ~3e-3; no per-32 rescaling, so the tensor cores set the pace.
 * mla_cuda_mmh_supported: the quantized types (as q8), in a multiple of 128 and of the block.
 * An fp16 buffer of T rows of `in` takes mla_cuda_act_h_bytes(T, in) bytes (16-aligned; x
 * 16-aligned, in % 4 == 0), enough for any fewer rows or shorter ones: it ends with the dense
 * product's workspace (steps of up to 64 tokens split K over more blocks and sum the parts in a
 * fixed order);
 * mla_cuda_act_h fills it; mla_cuda_matmul_h computes y [T][out] from it (up to 128 tokens x 128
 * rows a block), using the workspace: one product at a time per buffer (stream order). On compute
 * capability 9.0, Q4_K products of more than 64 tokens take the warpgroup kernel of
 * kernels/wgmma_cuda.h (same values; mlacu_wg_set(0) keeps them here). */
bool mla_cuda_mmh_supported(uint32_t t, int64_t in);
size_t mla_cuda_act_h_bytes(int64_t T, int64_t in);
int mla_cuda_act_h(const float *d_x, int64_t T, int64_t in, void *d_xh, mla_cuda_stream stream, mla_err *e);
/* the same buffer filled from swiglu(g, u) rows (the experts' hidden rows): the bits of
 * mla_cuda_swiglu then mla_cuda_act_h, without the fp32 rows between them */
int mla_cuda_swiglu_h(const float *d_g, const float *d_u, int64_t T, int64_t in, void *d_xh, mla_cuda_stream stream,
                      mla_err *e);
int mla_cuda_matmul_h(uint32_t t, const void *d_w, int64_t in, int64_t out, const void *d_xh, int64_t T,
                      float *d_y, mla_cuda_stream stream, mla_err *e);

/* ---- element-wise and per-row ops (same meaning as the CPU op named) ---- */
/* rmsnorm (kernels/rmsnorm.h) and layernorm (kernels/layernorm.h; w or b may be NULL). */
int mla_cuda_rmsnorm(const float *d_x, int64_t ldx, int64_t T, int64_t n, const float *d_w, float eps,
                     float *d_y, int64_t ldy, mla_cuda_stream stream, mla_err *e);
/* rmsnorm with the residual add before it and the q8 quantization after it, in one kernel: with
 * d_res, the sum x [T][n] + res [T][n] first (ldx == n), as mla_cuda_add makes it, written to d_xsum
 * (d_x itself: in place; another buffer lets a row be shared by several blocks), and normalized;
 * else x is; y = rmsnorm as mla_cuda_rmsnorm; with d_q8 (n % 32 == 0, ldy == n), also y's q8
 * buffer as mla_cuda_quantize_q8(y, T, n, d_q8) fills it; with d_h16 (n % 4 == 0, ldy == n), also
 * y's fp16 rows as mla_cuda_act_h(y, T, n, d_h16) fills them (the products on the fp16 tensor
 * cores read them). The same bits as those ops in turn. */
int mla_cuda_rmsnorm_ex(const float *d_x, const float *d_res, float *d_xsum, int64_t ldx, int64_t T, int64_t n,
                        const float *d_w, float eps, float *d_y, int64_t ldy, void *d_q8, void *d_h16,
                        mla_cuda_stream stream, mla_err *e);
int mla_cuda_layernorm(const float *d_x, int64_t ldx, int64_t T, int64_t n, const float *d_w,
                       const float *d_b, float eps, float *d_y, int64_t ldy, mla_cuda_stream stream,
                       mla_err *e);
/* act_swiglu: y = silu(g) * u; act_add: y += a. */
int mla_cuda_swiglu(const float *d_g, const float *d_u, float *d_y, int64_t n, mla_cuda_stream stream,
                    mla_err *e);
int mla_cuda_add(float *d_y, const float *d_a, int64_t n, mla_cuda_stream stream, mla_err *e);
/* rope_apply for T tokens at once: token t's n_vec vectors start at d_x + t*tok_stride (vector
 * v at + v*stride) and sit at position d_pos[t] (device array), or pos0 + t when d_pos is NULL.
 * t is the host table from rope_table_init (its inv_freq travels as a kernel argument). */
int mla_cuda_rope(const rope_table *t, int mode, float *d_x, int64_t T, int64_t n_vec, int64_t stride,
                  int64_t tok_stride, int64_t pos0, const int32_t *d_pos, mla_cuda_stream stream,
                  mla_err *e);
/* moe_route for T tokens: d_logits [T][n_expert], d_bias [n_expert] or NULL, d_ids/d_w
 * [T][n_used]. n_expert <= 1024, n_group <= 32, n_used <= 32. */
int mla_cuda_moe_route(const moe_route_params *p, const float *d_logits, const float *d_bias,
                       int64_t T, int32_t *d_ids, float *d_w, mla_cuda_stream stream, mla_err *e);
/* Greedy sampling: d_ids[t] = argmax of row t of d_logits [T][n] (ties: lowest index). */
int mla_cuda_argmax(const float *d_logits, int64_t T, int64_t n, int32_t *d_ids,
                    mla_cuda_stream stream, mla_err *e);
/* The same over rows gathered from `pieces` ranks: row t is piece 0..pieces-1 of n_piece values
 * each, piece r at d_logits + (r * T + t) * n_piece (an all-gather of vocabulary slices). */
int mla_cuda_argmax_pieces(const float *d_logits, int64_t T, int64_t n_piece, int pieces, int32_t *d_ids,
                           mla_cuda_stream stream, mla_err *e);
/* The input tokens of a decode step from the ids the step before sampled on the device: d_tok[t]
 * = d_ids[t] where it is a token of the vocabulary, else 0 (a row that took none, -1, feeds a
 * valid row to the embedding gather; its step's result is not used). d_tok may be d_ids. */
int mla_cuda_ids_to_tokens(const int32_t *d_ids, int64_t T, int64_t n_vocab, int32_t *d_tok, mla_cuda_stream stream,
                           mla_err *e);
/* One row's settings for mla_cuda_sample_pieces (a device array of them). */
typedef struct mla_cuda_samp {
    float temperature; /* 0: greedy */
    int32_t top_k;     /* 0: off */
    float top_p;       /* 1: off */
    float min_p;       /* 0: off */
    uint64_t seed, stream; /* the draw: sampler_uniform(seed, stream) of worker/sample.c */
    int32_t mask;      /* -1: every token; else this row's mask is d_masks + mask * (n_piece * pieces) bytes (0: not allowed) */
    int32_t bias_off, n_bias; /* logit_bias entries d_bias_ids/d_bias_vals[bias_off, bias_off + n_bias) */
} mla_cuda_samp;
/* the most logit_bias entries of one row (WIRE_MAX_BIAS is 300); a row with more takes -1 */
#define MLA_CUDA_SAMPLE_MAX_BIAS 1024

/* Sampling of T rows laid out as mla_cuda_argmax_pieces lays them out (pieces 1: plain rows of n_piece),
 * each with d_rows[t]: d_ids[t] = the token sampler_sample_mod (worker/sample.c) takes from that row with
 * no penalties (repetition 1, presence 0, frequency 0) and the row's mask and biases, up to floating-point
 * rounding at the boundaries of the kept set and of the draw; -1 when no token of the row has a finite
 * value. Deterministic: the same inputs give the same ids on every run (every rank of a tensor-parallel
 * group runs it on the same gathered logits and must take the same token).
 * Details (kernels/sample_cuda.cu): one block a row; a value that is not finite after the bias (NaN,
 * +-inf) counts as masked; temperature <= 0 is greedy; probabilities are 44-bit fixed point (a token
 * below 2^-45 of the largest is never drawn); n_piece * pieces < 2^19, pieces <= 64. */
int mla_cuda_sample_pieces(const float *d_logits, int64_t T, int64_t n_piece, int pieces, const mla_cuda_samp *d_rows,
                           const uint8_t *d_masks, const int32_t *d_bias_ids, const float *d_bias_vals, int32_t *d_ids,
                           mla_cuda_stream stream, mla_err *e);
/* Embedding gather: d_out[t][0..n) = dequantized row d_ids[t] of d_w (rows of n elements of
 * type t, as in mla_cuda_matmul). */
int mla_cuda_get_rows(uint32_t type, const void *d_w, int64_t n, const int32_t *d_ids, int64_t T,
                      float *d_out, mla_cuda_stream stream, mla_err *e);

/* ---- attention (kernels/attn_mla_cuda.cu), indexer (dsa_cuda.cu), per-head matmuls
 * (head_cuda.cu), experts (moe_cuda.cu) ---- */
/* The paged latent cache: a sequence's cache is a list of blocks of MLA_CUDA_KV_BLOCK token slots
 * (its block table: a device array of block base pointers). A block holds, for each of the
 * model's layers, MLA_CUDA_KV_BLOCK rows of the latent cache (kv_lora + rope floats), then for
 * each layer as many indexer key rows (glm-dsa); the ops take the offset of one layer's rows
 * inside a block. Row j of a sequence: table[j / BS] + offset + (j % BS) * row elements. The
 * latent rows may be fp16 (mla_cuda_attn_args.kv_f16, mla_cuda_scatter_paged's dst_f16), their
 * offset and row length then counting halves from the block's base; the model's indexer keys are
 * fp16 beside an fp16 latent cache (mla_cuda_dsa_scores_paged_h: offset in halves), else floats
 * (mla_cuda_dsa_scores_paged). */
#define MLA_CUDA_KV_BLOCK_LOG2 6
#define MLA_CUDA_KV_BLOCK (1 << MLA_CUDA_KV_BLOCK_LOG2)
/* Absorbed MLA attention, the meaning of mla_attn (kernels/mla_attn.h) with two extensions: q_pe
 * of token t, head h at d_q_pe + t*q_pe_ld_t + h*q_pe_ld_h (contiguous: ld_t = n_head*n_rope,
 * ld_h = n_rope), and a split over key chunks (flash-decoding): with d_work (work_floats floats,
 * see mla_cuda_attn_work_floats) each (token, head) is computed as up to n_splits partial
 * softmaxes combined by a second kernel; d_work NULL: one pass per (token, head).
 * kv_lora <= 1024, n_rope <= 128. All pointers are device pointers; sel/n_sel as in mla_attn. */
typedef struct mla_cuda_attn_args {
    const float *q_abs, *q_pe;
    int64_t q_pe_ld_t, q_pe_ld_h;
    int64_t n_tokens, n_head, kv_lora, n_rope;
    const void *kv; /* the contiguous cache: rows of kv_lora + n_rope floats (kv_f16: halves) */
    int64_t pos0;
    float scale;
    const int32_t *sel, *n_sel;
    int64_t sel_stride;
    float *out;
    float *work;
    size_t work_floats;
    /* Paged cache and tokens of different sequences (a batched step): when blk_tok is set, token
     * t reads its keys from the paged cache of its own sequence, blk_tok[t] (a device array of
     * that sequence's block table, see MLA_CUDA_KV_BLOCK), rows at blk_off floats into each block,
     * instead of kv; when pos_tok is set, token t sits at position pos_tok[t] (device array)
     * instead of pos0 + t, and max_keys (> every pos_tok[t]) sizes the grid, so one launch shape
     * serves every step (CUDA graphs). */
    const float *const *const *blk_tok;
    int64_t blk_off;
    const int32_t *pos_tok;
    int64_t max_keys;
    /* 1: fp16 tensor cores (queries, keys and softmax weights rounded to fp16, fp32 accumulation,
     * as llama.cpp's FlashAttention) where a kernel exists for the shape (kv_lora 512 + rope 64, the
     * DeepSeek/Kimi/GLM-5 width, on GPUs that give a block 113 KB of shared memory, or 256 + 32,
     * the fixtures'; the cache and offsets 16-byte aligned); other shapes and 0: fp32 CUDA cores. */
    int tensor_cores;
    /* 1: the cache (kv, or the blocks' latent rows) holds fp16, blk_off counting halves; the
     * tensor-core kernel reads it as it is (it rounds an fp32 cache to fp16 itself), the fp32
     * kernel widens it. 0: floats. */
    int kv_f16;
    /* n_splits_out NULL: the launch combines its splits itself. Else *n_splits_out gets the splits
     * a launch of 2 .. comb_max splits leaves uncombined in work (the caller combines them:
     * mla_cuda_head_matmul_q8_comb), or 1: out holds the result. */
    int comb_max;
    int *n_splits_out;
} mla_cuda_attn_args;
size_t mla_cuda_attn_work_floats(int64_t n_tokens, int64_t n_head, int64_t kv_lora, int n_splits);
/* Blocks of the tensor-core attention (512 + 64) resident per SM on this device (2 by design on
 * Hopper; 0 where a block cannot have its 113 KB of shared memory and the fp32 kernel is used;
 * -1 on an error): what the op harness reports. */
int mla_cuda_attn_tc_blocks_per_sm(void);
/* The splits over keys the tensor-core attention takes (its default least keys a split) for
 * n_tokens tokens of n_head heads, latent kv_lora, up to max_keys keys a token, a work buffer of
 * work_floats floats (0: none, one split), on a device of `sms` SMs holding blocks_per_sm blocks
 * each: a pure function of its arguments (needs no device), what a launch on such a device
 * computes. */
int mla_cuda_attn_tc_splits(int64_t n_tokens, int64_t n_head, int64_t kv_lora, int64_t max_keys, size_t work_floats,
                            int blocks_per_sm, int sms);
/* The tensor-core attention's key tile for latent kv_lora + rope n_rope on this device: 32, 16 (the
 * 512 + 64 kernel within 99 KB a block), or 0 (no tensor-core kernel: the fp32 one); and that
 * kernel's shared memory a block in bytes (0: none). MLA_CUDA_SMEM_CAP applies. */
int mla_cuda_attn_tc_tile(int64_t kv_lora, int64_t n_rope);
size_t mla_cuda_attn_tc_smem(int64_t kv_lora, int64_t n_rope);
/* For tests: on, the 512 + 64 tensor-core attention takes its 16-key tiles also where the 32-key
 * kernel fits (the sm_120 kernel checked on any device). Not thread-safe: set it before launches. */
void mla_cuda_attn_tile16(bool on);
/* For the op harness's timings: the tensor-core kernel's least keys a split (a multiple of 32;
 * 0 restores the default, 128). Process-wide. */
void mla_cuda_attn_tune(int min_keys);
/* The warpgroup (wgmma, sm_90a) decode attention (kernels/attn_wg_cuda.h): mla_cuda_mla_attn takes
 * it with tensor_cores on a compute capability 9.0 device for an fp16 cache of 512 + 64, heads a
 * multiple of 64, 16-byte aligned rows, and a grid of at least MLA_CUDA_ATTN_WG_MIN_KEYS keys a
 * token (max_keys, or pos0 + n_tokens), or with selected keys (DSA) a step of at least
 * MLA_CUDA_ATTN_WG_SEL_MIN_TOKENS tokens (a decode batch of 8, a prompt's; on an H200 one token
 * is faster on the mma.sync kernel, 8 on this one). mla_cuda_attn_wg_ok:
 * whether this build and device run it. mla_cuda_attn_wg, for the op harness's A/B: 0 never, 1
 * the default rule, 2 wherever the shape allows it (any context). Process-wide, not thread-safe. */
#define MLA_CUDA_ATTN_WG_MIN_KEYS 16384
#define MLA_CUDA_ATTN_WG_SEL_MIN_TOKENS 8
int mla_cuda_attn_wg_ok(void);
void mla_cuda_attn_wg(int mode);
/* The warpgroup (wgmma, sm_90a) kernels of the non-absorbed prompt path (kernels/attn_pfwg_cuda.h):
 * mla_cuda_prefill_attn (kernels/attn_prefill_cuda.h) takes them in place of the mma.sync ones for
 * head_nope / n_rope / head_v 128 / 64 / 128 and 192 / 64 / 256 on a compute capability 9.0 device
 * (the decompression with fp16 weights). mla_cuda_prefill_wg_ok: whether this build and device run
 * them. mla_cuda_prefill_wg, for the op harness's A/B only: 0 never (the mma.sync kernels), 1 the
 * default rule, 2 the warpgroup decompression with the mma.sync attention. Process-wide, not
 * thread-safe: set it before launches. */
int mla_cuda_prefill_wg_ok(void);
void mla_cuda_prefill_wg(int mode);
/* its splits over keys (as mla_cuda_attn_tc_splits; one block an SM): a pure function */
int mla_cuda_attn_wg_splits(int64_t n_tokens, int64_t n_head, int64_t kv_lora, int64_t max_keys, size_t work_floats,
                            int sms);
int mla_cuda_mla_attn(const mla_cuda_attn_args *a, mla_cuda_stream stream, mla_err *e);

/* DSA indexer (kernels/dsa_indexer.h): d_scores[t*ld + j] = dsa_scores of query t for keys
 * j <= pos0 + t (entries past that are left alone); ld >= pos0 + T. */
int mla_cuda_dsa_scores(const float *d_q, const float *d_w, const float *d_k, int64_t T, int64_t n_head,
                        int64_t head_dim, int64_t pos0, float *d_scores, int64_t ld, mla_cuda_stream stream,
                        mla_err *e);
/* dsa_topk of each row t over its pos0 + t + 1 scores (every key when that is <= top_k): sel
 * [T][top_k] ascending ids, n_sel [T]. Same tie rule (higher score, then lower id; NaN = -inf). */
int mla_cuda_dsa_topk(const float *d_scores, int64_t ld, int64_t T, int64_t pos0, int64_t top_k, int32_t *d_sel,
                      int32_t *d_nsel, mla_cuda_stream stream, mla_err *e);

/* The same over paged caches: query t (position d_pos[t], device) scores the keys of its own
 * sequence (block table d_blk_tok[t], rows of head_dim floats at blk_off floats into each block);
 * grid sized by max_keys > every d_pos[t]; ld >= max_keys. A query with no more than skip_keys
 * keys is not scored (its row is left alone): with skip_keys = top_k, mla_cuda_dsa_topk_tok
 * selects all of such a query's keys without reading its row; 0 scores every query. */
int mla_cuda_dsa_scores_paged(const float *d_q, const float *d_w, const float *const *const *d_blk_tok, int64_t blk_off,
                              const int32_t *d_pos, int64_t T, int64_t n_head, int64_t head_dim, int64_t max_keys,
                              int64_t skip_keys, float *d_scores, int64_t ld, mla_cuda_stream stream, mla_err *e);
/* dsa_topk of row t over its d_pos[t] + 1 scores. */
int mla_cuda_dsa_topk_tok(const float *d_scores, int64_t ld, int64_t T, const int32_t *d_pos, int64_t top_k,
                          int32_t *d_sel, int32_t *d_nsel, mla_cuda_stream stream, mla_err *e);
/* The model's indexer cache holds fp16 keys: the same scores as mla_cuda_dsa_scores_paged over
 * rows of head_dim halves at blk_off halves into each block (queries, weights and scores floats).
 * head_dim 64 or 128 and up to 64 heads (key rows 16-byte aligned) run on the tensor cores
 * (queries rounded to fp16, fp32 accumulation); other shapes on the CUDA cores. d_seq_tab: where
 * the T tokens are of one sequence at positions pos0 .. pos0 + T - 1 (a prompt step), its block
 * table (device), else NULL; with it, 64 tokens or more of head_dim 128 and 17-64 heads run on
 * the warpgroup tensor cores where the device has them (kernels/dsa_wg_cuda.h). */
int mla_cuda_dsa_scores_paged_h(const float *d_q, const float *d_w, const float *const *const *d_blk_tok, int64_t blk_off,
                                const int32_t *d_pos, const float *const *d_seq_tab, int64_t pos0, int64_t T,
                                int64_t n_head, int64_t head_dim, int64_t max_keys, int64_t skip_keys, float *d_scores,
                                int64_t ld, mla_cuda_stream stream, mla_err *e);
/* Whether mla_cuda_dsa_scores_paged_h's warpgroup kernel runs here; mode 0 keeps prompt steps on
 * the mma.sync kernel (the op checks compare the two), 1 (the default) lets it run. */
int mla_cuda_dsa_wg_ok(void);
void mla_cuda_dsa_wg(int mode);
/* mla_cuda_dsa_topk_tok's selection, for rows of up to ld keys: past 8192 keys a row and with
 * fewer rows than the device has multiprocessors, over many blocks a row (a radix select of three
 * passes, then each chunk's ids at its offset), else mla_cuda_dsa_topk_tok's block a row.
 * d_work: mla_cuda_dsa_topk_work_bytes(T, ld) bytes (or more), device memory the op owns while it
 * runs. */
size_t mla_cuda_dsa_topk_work_bytes(int64_t T, int64_t ld);
int mla_cuda_dsa_topk_paged(const float *d_scores, int64_t ld, int64_t T, const int32_t *d_pos, int64_t top_k,
                            void *d_work, int32_t *d_sel, int32_t *d_nsel, mla_cuda_stream stream, mla_err *e);
/* For the op harness: 0 (default) chooses as above; 1 forces the block a row, 2 the many blocks.
 * Process-wide, not thread-safe: set it before launches. */
void mla_cuda_dsa_topk_path(int path);
/* Cache writes of a step: row t of d_src (n floats at d_src + t * src_ld) goes to slot d_pos[t]
 * of token t's paged cache (block table d_blk_tok[t], rows of dst_ld elements at blk_off elements
 * into each block); elements are floats, or with dst_f16 halves (rounded to nearest). */
int mla_cuda_scatter_paged(const float *d_src, int64_t src_ld, int64_t n, int64_t T,
                           const float *const *const *d_blk_tok, int64_t blk_off, const int32_t *d_pos, int64_t dst_ld,
                           int dst_f16, mla_cuda_stream stream, mla_err *e);

/* The cache side of an MLA step in one kernel: row t of d_kva (kv_lora latent floats, then
 * t->n_dims k_pe floats) normalized (rmsnorm, weights d_norm_w) and rotated (rope, adjacent
 * pairs, position d_pos[t]), stored as mla_cuda_scatter_paged stores it (rows of kv_lora +
 * n_dims elements at blk_off), and the n_head query k_pe vectors of token t (d_q + t q_ld, head_ld
 * apart) rotated in place. The same bits as mla_cuda_rmsnorm, mla_cuda_rope (twice) and
 * mla_cuda_scatter_paged in turn. kv_lora <= 8192. */
int mla_cuda_mla_kv_rows(const rope_table *t, const float *d_kva, int64_t T, int64_t kv_lora, const float *d_norm_w,
                         float eps, const float *const *const *d_blk_tok, int64_t blk_off, const int32_t *d_pos,
                         int kv_f16, float *d_q, int64_t q_ld, int64_t n_head, int64_t head_ld,
                         mla_cuda_stream stream, mla_err *e);
/* The indexer's cache side of a DSA step in one kernel: row t of d_ik (D floats, D <=
 * MLA_CUDA_IK_MAX) layer-normalized (weights d_norm_w, bias d_norm_b, eps), its first t->n_dims
 * rotated (adjacent pairs, position d_pos[t]) and stored as mla_cuda_scatter_paged stores it (rows
 * of D elements at blk_off); with d_q (else NULL): token t's n_head query vectors of D (d_q + t
 * n_head D) rotated in place and its n_head head weights (d_w + t n_head) times wscale. The same
 * bits as mla_cuda_layernorm, mla_cuda_rope, mla_cuda_scatter_paged (and mla_cuda_rope of the
 * queries, the weights times wscale) in turn. d_ik itself is left as it was. */
#define MLA_CUDA_IK_MAX 256
int mla_cuda_dsa_ik_rows(const rope_table *t, const float *d_ik, int64_t T, int64_t D, const float *d_norm_w,
                         const float *d_norm_b, float eps, const float *const *const *d_blk_tok, int64_t blk_off,
                         const int32_t *d_pos, int kv_f16, float *d_q, int64_t n_head, float *d_w, float wscale,
                         mla_cuda_stream stream, mla_err *e);
/* A decode step's q-LoRA norm and its cache side in one launch (q_a and kv_a come from one
 * product): mla_cuda_rmsnorm_ex of the T rows of d_x (n floats each, no residual; d_q8: NULL, or
 * y's q8 buffer) and mla_cuda_mla_kv_rows's cache rows, but not its rotation of the queries' k_pe
 * (mla_cuda_head_matmul_q8_rope does that, in k_b). Where mla_cuda_qnorm_kv_rows_supported:
 * n <= 8192 and a multiple of 32, kv_lora <= 8192, n_rope even and <= MLA_CUDA_ROPE_ARG_DIMS. */
#define MLA_CUDA_ROPE_ARG_DIMS 128
bool mla_cuda_qnorm_kv_rows_supported(int64_t n, int64_t kv_lora, int n_rope);
int mla_cuda_qnorm_kv_rows(const float *d_x, int64_t T, int64_t n, const float *d_w, float eps, float *d_y, void *d_q8,
                           const rope_table *t, const float *d_kva, int64_t kv_lora, const float *d_kv_norm_w,
                           const float *const *const *d_blk_tok, int64_t blk_off, const int32_t *d_pos, int kv_f16,
                           mla_cuda_stream stream, mla_err *e);

/* Per-head matrices in float (absorbed k_b, v_b): d_w [n_head][out][in] (in <= 1024);
 * y[t*y_ld_t + h*y_ld_h + o] = sum_i W[h][o][i] * x[t*x_ld_t + h*x_ld_h + i]. */
int mla_cuda_head_matmul(const float *d_w, int64_t n_head, int64_t in, int64_t out, const float *d_x,
                         int64_t x_ld_t, int64_t x_ld_h, int64_t T, float *d_y, int64_t y_ld_t, int64_t y_ld_h,
                         mla_cuda_stream stream, mla_err *e);
/* The same with fp16 weights (d_w: n_head * out * in halves, e.g. converted at load): steps of
 * more than 8 tokens on fp16 tensor cores (x rounded to fp16, fp32 accumulation) when in % 32 == 0
 * and x's strides are multiples of 4 floats (64 tokens and more with in % 64 == 0 on the
 * warpgroup tensor cores where the device has them: kernels/head_wg_cuda.h); up to 8 tokens a
 * GEMV with 16-byte weight loads (in = 64, 128, 256 or 512); else the row-per-warp kernel
 * reading fp16 weights. d_yq: NULL, or the q8 buffer of y's T rows of y_ld_t (y_ld_t = n_head
 * y_ld_h, y_ld_h = out, a multiple of 32), which also gets y as mla_cuda_quantize_q8 after it
 * would give it (the decode GEMV rounds its own rows: no kernel more). */
int mla_cuda_head_matmul_f16(const void *d_w, int64_t n_head, int64_t in, int64_t out, const float *d_x,
                             int64_t x_ld_t, int64_t x_ld_h, int64_t T, float *d_y, int64_t y_ld_t, int64_t y_ld_h,
                             void *d_yq, mla_cuda_stream stream, mla_err *e);
/* Whether its warpgroup kernel runs here; mode 0 keeps prompt steps on the mma.sync kernel (the
 * op checks compare the two), 1 (the default) lets it run. */
int mla_cuda_head_wg_ok(void);
void mla_cuda_head_wg(int mode);
/* The same for decode steps with Q8_0 weights as a GGUF holds them (d_w: n_head * out rows of `in`
 * elements, ggml_row_bytes(Q8_0, in) each, 16-aligned): steps of up to 8 tokens, y = per row the
 * sum over its 32-element blocks of d * (q . x) in fp32; d_yq as mla_cuda_head_matmul_f16. The
 * weights are read once, half the bytes of the fp16 copy. Only where mla_cuda_head_q8_supported
 * (in = 64, 128, 192, 256 or 512; out a multiple of the kernel's rows a block: 64, 32 at 512). */
bool mla_cuda_head_q8_supported(int64_t in, int64_t out);
int mla_cuda_head_matmul_q8(const void *d_w, int64_t n_head, int64_t in, int64_t out, const float *d_x,
                            int64_t x_ld_t, int64_t x_ld_h, int64_t T, float *d_y, int64_t y_ld_t, int64_t y_ld_h,
                            void *d_yq, mla_cuda_stream stream, mla_err *e);
/* The same (k_b) that also rotates, in place, the T tokens' query k_pe of each head (t->n_dims <=
 * MLA_CUDA_ROPE_ARG_DIMS floats at d_qpe + t*qpe_ld_t + h*qpe_ld_h, position d_pos[t]): the
 * rotation mla_cuda_mla_kv_rows does and mla_cuda_qnorm_kv_rows leaves out. The k_pe must not
 * overlap the rows of x the product reads. */
int mla_cuda_head_matmul_q8_rope(const void *d_w, int64_t n_head, int64_t in, int64_t out, const float *d_x,
                                 int64_t x_ld_t, int64_t x_ld_h, int64_t T, float *d_y, int64_t y_ld_t, int64_t y_ld_h,
                                 const rope_table *t, float *d_qpe, int64_t qpe_ld_t, int64_t qpe_ld_h,
                                 const int32_t *d_pos, mla_cuda_stream stream, mla_err *e);

/* mla_cuda_head_matmul_q8 (v_b) of x = the combine of the attention's n_splits uncombined splits
 * (d_work as mla_cuda_mla_attn leaves it with n_splits_out; in = its kv_lora), combined as the
 * attention's own combine does, in the head GEMV's prologue: a head's rows over as few blocks as
 * give 3/4 of the SMs a block (V3's 128 heads one each, GLM-5's 64 two, V2-Lite's 16 four), each
 * block combining the head's splits. Only where mla_cuda_head_q8_comb_supported (in 256 or 512,
 * T 1 .. 8, 2 .. 32 splits, a head's rows in shared memory). */
#define MLA_CUDA_HEAD_COMB_MAXS 32
bool mla_cuda_head_q8_comb_supported(int64_t in, int64_t out, int64_t T, int n_splits);
int mla_cuda_head_matmul_q8_comb(const void *d_w, int64_t n_head, int64_t in, int64_t out, const float *d_work,
                                 int n_splits, int64_t T, float *d_y, int64_t y_ld_t, int64_t y_ld_h, void *d_yq,
                                 mla_cuda_stream stream, mla_err *e);

/* MoE on the device (moe_experts_apply): a plan groups the (token, slot) pairs p = t*n_used + k by
 * expert with a counting sort on the GPU (no host sync), keeping only experts e % world == rank,
 * and cuts each expert's pairs into tiles of <= 8: first the experts with one pair, a tile each,
 * then the others' tiles. Buffers live in caller memory of mla_cuda_moe_plan_bytes(); max_tiles
 * is the grid bound (the real counts stay on the device: n_tiles[0] tiles, the first n_tiles[1]
 * of them single). */
#define MLA_CUDA_MOE_TILE 8 /* pairs a tile of a plan at most */
typedef struct mla_cuda_moe_plan {
    int32_t *sorted, *tile_e, *tile_s, *tile_n, *n_tiles, *counts;
    int64_t max_tiles;
    int64_t tokens; /* the T it was laid out / built for: no tile has more pairs */
    int world, rank;
    /* false after init and build; the caller sets it once a kernel that waits on the plan's kernel
     * (a product over the plan) is queued after it: then every kernel of kernels/ queued later
     * starts after the plan's kernel has finished (each waits on the one before before it lets the
     * next one start: cuda_internal.h), and the streamed GEMVs over the plan read it and post their
     * first weight copies before their own wait */
    bool settled;
} mla_cuda_moe_plan;
size_t mla_cuda_moe_plan_bytes(int64_t T, int64_t n_used, int64_t n_expert);
/* Lays the plan out in d_mem (mla_cuda_moe_plan_bytes bytes) for T tokens. */
void mla_cuda_moe_plan_init(mla_cuda_moe_plan *p, void *d_mem, int64_t T, int64_t n_used, int64_t n_expert,
                            int rank, int world);
int mla_cuda_moe_plan_build(mla_cuda_moe_plan *p, const int32_t *d_ids, int64_t T, int64_t n_used,
                            int64_t n_expert, mla_cuda_stream stream, mla_err *e);
/* Grouped GEMV over a plan's tiles (mm_gemv_cuda.cu): pair p of expert e reads x row p / x_div and
 * writes y row p: y[p][o] = W0_e[o] . x (d_w1 NULL), or silu(W0_e[o] . x) * (W1_e[o] . x)
 * (gate and up of one type). W_e starts at (e / world) * estride bytes (this rank's experts
 * packed in order). */
int mla_cuda_matmul_grouped(uint32_t t, const void *d_w0, const void *d_w1, size_t estride, int64_t in,
                            int64_t out, const float *d_x, int x_div, const mla_cuda_moe_plan *plan, float *d_y,
                            mla_cuda_stream stream, mla_err *e);
/* The same from a q8 buffer of the x_rows rows of x (mla_cuda_quantize_q8); t quantized. d_yq:
 * NULL, or a q8 buffer of the x_rows x_div rows of y that also gets the rows the plan writes, as
 * mla_cuda_matmul_q8_swiglu's d_yq. */
int mla_cuda_matmul_grouped_q8(uint32_t t, const void *d_w0, const void *d_w1, size_t estride, int64_t in,
                               int64_t out, const void *d_q8, int64_t x_rows, int x_div, const mla_cuda_moe_plan *plan,
                               float *d_y, void *d_yq, mla_cuda_stream stream, mla_err *e);
/* The same on the int8 tensor cores, one weight matrix (no gate/up fusion), for steps with many
 * tokens per expert (long prompts; mla_cuda_moe_apply takes it from 64 a expert on average): 64
 * pairs of one expert a tile, walked from the plan's counts. */
int mla_cuda_matmul_grouped_q8_mma(uint32_t t, const void *d_w, size_t estride, int64_t in, int64_t out,
                                   const void *d_q8, int64_t x_rows, int x_div, const mla_cuda_moe_plan *plan,
                                   int64_t n_expert, float *d_y, mla_cuda_stream stream, mla_err *e);
/* The same on the fp16 tensor cores (mla_cuda_matmul_h) from an fp16 buffer of the x_rows rows
 * of x (mla_cuda_act_h or mla_cuda_swiglu_h): bm (32 or 64) pairs of one expert a tile (Q4_K on
 * compute capability 9.0: the warpgroup kernel, which picks its own tile). */
int mla_cuda_matmul_grouped_h(uint32_t t, const void *d_w, size_t estride, int64_t in, int64_t out,
                              const void *d_xh, int64_t x_rows, int x_div, const mla_cuda_moe_plan *plan,
                              int64_t n_expert, int bm, float *d_y, mla_cuda_stream stream, mla_err *e);
/* out[t] += sum_k w[t][k] * y[t*n_used + k] over the pairs whose expert this rank owns (k in
 * increasing order). */
int mla_cuda_moe_combine(const float *d_y, const int32_t *d_ids, const float *d_w, int64_t T, int64_t n_used,
                         int64_t n, int rank, int world, float *d_out, mla_cuda_stream stream, mla_err *e);
/* Device MoE: routed experts of this rank (experts packed as above) applied to x [T][n_embd],
 * added into out; d_work of mla_cuda_moe_work_bytes(). d_xq: NULL, or x's q8 buffer
 * (mla_cuda_quantize_q8(d_x, T, n_embd)) where the caller has it; d_xh: NULL, or x's fp16 buffer
 * (mla_cuda_act_h(d_x, T, n_embd)) where the caller has it (either made here when needed). */
typedef struct mla_cuda_experts {
    uint32_t gate_type, up_type, down_type;
    const void *gate, *up, *down;
    size_t gate_estride, up_estride, down_estride;
    int64_t n_embd, n_ff, n_expert;
    int rank, world;
    bool q8; /* the integer GEMV (mla_cuda_matmul_q8) for the quantized ones of the three */
    /* from this many pairs a expert on average (0: never), the fp16 tensor cores
     * (mla_cuda_matmul_grouped_h) when all three types allow them */
    int mmh_min;
} mla_cuda_experts;
size_t mla_cuda_moe_work_bytes(int64_t T, int64_t n_used, int64_t n_embd, int64_t n_ff, int64_t n_expert);
int mla_cuda_moe_apply(const mla_cuda_experts *ex, const float *d_x, const void *d_xq, const void *d_xh, int64_t T,
                       const int32_t *d_ids, const float *d_w, int64_t n_used, float *d_out, void *d_work,
                       mla_cuda_stream stream, mla_err *e);

/* Known-answer tests of every CUDA op against its CPU reference on small random inputs
 * (kernels/cuda_selfcheck.cu). MLA_OK when all pass; else MLA_ERR naming the first failure.
 * Needs mla_cuda_init first. Workers call it before serving. */
int cuda_selfcheck(mla_err *e);

/* The configuration the kernels choose on the current device (kernels/cuda_selfcheck.cu), what a
 * worker logs at start. Needs mla_cuda_init first. */
typedef struct mla_cuda_config {
    int arch;         /* compute capability, major * 10 + minor (90: an H100/H200) */
    int arch_as;      /* the architecture the kernels choose for: arch, or MLA_CUDA_SMEM_CAP's (120, 100) */
    int smem_dev;     /* the device's opt-in shared memory a block, bytes */
    int smem_cap;     /* what the kernels may use (smem_dev, or less under MLA_CUDA_SMEM_CAP) */
    bool wgmma;       /* the sm_90a warpgroup kernels run (built for sm_90a, a 9.0 device, no cap) */
    int attn_tile;    /* the model's tensor-core attention's key tile: 32, 16, or 0 (the fp32 kernel) */
    size_t attn_smem; /* its shared memory a block, bytes (0: the fp32 kernel) */
} mla_cuda_config;
/* for a model of latent kv_lora + rope n_rope whose attention takes the tensor cores (attn_tc) */
void mla_cuda_config_get(mla_cuda_config *c, int64_t kv_lora, int64_t n_rope, bool attn_tc);
/* c as one line, e.g. "sm_90 as sm_120, attention tc16 (75.3 KB a block), shared memory cap 99.0 KB
 * a block (device 227.0 KB), wgmma off"; snprintf's return */
int mla_cuda_config_str(const mla_cuda_config *c, char *buf, size_t n);
/* the attention variant's name: "tc32", "tc16" or "fp32" */
const char *mla_cuda_config_attn(const mla_cuda_config *c);

#ifdef __cplusplus
}
#endif

#endif
