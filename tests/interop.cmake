# Interop with other projects' datasets and tools (docs/INTEROP.md), each
# checked against the peer's own code, which runs in the project venv
# (scripts/install-venv.sh: megatron-core 0.8.0 and transformers 4.45.2 over
# Debian's python3-torch). Override the interpreter with -DTKS_VENV_PYTHON=...
set(TKS_VENV_PYTHON ${CMAKE_SOURCE_DIR}/.venv/bin/python CACHE FILEPATH "python3 of the project venv (peers of the interop tests)")
set(TKS_INTEROP_WORK ${CMAKE_BINARY_DIR}/test-work/interop)
add_test(NAME interop_setup COMMAND bash ${TKS_TEST_DIR}/test_interop.sh $<TARGET_FILE:tokshard>
         ${TKS_VENV_PYTHON} ${TKS_INTEROP_WORK} setup)
set_tests_properties(interop_setup PROPERTIES FIXTURES_SETUP tks_interop)
foreach(case megatron flat python hf)
  add_test(NAME interop_${case} COMMAND bash ${TKS_TEST_DIR}/test_interop.sh $<TARGET_FILE:tokshard>
           ${TKS_VENV_PYTHON} ${TKS_INTEROP_WORK} ${case})
  set_tests_properties(interop_${case} PROPERTIES FIXTURES_REQUIRED tks_interop TIMEOUT 300
                       ENVIRONMENT "TKS_FAULT_LIB=$<TARGET_FILE:tks_fault_inject>")
endforeach()

# tokshard's own forward pass on a checkpoint, for the Hugging Face test
add_executable(hf_logits_dump ${TKS_TEST_DIR}/hf_logits_dump.c)
target_link_libraries(hf_logits_dump PRIVATE tks_trainer)
