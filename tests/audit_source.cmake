# tokshard audit --against-source (tests/test_audit_source.sh): documents read
# again from the inputs and encoded again with the tokenizer parsed from its
# file; uses the build_setup fixture's tokenizer and text.
add_executable(forge_cache ${TKS_TEST_DIR}/forge_cache.c)
target_link_libraries(forge_cache PRIVATE tks_tokenizer)
foreach(case formats tamper cache changed old main mpi)
  add_test(NAME audit_source_${case}
           COMMAND bash ${TKS_TEST_DIR}/test_audit_source.sh ${TKS_BIN} ${CMAKE_BINARY_DIR}/test-work ${case}
                   $<TARGET_FILE:forge_token> $<TARGET_FILE:forge_cache>)
  set_tests_properties(audit_source_${case} PROPERTIES FIXTURES_REQUIRED tks_build TIMEOUT 600)
endforeach()
set_tests_properties(audit_source_mpi PROPERTIES RUN_SERIAL TRUE)
