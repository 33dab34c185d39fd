# The CUDA backend and NCCL comm (trainer/cuda). Built whenever the backend is
# (TKS_HAVE_CUDA); each test exits 77 where no CUDA device is usable, which
# ctest reports as skipped (SKIP_RETURN_CODE), never as passed.
#
# test_cuda_ops and test_cuda_model are built in every configuration (against
# cuda_stub.c without CUDA): with TKS_TEST_CPU_AS_GPU=1 their "GPU" side runs
# on the CPU (test_cuda_ops: an fp64 second implementation of the ops,
# tests/cuda_ops_ref64.c; test_cuda_model: a second CPU backend), so the
# tests' own checks, bounds and buffers are exercised without a GPU. Those
# two runs are CPU tests (label cuda_harness, not gpu).
add_executable(test_cuda_ops ${TKS_TEST_DIR}/test_cuda_ops.c ${TKS_TEST_DIR}/cuda_ops_ref64.c)
add_executable(test_cuda_model ${TKS_TEST_DIR}/test_cuda_model.c)
foreach(t ops model)
  target_link_libraries(test_cuda_${t} PRIVATE tks_cuda)
endforeach()
add_test(NAME cuda_ops_cpu_as_gpu COMMAND test_cuda_ops)
set_tests_properties(cuda_ops_cpu_as_gpu PROPERTIES ENVIRONMENT TKS_TEST_CPU_AS_GPU=1 TIMEOUT 300
                     LABELS cuda_harness)
add_test(NAME cuda_model_cpu_as_gpu COMMAND sh -c "rm -rf \"$1\" && mkdir -p \"$1\" && exec \"$0\" \"$1\""
         $<TARGET_FILE:test_cuda_model> ${CMAKE_CURRENT_BINARY_DIR}/cuda_model_harness.d)
set_tests_properties(cuda_model_cpu_as_gpu PROPERTIES ENVIRONMENT TKS_TEST_CPU_AS_GPU=1 TIMEOUT 300
                     LABELS cuda_harness)
if(TKS_HAVE_CUDA)
  foreach(t memory comm)
    add_executable(test_cuda_${t} ${TKS_TEST_DIR}/test_cuda_${t}.c)
    target_link_libraries(test_cuda_${t} PRIVATE tks_cuda)
  endforeach()
  add_test(NAME cuda_ops COMMAND test_cuda_ops)
  set_tests_properties(cuda_ops PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120 LABELS gpu)
  add_test(NAME cuda_model COMMAND sh -c "rm -rf \"$1\" && mkdir -p \"$1\" && exec \"$0\" \"$1\""
           $<TARGET_FILE:test_cuda_model> ${CMAKE_CURRENT_BINARY_DIR}/cuda_model.d)
  set_tests_properties(cuda_model PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS gpu)
  # the --dry-run memory plan against the backend's allocations (5%), the out-of-memory message
  add_test(NAME cuda_memory COMMAND test_cuda_memory)
  set_tests_properties(cuda_memory PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120 LABELS gpu)
  # NCCL under mpirun, every rank on the one GPU with its own NCCL_HOSTID
  # (tests/cuda_mpirun.sh: the NCCL settings for that, and a time limit with a
  # message): 2 processes as tp 2 and as dp_shard 2, 4 processes as 2 x 1 x 2.
  foreach(layout "2;1;1;2" "2;1;2;1" "4;2;1;2")
    list(GET layout 0 np)
    list(GET layout 1 rep)
    list(GET layout 2 shard)
    list(GET layout 3 tp)
    set(name cuda_comm_${rep}x${shard}x${tp})
    add_test(NAME ${name} COMMAND bash ${TKS_TEST_DIR}/cuda_mpirun.sh ${np} 150
             $<TARGET_FILE:test_cuda_comm> ${rep} ${shard} ${tp})
    set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 180 LABELS gpu)
  endforeach()
  # tokshard-train --device cuda end to end on the train fixture's dataset
  add_test(NAME cuda_train COMMAND bash ${TKS_TEST_DIR}/test_cuda_train.sh ${TKS_BIN} ${TKS_TRAIN_WORK})
  set_tests_properties(cuda_train PROPERTIES FIXTURES_REQUIRED tks_train SKIP_RETURN_CODE 77
                       TIMEOUT 300 LABELS gpu)
  # tokshard-train --device cuda under mpirun: layouts against one process, NCCL and --comm mpi
  add_test(NAME cuda_parallel COMMAND bash ${TKS_TEST_DIR}/test_cuda_parallel.sh ${TKS_BIN} ${TKS_TRAIN_WORK})
  set_tests_properties(cuda_parallel PROPERTIES FIXTURES_REQUIRED tks_train SKIP_RETURN_CODE 77
                       RUN_SERIAL TRUE TIMEOUT 600 LABELS gpu)
endif()
