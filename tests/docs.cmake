# The repository stands on its own (tests/test_docs.sh).
add_test(NAME docs_selfcontained COMMAND bash ${TKS_TEST_DIR}/test_docs.sh ${CMAKE_SOURCE_DIR})
