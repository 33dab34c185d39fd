# Byte-level BPE training (tokshard train-tokenizer --model-type byte-bpe;
# tokenizer/bpe_train*.c, tokenize/pipeline/w*.c), tests/test_bpe_train.sh:
# the vocabulary and merges against Hugging Face tokenizers 0.23.3's
# BpeTrainer in .venv-train (made by scripts/install-venv.sh --train-peers,
# which the peer step runs when the venv is missing; skipped, 77, only when
# it cannot be made), on the main job's text, manual pages in ten languages
# and Python's standard library, vocabularies of 1,000 to 30,000, patterns
# gpt2, llama3, o200k and cl100k, a min_frequency that ends training early;
# then, without a peer, the same files for any thread count, memory limit
# (spilled runs) and interruption (kill -9, SIGINT, --resume), the refusal
# of a merge phase over --memory, build / transformers with the result, and
# links planted at OUT.partial, its publish/ and OUT.lock never followed.
set(TKS_BPE_TRAIN_WORK ${CMAKE_BINARY_DIR}/test-work/bpe-train)
set(TKS_BPE_TRAIN_SH ${TKS_TEST_DIR}/test_bpe_train.sh)
add_test(NAME bpe_train_peer COMMAND bash ${TKS_BPE_TRAIN_SH} peer ${CMAKE_SOURCE_DIR} ${TKS_BIN}/tokshard
         ${TKS_BPE_TRAIN_WORK}/peer)
set_tests_properties(bpe_train_peer PROPERTIES FIXTURES_SETUP tks_bpe_train_peer SKIP_RETURN_CODE 77 TIMEOUT 600)
foreach(case main-llama3-30000 main-gpt2-5000 man-gpt2-5000 man-llama3-1000-min man-o200k-5000 man-cl100k-5000
        code-llama3-5000 code-gpt2-30000)
  add_test(NAME bpe_train_hf_${case} COMMAND bash ${TKS_BPE_TRAIN_SH} hf ${CMAKE_SOURCE_DIR} ${TKS_BIN}/tokshard
           ${TKS_BPE_TRAIN_WORK}/peer ${case})
  set_tests_properties(bpe_train_hf_${case} PROPERTIES FIXTURES_REQUIRED tks_bpe_train_peer SKIP_RETURN_CODE 77
                       TIMEOUT 300)
endforeach()
foreach(step ref threads spill resume refuse build prune links)
  add_test(NAME bpe_train_${step} COMMAND bash ${TKS_BPE_TRAIN_SH} ${step} ${CMAKE_SOURCE_DIR} ${TKS_BIN}/tokshard
           ${TKS_BPE_TRAIN_WORK}/main)
  set_tests_properties(bpe_train_${step} PROPERTIES FIXTURES_REQUIRED tks_bpe_train_ref SKIP_RETURN_CODE 77
                       TIMEOUT 600)
endforeach()
set_tests_properties(bpe_train_ref PROPERTIES FIXTURES_REQUIRED "" FIXTURES_SETUP tks_bpe_train_ref)
set_tests_properties(bpe_train_build PROPERTIES FIXTURES_REQUIRED "tks_bpe_train_ref;tks_bpe_train_peer")
# counts past 32 bits, given directly (no test corpus holds a word 2^32
# times): the trainer's merges follow them, and merged runs sum them
add_executable(test_bpe_train_counts ${TKS_TEST_DIR}/test_bpe_train_counts.c)
target_link_libraries(test_bpe_train_counts PRIVATE tks_tokenize)
add_test(NAME bpe_train_counts COMMAND test_bpe_train_counts ${TKS_BPE_TRAIN_WORK}/counts)
