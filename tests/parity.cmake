# Parity of the trainer with an independent PyTorch LLaMA (test_torch_parity.py):
# parity_dump runs three tiny configs (GQA with vocab padding, tied embeddings,
# a prime vocab with multi-query attention) and writes checkpoints, the batch,
# logits, loss, every gradient and the weights after 3 AdamW steps; the Python
# side rebuilds the model from config.json + model.safetensors in float64 and
# requires agreement within 1e-4 relative.
#
# Debian's /usr/bin/python3 carries python3-torch and python3-numpy (a pyenv or
# venv python3 earlier on PATH usually does not); override with
# -DTKS_TORCH_PYTHON3=... The test FAILS (it does not skip) when torch cannot be
# imported: the project requires it to run in CI.
set(TKS_TORCH_PYTHON3 /usr/bin/python3 CACHE FILEPATH "python3 with torch and numpy for the parity test")

add_executable(parity_dump ${TKS_TEST_DIR}/parity_dump.c)
target_link_libraries(parity_dump PRIVATE tks_trainer)

# torch_parity: float64 reference (test_torch_parity.py). torch_bf16: the bf16
# mixed-precision path against PyTorch in the same precision and the float64
# reference, with bounds derived from bf16's unit roundoff (test_torch_bf16.py;
# parity_dump writes step0_bf16.safetensors per config).
foreach(pair "torch_parity;test_torch_parity.py;parity" "torch_bf16;test_torch_bf16.py;parity-bf16")
  list(GET pair 0 name)
  list(GET pair 1 script)
  list(GET pair 2 dir)
  add_test(NAME ${name}
           COMMAND bash -c "set -e
if ! \"$1\" -c 'import torch, numpy' 2>/dev/null; then
  echo \"FAIL: $1 cannot import torch and numpy; run scripts/install-deps.sh (apt-get install python3-torch python3-numpy)\" >&2
  exit 1
fi
rm -rf \"$3\" && mkdir -p \"$3\"
\"$2\" \"$3\"
\"$1\" \"$4\" \"$3\""
                   bash ${TKS_TORCH_PYTHON3} $<TARGET_FILE:parity_dump> ${CMAKE_BINARY_DIR}/test-work/${dir}
                   ${TKS_TEST_DIR}/${script})
  set_tests_properties(${name} PROPERTIES TIMEOUT 120)
endforeach()
