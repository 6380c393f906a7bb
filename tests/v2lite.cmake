# The no-q-LoRA attention layout (DeepSeek-V2-Lite: blk.N.attn_q.weight, softmax routing, 2 shared
# experts, no groups, routed scale 1), which no fixture has: a small synthetic file from
# `mlaserve mkmodel --family v2lite --small --layers 2` through `mlaserve logits` (1 rank and
# --tp 2, attn_q rows split by heads) against the independent numpy forward pass np_ref.py.
# Measured max|dlogit|/max|logit| 1.4e-6 (1 and 2 ranks); bound 1e-3.
add_test(NAME model_v2lite_np_ref
         COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/model/check_v2lite.py
                 $<TARGET_FILE:mlaserve> ${CMAKE_CURRENT_BINARY_DIR}/v2lite_work --rtol 1e-3 --tp 2)
set_tests_properties(model_v2lite_np_ref PROPERTIES TIMEOUT 120)
