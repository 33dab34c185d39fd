# The sentencepiece wrapper (tokenizer/tokenizer.h) on real text (dict-gcide),
# checked against Debian's spm_encode and spm_export_vocab.
add_executable(test_spm ${TKS_TEST_DIR}/test_spm.c)
target_link_libraries(test_spm PRIVATE tks_tokenize)
add_test(NAME spm COMMAND test_spm ${CMAKE_BINARY_DIR}/spm-test)
set_tests_properties(spm PROPERTIES TIMEOUT 300)
