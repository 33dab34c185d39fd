# Multi-process runs of tokshard commands under mpirun (tests/test_dist.sh);
# they use the build_setup fixture's tokenizers and reference dataset.
foreach(case audit build modes)
  add_test(NAME dist_${case}
           COMMAND bash ${TKS_TEST_DIR}/test_dist.sh ${TKS_BIN} ${CMAKE_BINARY_DIR}/test-work ${case})
  set_tests_properties(dist_${case} PROPERTIES FIXTURES_REQUIRED tks_build RUN_SERIAL TRUE TIMEOUT 600
                       ENVIRONMENT "TKS_FAULT_LIB=$<TARGET_FILE:tks_fault_inject>")
endforeach()
