# Parallel layouts: planning unit test, and multi-process runs under mpirun
# (they reuse the train_setup dataset).
add_executable(test_mesh ${TKS_TEST_DIR}/test_mesh.c)
target_link_libraries(test_mesh PRIVATE tks_trainer)
add_test(NAME mesh_plan COMMAND test_mesh)
foreach(case layouts mix tp3 mesh checkpoint packing staged refuse failures overlap bf16 memory)
  add_test(NAME parallel_${case}
           COMMAND bash ${TKS_TEST_DIR}/test_parallel.sh ${TKS_BIN} ${CMAKE_BINARY_DIR}/test-work ${case})
  set_tests_properties(parallel_${case} PROPERTIES FIXTURES_REQUIRED tks_train RUN_SERIAL TRUE TIMEOUT 900
                       SKIP_RETURN_CODE 77)
endforeach()
# The comm contract: unit checks in one process, then every collective on 4
# processes with MPI's own calls and piece by piece (TOKSHARD_TEST_COMM_CHUNK=7).
add_executable(test_comm ${TKS_TEST_DIR}/test_comm.c)
target_link_libraries(test_comm PRIVATE tks_trainer)
add_test(NAME comm_unit COMMAND test_comm)
add_test(NAME comm_mpi COMMAND bash ${TKS_TEST_DIR}/mpirun.sh 4 $<TARGET_FILE:test_comm>)
add_test(NAME comm_mpi_chunked COMMAND bash ${TKS_TEST_DIR}/mpirun.sh 4 $<TARGET_FILE:test_comm>)
set_tests_properties(comm_mpi PROPERTIES ENVIRONMENT "TOKSHARD_TEST_COMM_CHUNK=0" TIMEOUT 120)
set_tests_properties(comm_mpi_chunked PROPERTIES ENVIRONMENT "TOKSHARD_TEST_COMM_CHUNK=7" TIMEOUT 120)
# trainer.h is the trainer's one public header; the trainer does not link the build pipeline
add_test(NAME layering COMMAND bash ${TKS_TEST_DIR}/test_layering.sh ${CMAKE_SOURCE_DIR} ${TKS_BIN})
