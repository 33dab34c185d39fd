# safetensors reader and writer (trainer/ckpt/safetensors.c): round trips, byte-identical
# output, atomic writes, corrupt files, 10000 random mutations (test_safetensors.c);
# the seed corpus replayed through the fuzz check; and the files checked by an
# independent implementation in Python (standard library + numpy; also the official
# `safetensors` package when importable, which Debian does not package).
# (tks_safetensors itself is defined with the trainer layer in CMakeLists.txt.)

add_executable(test_safetensors ${TKS_TEST_DIR}/test_safetensors.c)
target_link_libraries(test_safetensors PRIVATE tks_safetensors)
add_test(NAME safetensors COMMAND test_safetensors ${CMAKE_BINARY_DIR}/test-work/safetensors)
set_tests_properties(safetensors PROPERTIES TIMEOUT 300)

# The corpus: valid-mixed and case-NN (valid files and one of each corruption class,
# made by `test_safetensors --make-corpus DIR`) plus the inputs a libFuzzer run added
# coverage with (named by their SHA-1; `fuzz_safetensors -merge=1 CORPUS NEW_DIR`).
add_test(NAME safetensors_corpus
         COMMAND test_safetensors --replay ${TKS_TEST_DIR}/fuzz_safetensors_corpus)

# Debian's python3 has python3-numpy; a pyenv or venv python3 earlier on PATH may
# not, so /usr/bin is searched first (override with -DTKS_PYTHON3=...). Without
# numpy the test reports skipped (77).
find_program(TKS_PYTHON3 NAMES python3 HINTS /usr/bin)
if(TKS_PYTHON3)
  add_test(NAME safetensors_python
           COMMAND ${TKS_PYTHON3} ${TKS_TEST_DIR}/test_safetensors.py
                   $<TARGET_FILE:test_safetensors> ${CMAKE_BINARY_DIR}/test-work/safetensors-py)
  set_tests_properties(safetensors_python PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120)
endif()

# libFuzzer target (TKS_FUZZ=ON with clang; tests/fuzz.cmake checks TKS_HAVE_LIBFUZZER
# when it is included before this file):
#   build-fuzz-clang/bin/fuzz_safetensors -max_total_time=180 NEW_DIR tests/fuzz_safetensors_corpus
if(TKS_FUZZ AND TKS_HAVE_LIBFUZZER)
  target_compile_options(tks_safetensors PRIVATE -fsanitize=fuzzer-no-link)
  if(NOT TKS_SANITIZE)
    target_compile_options(tks_safetensors PRIVATE -fsanitize=address,undefined
                           -fno-omit-frame-pointer)
    target_link_options(tks_safetensors INTERFACE -fsanitize=address,undefined)
  endif()
  add_executable(fuzz_safetensors ${TKS_TEST_DIR}/test_safetensors.c)
  target_compile_definitions(fuzz_safetensors PRIVATE TKS_ST_LIBFUZZER)
  target_compile_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer,address,undefined
                         -fno-omit-frame-pointer)
  target_link_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_safetensors PRIVATE tks_safetensors)
  add_test(NAME safetensors_libfuzzer
           COMMAND fuzz_safetensors -runs=0 ${TKS_TEST_DIR}/fuzz_safetensors_corpus)
endif()
