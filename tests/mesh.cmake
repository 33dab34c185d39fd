# Parallel layouts: planning unit test, and multi-process runs under mpirun
# (they reuse the train_setup dataset).
add_executable(test_mesh ${TKS_TEST_DIR}/test_mesh.c)
target_link_libraries(test_mesh PRIVATE tks_trainer)
add_test(NAME mesh_plan COMMAND test_mesh)
foreach(case layouts tp3 mesh checkpoint refuse)
  add_test(NAME parallel_${case}
           COMMAND bash ${TKS_TEST_DIR}/test_parallel.sh ${TKS_BIN} ${CMAKE_BINARY_DIR}/test-work ${case})
  set_tests_properties(parallel_${case} PROPERTIES FIXTURES_REQUIRED tks_train RUN_SERIAL TRUE TIMEOUT 900)
endforeach()
