# Hostile input and misuse (tests/test_hostile.sh); shares build_setup's tokenizer.
foreach(case plot output truncate promise fifo stop publish unicode ranks resume generate paths messages notok smaller links cache)
  add_test(NAME hostile_${case}
           COMMAND bash ${TKS_TEST_DIR}/test_hostile.sh ${TKS_BIN} ${TKS_BUILD_WORK} ${case})
  set_tests_properties(hostile_${case} PROPERTIES FIXTURES_REQUIRED tks_build
                       ENVIRONMENT "TKS_FAULT_LIB=$<TARGET_FILE:tks_fault_inject>")
endforeach()
set_tests_properties(hostile_ranks PROPERTIES PROCESSORS 2)
