# Input reader: plain/compressed/archived text -> documents (tokenize/input/input.c, stream.c, docs.c).
# Uses the real corpus (python3.11-doc, dict-gcide) and the system compressors.
add_executable(test_input ${TKS_TEST_DIR}/test_input.c)
target_link_libraries(test_input PRIVATE tks_tokenize)
add_test(NAME input COMMAND test_input ${CMAKE_BINARY_DIR}/input-test)
set_tests_properties(input PROPERTIES TIMEOUT 120)
