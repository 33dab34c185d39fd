# Parquet inputs (tests/test_parquet.sh): the same shards as JSON Lines, row
# groups as work units under threads, ranks and a resume, hostile files.
# Skipped (77) in a build without Arrow, once the refusal is checked.
foreach(case same bad)
  add_test(NAME parquet_${case}
           COMMAND bash ${TKS_TEST_DIR}/test_parquet.sh ${TKS_BIN} ${CMAKE_BINARY_DIR}/test-work ${case})
  set_tests_properties(parquet_${case} PROPERTIES FIXTURES_REQUIRED tks_build TIMEOUT 600 SKIP_RETURN_CODE 77
                       ENVIRONMENT "TKS_FAULT_LIB=$<TARGET_FILE:tks_fault_inject>")
endforeach()
