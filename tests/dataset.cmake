add_executable(test_dataset ${TKS_TEST_DIR}/test_dataset.c)
target_link_libraries(test_dataset PRIVATE tks_dataset)
add_test(NAME dataset COMMAND test_dataset ${CMAKE_BINARY_DIR}/test-work/dataset)
