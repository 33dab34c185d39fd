# Multi-process runs of tokshard commands under mpirun (tests/test_dist.sh);
# they use the build_setup fixture's tokenizers and reference dataset.
foreach(case audit build modes)
  add_test(NAME dist_${case}
           COMMAND bash ${TKS_TEST_DIR}/test_dist.sh ${TKS_BIN} ${CMAKE_BINARY_DIR}/test-work ${case})
  set_tests_properties(dist_${case} PROPERTIES FIXTURES_REQUIRED tks_build RUN_SERIAL TRUE TIMEOUT 600
                       ENVIRONMENT "TKS_FAULT_LIB=$<TARGET_FILE:tks_fault_inject>")
endforeach()
# tokshard under srun on a one-node Slurm cluster the test starts and stops
# itself (tests/test_slurm.sh); skipped (77) where Slurm cannot run.
add_test(NAME dist_slurm COMMAND bash ${TKS_TEST_DIR}/test_slurm.sh ${TKS_BIN} ${CMAKE_BINARY_DIR}/test-work)
set_tests_properties(dist_slurm PROPERTIES FIXTURES_REQUIRED "tks_build;tks_train" RUN_SERIAL TRUE
                     TIMEOUT 600 SKIP_RETURN_CODE 77)
# The build and the audit spread over a fake world of ranks as threads
# (tests/test_spread.c): the library's orchestration without MPI.
add_executable(test_spread ${TKS_TEST_DIR}/test_spread.c)
target_link_libraries(test_spread PRIVATE tks_tokenize Threads::Threads)
add_test(NAME dist_spread COMMAND test_spread ${CMAKE_BINARY_DIR}/test-work/spread)
set_tests_properties(dist_spread PROPERTIES TIMEOUT 300)
