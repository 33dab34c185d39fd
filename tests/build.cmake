# End-to-end CLI tests on real text; `build_setup` trains the shared tokenizers.
set(TKS_BUILD_WORK ${CMAKE_BINARY_DIR}/test-work/build)
# kill -9 at chosen points of a build, injected from the test side (LD_PRELOAD)
add_library(tks_fault_inject MODULE ${TKS_TEST_DIR}/fault_inject.c)
target_link_libraries(tks_fault_inject PRIVATE ${CMAKE_DL_LIBS})
add_test(NAME build_setup COMMAND bash ${TKS_TEST_DIR}/test_build.sh $<TARGET_FILE:tokshard> ${TKS_BUILD_WORK} setup)
set_tests_properties(build_setup PROPERTIES FIXTURES_SETUP tks_build)
foreach(case threads resume units parity containers errors cli)
  add_test(NAME build_${case}
           COMMAND bash ${TKS_TEST_DIR}/test_build.sh $<TARGET_FILE:tokshard> ${TKS_BUILD_WORK} ${case})
  set_tests_properties(build_${case} PROPERTIES FIXTURES_REQUIRED tks_build
                       ENVIRONMENT "TKS_FAULT_LIB=$<TARGET_FILE:tks_fault_inject>")
endforeach()
