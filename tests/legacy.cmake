# Legacy MLA layout: attn_kv_b {kv_lora, H*(nope+v)} (older DeepSeek-V2/V3 conversions) instead of
# split attn_k_b / attn_v_b. make_legacy_kvb.py rebuilds the fused kv_b_proj from each fixture's
# k_b/v_b (an exact permutation, llama.cpp converter's relation; legacy key/value_length metadata)
# at test time; the runtime must then meet the same HF bars as on the split files.
set(_lkv_dir ${CMAKE_CURRENT_BINARY_DIR}/legacy_kvb)
set(_lkv_make ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/model/make_legacy_kvb.py)
set(_lkv_chk ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/model/check_logits.py --mlaserve $<TARGET_FILE:mlaserve>)
set(_lkv_ds ${MLA_FIXTURES}/tiny-deepseek3)
set(_lkv_glm ${MLA_FIXTURES}/tiny-glm5)
file(MAKE_DIRECTORY ${_lkv_dir})
file(WRITE ${_lkv_dir}/tokens.txt "1 2 3\n")

add_test(NAME legacy_kvb_make_ds3
         COMMAND ${_lkv_make} ${_lkv_ds}/tiny-deepseek3-bf16.gguf ${_lkv_dir}/ds3-kvb-bf16.gguf)
add_test(NAME legacy_kvb_make_glm5
         COMMAND ${_lkv_make} ${_lkv_glm}/tiny-glm5-bf16.gguf ${_lkv_dir}/glm5-kvb-bf16.gguf)
# kv_b quantized (gguf-py's Q8_0 quantizer), as released legacy files carry it: the legacy
# absorption reads a quantized kv_b transposed (matmul_t).
add_test(NAME legacy_kvb_make_ds3_q8
         COMMAND ${_lkv_make} ${_lkv_ds}/tiny-deepseek3-bf16.gguf ${_lkv_dir}/ds3-kvb-q8_0.gguf --kvb-type Q8_0)
add_test(NAME legacy_kvb_make_bad
         COMMAND ${_lkv_make} ${_lkv_ds}/tiny-deepseek3-bf16.gguf ${_lkv_dir}/ds3-kvb-badrows.gguf --bad-rows)
set_tests_properties(legacy_kvb_make_ds3 legacy_kvb_make_glm5 legacy_kvb_make_ds3_q8 legacy_kvb_make_bad
                     PROPERTIES FIXTURES_SETUP legacy_kvb_files)

# deepseek3, every prompt, 2 ranks: each rank takes the kv_b rows of its heads
# [r*H/2, (r+1)*H/2) * (nope + v); the split file's bar (argmax >= 99 %, |dlogp| <= 0.01, greedy).
add_test(NAME legacy_kvb_ds3_bf16_tp2
         COMMAND ${_lkv_chk} --fixture ${_lkv_ds} --model ${_lkv_dir}/ds3-kvb-bf16.gguf --tp 2
                 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy)
# glm5 (DSA indexer) on one rank, the long prompt (past top-k 32) included with the reference's
# bf16 RoPE frequencies, as model_glm5_bf16_long does.
add_test(NAME legacy_kvb_glm5_bf16
         COMMAND ${_lkv_chk} --fixture ${_lkv_glm} --model ${_lkv_dir}/glm5-kvb-bf16.gguf --prompts 0,2,4,7
                 --rope-freq-bf16 --hf-argmax 0.99 --hf-dlogp 0.01 --greedy)
# Q8_0 kv_b: only that tensor is quantized (measured worst |dlogp| 8e-3; the q8_0 files' bar is
# 0.15), and incremental decode == one pass on the legacy path.
add_test(NAME legacy_kvb_ds3_q8_0_kvb
         COMMAND ${_lkv_chk} --fixture ${_lkv_ds} --model ${_lkv_dir}/ds3-kvb-q8_0.gguf --prompts 0,5
                 --hf-argmax 0.99 --hf-dlogp 0.05 --incremental 4 --inc-rtol 1e-4)
# A kv_b with one head too many rows is refused with a message that names the tensor.
add_test(NAME legacy_kvb_bad_rows
         COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/model/expect_error.py
                 "blk.0.attn_kv_b.weight: 640 rows, expected 4 heads x (nope 64 + v 64) = 512 rows"
                 $<TARGET_FILE:mlaserve> logits -m ${_lkv_dir}/ds3-kvb-badrows.gguf
                 --tokens ${_lkv_dir}/tokens.txt --out ${_lkv_dir}/bad.f32)
set_tests_properties(legacy_kvb_ds3_bf16_tp2 legacy_kvb_glm5_bf16 legacy_kvb_ds3_q8_0_kvb legacy_kvb_bad_rows
                     PROPERTIES FIXTURES_REQUIRED legacy_kvb_files TIMEOUT 300)
