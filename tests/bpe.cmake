# Byte-level BPE tokenizers (tokenizer/bpe.c) against Hugging Face
# `tokenizers` and tiktoken in the project venv (TKS_VENV_PYTHON,
# tests/interop.cmake's cache entry): bpe_peer trains small tokenizers on real
# text (python3.11-doc, dict-gcide), takes OpenAI's cl100k_base and o200k_base
# ranks from the bpe-openai wheel, and writes the peers' ids (a fixture); each
# bpe_ids_* test compares tokshard's ids and decodes with them. Without the
# venv's `tokenizers` (or tiktoken, for the tiktoken files) the peer and the
# comparisons report skipped (77).
set(TKS_VENV_PYTHON ${CMAKE_SOURCE_DIR}/.venv/bin/python CACHE FILEPATH "python3 of the project venv (peers of the interop tests)")
set(TKS_BPE_WORK ${CMAKE_BINARY_DIR}/test-work/bpe)
add_executable(test_bpe ${TKS_TEST_DIR}/test_bpe.c)
target_link_libraries(test_bpe PRIVATE tks_tokenizer OpenMP::OpenMP_C)
add_test(NAME bpe_peer COMMAND bash ${TKS_TEST_DIR}/test_bpe.sh peer ${TKS_VENV_PYTHON} $<TARGET_FILE:test_bpe> ${TKS_BPE_WORK})
set_tests_properties(bpe_peer PROPERTIES FIXTURES_SETUP tks_bpe SKIP_RETURN_CODE 77 TIMEOUT 1200)
foreach(model gpt2 llama3-im llama3 llama3-legacy nfc noalpha behaviors added cl100k o200k llama3-tt)
  add_test(NAME bpe_ids_${model} COMMAND bash ${TKS_TEST_DIR}/test_bpe.sh ids ${TKS_VENV_PYTHON}
           $<TARGET_FILE:test_bpe> ${TKS_BPE_WORK} ${model})
  set_tests_properties(bpe_ids_${model} PROPERTIES FIXTURES_REQUIRED tks_bpe SKIP_RETURN_CODE 77 TIMEOUT 300)
endforeach()
add_test(NAME bpe_long COMMAND bash ${TKS_TEST_DIR}/test_bpe.sh long ${TKS_VENV_PYTHON} $<TARGET_FILE:test_bpe> ${TKS_BPE_WORK} llama3)
set_tests_properties(bpe_long PROPERTIES FIXTURES_REQUIRED tks_bpe SKIP_RETURN_CODE 77 TIMEOUT 120)
# tokshard build / audit / inspect / cat with a tokenizer.json: the dataset's ids are tokenizers'
foreach(model llama3 gpt2)
  add_test(NAME bpe_build_${model} COMMAND bash ${TKS_TEST_DIR}/test_bpe.sh build ${TKS_VENV_PYTHON}
           $<TARGET_FILE:test_bpe> ${TKS_BPE_WORK} ${model})
  set_tests_properties(bpe_build_${model} PROPERTIES FIXTURES_REQUIRED tks_bpe SKIP_RETURN_CODE 77 TIMEOUT 300)
endforeach()
# the same with OpenAI's cl100k_base ranks file and tiktoken's ids
add_test(NAME bpe_tiktoken_cl100k COMMAND bash ${TKS_TEST_DIR}/test_bpe.sh tiktoken ${TKS_VENV_PYTHON}
         $<TARGET_FILE:test_bpe> ${TKS_BPE_WORK} cl100k)
set_tests_properties(bpe_tiktoken_cl100k PROPERTIES FIXTURES_REQUIRED tks_bpe SKIP_RETURN_CODE 77 TIMEOUT 300)
# the loader's refusals need no peer
add_test(NAME bpe_refusals COMMAND test_bpe --refusals ${CMAKE_BINARY_DIR}/bpe-refusals-test)
# the tokenizer cache against planted links, shared directories and entries of another key
add_test(NAME bpe_cache_safety COMMAND test_bpe --cache-safety ${CMAKE_BINARY_DIR}/test-work/bpe-cache-safety)
# the hand matchers of the named pre-tokenizer patterns against PCRE2, piece for piece
add_executable(test_pretok ${TKS_TEST_DIR}/test_pretok.c)
target_link_libraries(test_pretok PRIVATE tks_tokenizer)
add_test(NAME bpe_pretok COMMAND test_pretok 200000)
set_tests_properties(bpe_pretok PROPERTIES TIMEOUT 600)
