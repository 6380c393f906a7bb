/* The matmul chooser (mla_cuda_mm_choose, kernels/mm_choose_cuda.cu) against the rules of
 * docs/kernels.md, for the policies the model and the MoE give it; the attention's split count
 * over keys (mla_cuda_attn_tc_splits, kernels/attn_mla_cuda.cu) against its rule. Host code
 * only: needs no GPU (runs in CI). */
#include <stdio.h>

#include "kernels/cuda_ops.h"

extern "C" {
#include "common/ggml_types.h"
#include "tests/unit/mla_test.h"
}

/* out: the matrix's outputs (7168 unless given: a dense product, wide) */
static mla_cuda_mm_family one(const mla_cuda_mm_policy &p, uint32_t t, int64_t in, int64_t rows, int64_t out = 7168) {
    return mla_cuda_mm_choose(&p, &t, &in, 1, rows, out);
}

int main(void) {
    const uint32_t Q4K = GGML_TYPE_Q4_K, F32 = GGML_TYPE_F32, F16 = GGML_TYPE_F16, BF16 = GGML_TYPE_BF16;
    /* the model's dense products by default: fp16 tensor cores above 8 tokens, integer GEMV up
     * to 96, int8 tensor cores above */
    const mla_cuda_mm_policy dense = {true, false, false, 9, 97, 0};
    CHECK(one(dense, Q4K, 7168, 1) == MLA_CUDA_MM_Q8);
    CHECK(one(dense, Q4K, 7168, 8) == MLA_CUDA_MM_Q8);
    CHECK(one(dense, Q4K, 7168, 9) == MLA_CUDA_MM_H);
    CHECK(one(dense, Q4K, 7168, 4096) == MLA_CUDA_MM_H);
    /* the model's policy: steps of 9-16 rows that the streamed int8 tensor-core GEMV takes (on
     * the device there is: none without one) stay on the q8 family, the others and steps of more
     * rows take the fp16 tensor cores as before */
    const mla_cuda_mm_policy model = {true, false, false, 9, 97, MLA_CUDA_GEMVM_TMAX};
    CHECK(MLA_CUDA_GEMVM_TMAX == 16);
    for (int64_t r : {9, 12, 16})
        for (uint32_t t : {Q4K, (uint32_t)GGML_TYPE_Q6_K, (uint32_t)GGML_TYPE_Q8_0})
            CHECKF(one(model, t, 2048, r) == (mla_cuda_gemvm_takes(t, 2048, r) ? MLA_CUDA_MM_Q8 : MLA_CUDA_MM_H),
                   "%s rows %lld", ggml_type_name(t), (long long)r);
    CHECK(!mla_cuda_gemvm_takes(GGML_TYPE_Q5_0, 2048, 9) && !mla_cuda_gemvm_takes(Q4K, 2048, 17));
    CHECK(one(model, GGML_TYPE_Q5_0, 2048, 9) == MLA_CUDA_MM_H); /* no tensor-core GEMV of Q5_0 */
    CHECK(one(model, Q4K, 2048, 17) == MLA_CUDA_MM_H);
    CHECK(one(model, Q4K, 2048, 8) == MLA_CUDA_MM_Q8);
    /* no integer form: as without gm_max */
    CHECK(one(model, BF16, 2048, 12) == MLA_CUDA_MM_MMA && one(model, BF16, 2048, 12, 64) == MLA_CUDA_MM_GEMV);
    mla_cuda_set_gemv_mma(MLA_CUDA_GEMVM_TMIN, 8);            /* the GEMV off past 8 tokens */
    CHECK(!mla_cuda_gemvm_takes(Q4K, 2048, 9) && one(model, Q4K, 2048, 9) == MLA_CUDA_MM_H);
    mla_cuda_set_gemv_mma(MLA_CUDA_GEMVM_TMIN, MLA_CUDA_GEMVM_TMAX);
    /* a row length the fp16 kernels do not take (Q8_0 rows of 7200: not whole 128-element
     * chunks): the integer paths at any batch, the int8 tensor cores from 97 rows */
    const uint32_t Q80 = GGML_TYPE_Q8_0;
    CHECK(mla_cuda_mmh_supported(Q80, 7168) && !mla_cuda_mmh_supported(Q80, 7200));
    CHECK(one(dense, Q80, 7200, 9) == MLA_CUDA_MM_Q8);
    CHECK(one(dense, Q80, 7200, 96) == MLA_CUDA_MM_Q8);
    CHECK(one(dense, Q80, 7200, 97) == MLA_CUDA_MM_Q8_MMA);
    CHECK(one(dense, Q80, 7168, 97) == MLA_CUDA_MM_H);
    /* float weights: no integer form; the GEMV up to 8 rows, the bf16 tensor cores above; a
     * router's few outputs (at most 512) keep the GEMV up to 64 rows, the narrow kernel above
     * where the row length is a multiple of 128 */
    CHECK(one(dense, BF16, 2048, 8) == MLA_CUDA_MM_GEMV);
    CHECK(one(dense, BF16, 2048, 9) == MLA_CUDA_MM_MMA);
    CHECK(one(dense, BF16, 2048, 9, 64) == MLA_CUDA_MM_GEMV);
    CHECK(one(dense, F32, 7168, 64, 512) == MLA_CUDA_MM_GEMV);
    CHECK(one(dense, F16, 7168, 65, 256) == MLA_CUDA_MM_NARROW);
    CHECK(one(dense, F32, 2048, 4096, 64) == MLA_CUDA_MM_NARROW);
    CHECK(one(dense, F32, 2048, 4096, 512) == MLA_CUDA_MM_NARROW);
    CHECK(one(dense, F32, 2048, 4096, 513) == MLA_CUDA_MM_MMA);
    CHECK(one(dense, F32, 2080, 4096, 64) == MLA_CUDA_MM_MMA); /* not whole 128-column chunks */
    CHECK(one(dense, Q4K, 2048, 4096, 64) == MLA_CUDA_MM_H);   /* a type with an integer form */
    CHECK(one(dense, F32, 7168, 32, 513) == MLA_CUDA_MM_MMA);
    CHECK(one(dense, F32, 2048, 500) == MLA_CUDA_MM_MMA);
    CHECK(mla_cuda_narrow_supported(F32, 7168, 256) && mla_cuda_narrow_supported(BF16, 6144, 256) &&
          !mla_cuda_narrow_supported(F32, 7168, 513) && !mla_cuda_narrow_supported(GGML_TYPE_Q8_0, 7168, 256) &&
          !mla_cuda_narrow_supported(F16, 7200, 256));
    /* exact: no tensor cores (the model passes no h_min and no q8_mma_min) */
    const mla_cuda_mm_policy exact = {true, false, true, 0, 0, 0};
    CHECK(one(exact, Q4K, 7168, 4096) == MLA_CUDA_MM_Q8);
    CHECK(one(exact, F32, 2048, 4096) == MLA_CUDA_MM_GEMV);
    /* split: float products past the GEMV on the hi/lo split */
    const mla_cuda_mm_policy split = {false, true, false, 0, 0, 0};
    CHECK(one(split, Q4K, 7168, 1) == MLA_CUDA_MM_SPLIT);
    CHECK(one(split, F32, 2048, 300) == MLA_CUDA_MM_SPLIT);
    CHECK(one(exact, F32, 7168, 500, 64) == MLA_CUDA_MM_GEMV);
    CHECK(one(split, F32, 7168, 32, 64) == MLA_CUDA_MM_SPLIT);
    CHECK(one(split, F32, 7168, 65, 64) == MLA_CUDA_MM_NARROW); /* as accurate, and faster */
    CHECK(one(exact, F32, 7168, 4096, 64) == MLA_CUDA_MM_GEMV);
    /* nothing allowed (mla_cuda_matmul): GEMV to 8, bf16 tensor cores above */
    const mla_cuda_mm_policy none = {false, false, false, 0, 0, 0};
    CHECK(one(none, Q4K, 7168, 8) == MLA_CUDA_MM_GEMV);
    CHECK(one(none, Q4K, 7168, 9) == MLA_CUDA_MM_MMA);
    /* the MoE: three matrices together, rows = pairs a expert */
    const mla_cuda_mm_policy moe = {true, false, false, 8, 64, 0};
    const uint32_t q[3] = {Q4K, Q4K, GGML_TYPE_Q6_K};
    const int64_t in[3] = {7168, 7168, 2048};
    CHECK(mla_cuda_mm_choose(&moe, q, in, 3, 7, 7168) == MLA_CUDA_MM_Q8);
    CHECK(mla_cuda_mm_choose(&moe, q, in, 3, 8, 7168) == MLA_CUDA_MM_H);
    const mla_cuda_mm_policy moe_no_h = {true, false, false, 0, 64, 0};
    CHECK(mla_cuda_mm_choose(&moe_no_h, q, in, 3, 63, 7168) == MLA_CUDA_MM_Q8);
    CHECK(mla_cuda_mm_choose(&moe_no_h, q, in, 3, 64, 7168) == MLA_CUDA_MM_Q8_MMA);
    /* float experts of few outputs: the grouped GEMVs (no grouped narrow kernel) */
    const uint32_t f3[3] = {BF16, BF16, BF16};
    const int64_t in3[3] = {2048, 2048, 256};
    CHECK(mla_cuda_mm_choose(&moe, f3, in3, 3, 1000, 256) == MLA_CUDA_MM_MMA);
    /* one matrix without an integer form keeps all three off the tensor cores */
    const uint32_t mixed[3] = {Q4K, Q4K, BF16};
    CHECK(mla_cuda_mm_choose(&moe, mixed, in, 3, 1000, 7168) == MLA_CUDA_MM_MMA);
    CHECK(mla_cuda_mm_choose(&moe, mixed, in, 3, 1000, 7168) != MLA_CUDA_MM_H &&
          mla_cuda_mm_choose(&moe, mixed, in, 3, 1000, 7168) != MLA_CUDA_MM_Q8_MMA);
    /* the attention's splits, the work buffer as the model sizes it (64 tokens of 32 splits), on
     * an H200 (132 SMs, two blocks each): V3's 128 heads (four groups of 32) at batch 8 take one
     * wave of 256 blocks at any long context (9 splits, 288 blocks, were two waves), batch 1 the
     * 264 slots at 128k keys and splits of 64 keys at 1k (16: 64 blocks), batch 64 one split */
    const size_t w128 = mla_cuda_attn_work_floats(64, 128, 512, 32);
    CHECK(mla_cuda_attn_tc_splits(8, 128, 512, 131072, w128, 2, 132) == 8);
    CHECK(mla_cuda_attn_tc_splits(8, 128, 512, 32768, w128, 2, 132) == 8);
    CHECK(mla_cuda_attn_tc_splits(8, 128, 512, 4096, w128, 2, 132) == 8);
    CHECK(mla_cuda_attn_tc_splits(1, 128, 512, 131072, w128, 2, 132) == 66);
    CHECK(mla_cuda_attn_tc_splits(1, 128, 512, 1024, w128, 2, 132) == 16);
    CHECK(mla_cuda_attn_tc_splits(64, 128, 512, 131072, w128, 2, 132) == 1);
    /* the warpgroup kernel (64 heads and one block an SM): V3's batch 8 one wave of 128 blocks,
     * batch 1 the 132 SMs at 128k keys and splits of 128 keys at 1k, batch 64 one split */
    CHECK(mla_cuda_attn_wg_splits(8, 128, 512, 131072, w128, 132) == 8);
    CHECK(mla_cuda_attn_wg_splits(1, 128, 512, 131072, w128, 132) == 66);
    CHECK(mla_cuda_attn_wg_splits(1, 128, 512, 1024, w128, 132) == 8);
    CHECK(mla_cuda_attn_wg_splits(64, 128, 512, 131072, w128, 132) == 1);
    /* no work buffer: one split; a small one bounds them */
    CHECK(mla_cuda_attn_tc_splits(8, 128, 512, 131072, 0, 2, 132) == 1);
    CHECK(mla_cuda_attn_tc_splits(8, 128, 512, 131072, mla_cuda_attn_work_floats(8, 128, 512, 4), 2, 132) == 4);
    /* every long-context launch: within the work buffer, and whole waves (at least 85% of the
     * slots of its last wave busy) unless the keys bound the splits (128 keys each), on an H200,
     * a B200 (148 SMs) and a part of one block an SM (170) */
    const int devs[3][2] = {{2, 132}, {2, 148}, {1, 170}};
    for (const auto &d : devs)
        for (int64_t H : {16, 64, 128})
            for (int64_t T = 1; T <= 64; T++)
                for (int64_t nk : {32768, 131072}) {
                    const size_t w = mla_cuda_attn_work_floats(64, H, 512, 32);
                    const int s = mla_cuda_attn_tc_splits(T, H, 512, nk, w, d[0], d[1]);
                    const int64_t blocks = T * ((H + 31) / 32) * s, slots = (int64_t)d[0] * d[1],
                                  waves = (blocks + slots - 1) / slots;
                    CHECKF(s >= 1 && mla_cuda_attn_work_floats(T, H, 512, s) <= w, "T=%lld H=%lld nk=%lld: %d splits",
                           (long long)T, (long long)H, (long long)nk, s);
                    CHECKF(s == (nk + 127) / 128 || blocks >= 0.85 * (double)(waves * slots),
                           "T=%lld H=%lld nk=%lld slots=%lld: %d splits, %lld blocks in %lld waves", (long long)T,
                           (long long)H, (long long)nk, (long long)slots, s, (long long)blocks, (long long)waves);
                }
    return mla_test_finish();
}
