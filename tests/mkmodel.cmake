# `mlaserve mkmodel` (coordinator/cmd_mkmodel.c, common/gguf_write.c): synthetic DeepSeek-V3,
# GLM-5 and DeepSeek-V2-Lite files checked with gguf-py, `mlaserve inspect` (--tp 1/2/4/8) and a
# forward pass (`mlaserve logits`). Files go to the build dir and are deleted afterwards.
add_test(NAME mkmodel
         COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/mkmodel/check_mkmodel.py
                 $<TARGET_FILE:mlaserve> ${CMAKE_CURRENT_BINARY_DIR}/mkmodel_work)
set_tests_properties(mkmodel PROPERTIES TIMEOUT 300)
