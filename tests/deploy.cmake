# Deployment and hardening (tests/deploy): launchers, Slurm script, CURVE keys, fault injection,
# drain, bounds, and a two-namespace control plane with a network partition. Python drivers over
# the real `mlaserve` + `mlaserve-worker` on the tiny-deepseek3 fixture (CPU workers, loopback or
# our own network namespaces only). Exit 77 = skipped (fixture missing, no root / ip netns,
# no shellcheck).
if(TARGET mlaserve AND TARGET mlaserve-worker)
  set(_dep_args $<TARGET_FILE:mlaserve> $<TARGET_FILE:mlaserve-worker> ${MLA_FIXTURES})
  foreach(case death hang coord drain bounds)
    add_test(NAME deploy_fault_${case}
             COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/deploy/test_faults.py ${_dep_args} ${case})
    set_tests_properties(deploy_fault_${case} PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
  endforeach()
  add_test(NAME deploy_keys COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/deploy/test_keys.py ${_dep_args})
  set_tests_properties(deploy_keys PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
  foreach(case launch slurm)
    add_test(NAME deploy_${case}
             COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/deploy/test_launch.py ${_dep_args} ${CMAKE_SOURCE_DIR} ${case})
    set_tests_properties(deploy_${case} PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
  endforeach()
  foreach(case startup timeout cli)
    add_test(NAME deploy_ops_${case}
             COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/deploy/test_ops.py ${_dep_args} ${case})
    set_tests_properties(deploy_ops_${case} PROPERTIES TIMEOUT 240 SKIP_RETURN_CODE 77)
  endforeach()
  add_test(NAME deploy_netns COMMAND ${Python3_EXECUTABLE} ${MLA_TEST_DIR}/deploy/test_netns.py ${_dep_args})
  set_tests_properties(deploy_netns PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77)
endif()
find_program(SHELLCHECK shellcheck)
if(SHELLCHECK)
  add_test(NAME deploy_shellcheck
           COMMAND ${SHELLCHECK} ${CMAKE_SOURCE_DIR}/deploy/launch.sh ${CMAKE_SOURCE_DIR}/deploy/slurm/mlaserve.sbatch
                   ${MLA_TEST_DIR}/deploy/fakeslurm/srun ${MLA_TEST_DIR}/deploy/fakeslurm/scontrol
                   ${MLA_TEST_DIR}/deploy/test_install.sh ${MLA_TEST_DIR}/deploy/test_container.sh)
endif()
# install rules + the systemd unit against the installed paths; the Dockerfile built with podman
if(TARGET mlaserve AND TARGET mlaserve-worker)
  add_test(NAME deploy_install COMMAND bash ${MLA_TEST_DIR}/deploy/test_install.sh ${CMAKE_BINARY_DIR})
  set_tests_properties(deploy_install PROPERTIES TIMEOUT 300)
  add_test(NAME deploy_container COMMAND bash ${MLA_TEST_DIR}/deploy/test_container.sh ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(deploy_container PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77 RUN_SERIAL ON)
endif()
find_program(SYSTEMD_ANALYZE systemd-analyze)
if(SYSTEMD_ANALYZE AND TARGET mlaserve)
  add_test(NAME deploy_systemd_verify
           COMMAND bash ${MLA_TEST_DIR}/deploy/check_systemd.sh ${CMAKE_SOURCE_DIR}/deploy/systemd $<TARGET_FILE:mlaserve>)
endif()
