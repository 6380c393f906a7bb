# Each worker of a TP group holds in its own (anonymous) memory only its shard, whatever the page
# cache holds (tests/rss/check_rss.py); impossible splits are refused up front.
add_test(NAME worker_rss_tp4
         COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/rss/check_rss.py $<TARGET_FILE:mlaserve>
                 ${MLA_FIXTURES}/tiny-deepseek3/tiny-deepseek3-bf16.gguf 4)
set_tests_properties(worker_rss_tp4 PROPERTIES TIMEOUT 300)

# A tensor-parallel degree that does not divide the heads is refused by the coordinator before any
# worker starts (no "worker 0 failed to load" message: the reason comes from the plan itself).
foreach(cmd generate serve)
  if(cmd STREQUAL "generate")
    set(args -p hello -n 2)
  else()
    set(args --port 0)
  endif()
  add_test(NAME tp3_refused_${cmd}
           COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/model/expect_error.py
                   "tensor-parallel plan for 3 ranks is invalid: tensor parallelism 3 does not divide the 4 attention heads"
                   $<TARGET_FILE:mlaserve> ${cmd} -m ${MLA_FIXTURES}/tiny-glm5/tiny-glm5-q8_0.gguf --tp 3 ${args})
  set_tests_properties(tp3_refused_${cmd} PROPERTIES TIMEOUT 60 FAIL_REGULAR_EXPRESSION "failed to load|registered")
endforeach()
