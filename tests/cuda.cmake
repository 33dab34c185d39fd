# The CUDA backend and NCCL comm (trainer/cuda). Built whenever the backend is
# (TKS_HAVE_CUDA); each test exits 77 where no CUDA device is usable, which
# ctest reports as skipped (SKIP_RETURN_CODE), never as passed.
if(TKS_HAVE_CUDA)
  add_executable(test_cuda_ops ${TKS_TEST_DIR}/test_cuda_ops.c)
  target_link_libraries(test_cuda_ops PRIVATE tks_trainer)
  add_test(NAME cuda_ops COMMAND test_cuda_ops)
  set_tests_properties(cuda_ops PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120 LABELS gpu)
endif()
if(TKS_HAVE_CUDA)
  add_executable(test_cuda_model ${TKS_TEST_DIR}/test_cuda_model.c)
  target_link_libraries(test_cuda_model PRIVATE tks_trainer)
  add_test(NAME cuda_model COMMAND sh -c "rm -rf \"$1\" && mkdir -p \"$1\" && exec \"$0\" \"$1\""
           $<TARGET_FILE:test_cuda_model> ${CMAKE_CURRENT_BINARY_DIR}/cuda_model.d)
  set_tests_properties(cuda_model PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS gpu)
endif()
