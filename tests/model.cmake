# The trainer's math: every backend op against finite differences and scalar
# references (test_ops), and the whole LLaMA on a tiny config: gradients,
# vocab padding, accumulation, determinism, KV-cache decoding, AdamW
# (test_model). CPU backend; each runs in well under a second.
add_executable(test_ops ${TKS_TEST_DIR}/test_ops.c)
target_link_libraries(test_ops PRIVATE tks_trainer)
add_test(NAME ops COMMAND test_ops)
add_executable(test_model ${TKS_TEST_DIR}/test_model.c)
target_link_libraries(test_model PRIVATE tks_trainer)
add_test(NAME model COMMAND test_model)
set_tests_properties(ops model PROPERTIES TIMEOUT 60)
# the --dry-run memory plan against the model the CPU backend creates
add_executable(test_memplan ${TKS_TEST_DIR}/test_memplan.c)
target_link_libraries(test_memplan PRIVATE tks_trainer)
add_test(NAME memplan COMMAND test_memplan)
set_tests_properties(memplan PROPERTIES TIMEOUT 60)
# the benchmark's step (tks_step_bench, bench/gpu/bench_gpu.c) on the CPU
# backend: it runs, and its loss after 3 steps is the initial ln(V) within
# what init_std 0.02 and 3 small AdamW steps can move it
add_test(NAME bench_step_cpu COMMAND bash ${TKS_TEST_DIR}/test_bench_step.sh $<TARGET_FILE:tokshard-bench-gpu>)
set_tests_properties(bench_step_cpu PROPERTIES TIMEOUT 60)
