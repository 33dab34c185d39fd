# End-to-end trainer tests on real text; `train_setup` builds the shared dataset.
add_executable(forge_token ${TKS_TEST_DIR}/forge_token.c)
target_link_libraries(forge_token PRIVATE tks_dataset)
add_executable(forge_ckpt ${TKS_TEST_DIR}/forge_ckpt.c)
target_link_libraries(forge_ckpt PRIVATE tks_safetensors)
set(TKS_TRAIN_WORK ${CMAKE_BINARY_DIR}/test-work/train)
add_test(NAME train_setup COMMAND bash ${TKS_TEST_DIR}/test_train.sh ${TKS_BIN} ${TKS_TRAIN_WORK} setup)
set_tests_properties(train_setup PROPERTIES FIXTURES_SETUP tks_train)

foreach(case train resume safety checkpoint plan generate lock bf16 faults cli profile stepmodel mix eval)
  add_test(NAME train_${case} COMMAND bash ${TKS_TEST_DIR}/test_train.sh ${TKS_BIN} ${TKS_TRAIN_WORK} ${case})
  set_tests_properties(train_${case} PROPERTIES FIXTURES_REQUIRED tks_train)
endforeach()
