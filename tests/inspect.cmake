# `mlaserve inspect` (coordinator/cmd_inspect.c) and the tensor-parallel plan (common/shard_plan.c)
add_test(NAME inspect_fixtures
         COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/inspect/check_inspect.py
                 $<TARGET_FILE:mlaserve> ${MLA_FIXTURES} ${CMAKE_CURRENT_BINARY_DIR}/inspect_work)
add_executable(test_shard_plan ${MLA_TEST_DIR}/unit/test_shard_plan.c)
target_include_directories(test_shard_plan PRIVATE ${MLA_TEST_DIR}/unit)
target_link_libraries(test_shard_plan mla_common)
add_test(NAME test_shard_plan COMMAND test_shard_plan ${MLA_FIXTURES})
