# The fast encoder (tokenizer/fastenc.c) against sentencepiece, id for id, on
# real text in five languages and on adversarial text, for models trained by
# Debian's spm_train.
add_executable(test_fastenc ${TKS_TEST_DIR}/test_fastenc.c)
target_link_libraries(test_fastenc PRIVATE tks_tokenize)
add_test(NAME fastenc COMMAND test_fastenc ${CMAKE_BINARY_DIR}/fastenc-test)
set_tests_properties(fastenc PROPERTIES TIMEOUT 1500)
add_test(NAME encoder_cli
         COMMAND bash ${TKS_TEST_DIR}/test_encoder_cli.sh $<TARGET_FILE:tokshard> ${CMAKE_BINARY_DIR}/test-work/encoder)
