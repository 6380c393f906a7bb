# Run at build time (common/CMakeLists.txt, target mla_buildinfo): writes OUT from IN with the
# commit SRC_DIR is at now (configure_file leaves OUT untouched when nothing changed, so only
# common/buildinfo.c recompiles after a new commit).
execute_process(COMMAND git -C ${SRC_DIR} describe --always --dirty --abbrev=12
                OUTPUT_VARIABLE MLA_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE mla_git_rc)
if(NOT mla_git_rc EQUAL 0 OR NOT MLA_GIT_COMMIT)
  set(MLA_GIT_COMMIT unknown)
endif()
configure_file(${IN} ${OUT} @ONLY)
