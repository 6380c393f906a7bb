# kernels/quant: CPU dequantization and dot products against gguf-py (the reference).
add_executable(quant_tool ${MLA_TEST_DIR}/quant/quant_tool_main.c)
target_link_libraries(quant_tool mla_kernels)

add_executable(test_quant ${MLA_TEST_DIR}/unit/test_quant.c)
target_link_libraries(test_quant mla_kernels m)
add_test(NAME quant_unit COMMAND test_quant)

add_test(NAME quant_vs_gguf_py
         COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/quant/check_dequant.py --tool $<TARGET_FILE:quant_tool>)
add_test(NAME quant_fixtures
         COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/quant/check_fixtures.py --tool $<TARGET_FILE:quant_tool>
                 --fixtures ${MLA_FIXTURES})
