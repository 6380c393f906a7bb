# Each worker process touches only its shard of the model file (resident pages of the mapping).
add_test(NAME worker_rss_tp4
         COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/rss/check_rss.py $<TARGET_FILE:mlaserve>
                 ${MLA_FIXTURES}/tiny-deepseek3/tiny-deepseek3-bf16.gguf 4)
set_tests_properties(worker_rss_tp4 PROPERTIES TIMEOUT 300)
