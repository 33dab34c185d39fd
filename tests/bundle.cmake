# The GPU bundle (bench/gpu/bundle.sh): this build packed, unpacked into an
# empty prefix and run with the system's copies of the libraries it carries
# hidden (tests/test_bundle.sh). Not in the sanitizer build, whose programs
# need the compiler's sanitizer runtime rather than a bare machine's.
if(NOT TKS_SANITIZE)
  add_test(NAME gpu_bundle COMMAND bash ${TKS_TEST_DIR}/test_bundle.sh ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}
           ${CMAKE_BINARY_DIR}/test-work/bundle)
  set_tests_properties(gpu_bundle PROPERTIES SKIP_RETURN_CODE 77 RUN_SERIAL TRUE TIMEOUT 900)
endif()
