# `mlaserve mkmodel` (coordinator/cmd_mkmodel.c, common/gguf_write.c): synthetic DeepSeek-V3,
# GLM-5 and DeepSeek-V2-Lite files checked with gguf-py, `mlaserve inspect` (--tp 1/2/4/8) and a
# forward pass (`mlaserve logits`). Files go to the build dir and are deleted afterwards.
add_test(NAME mkmodel
         COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/mkmodel/check_mkmodel.py
                 $<TARGET_FILE:mlaserve> ${CMAKE_CURRENT_BINARY_DIR}/mkmodel_work)
set_tests_properties(mkmodel PROPERTIES TIMEOUT 300)
# `mlaserve mkmodel --rank-of 8`: one rank of TP 8 as a TP-1 file, byte for byte what
# `mlaserve inspect --tp 8` says rank 0 holds (router and embedding aside), served by
# `mlaserve bench` on the CPU backend.
add_test(NAME mkmodel_rank_of
         COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/mkmodel/check_rank_of.py
                 $<TARGET_FILE:mlaserve> ${CMAKE_CURRENT_BINARY_DIR}/mkmodel_rank_work)
set_tests_properties(mkmodel_rank_of PROPERTIES TIMEOUT 300)
