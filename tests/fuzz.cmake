# Fuzz targets for every parser of untrusted bytes (docs: tests/fuzz/*.c):
#   fuzz_shard  shard reader (tks_shard_open_mem, tks_shard_read, tks_shard_verify_chunk)
#   fuzz_audit  audit and dataset opener (lone shard, manifest.json, shard under a manifest)
#   fuzz_input  input reader (plain, compressed, archives, JSONL) and tks_utf8_sanitize
#   fuzz_jsonl  the JSON Lines fast path (RapidJSON) against jansson (same status, string, reason)
#   fuzz_parquet  the Parquet input (Arrow's reader behind tokenize/input/parquet.h, the footer
#               check of the listing, the row policies); nothing to do without Parquet support
#   fuzz_foreign  interop: Megatron/llm.c/raw/datatrove readers (audit --format) and the
#               sentencepiece proto walker of tokenizer.json
#   fuzz_encode the fast encoder against sentencepiece (ids must be identical)
#   fuzz_bpe    the byte-level BPE tokenizer.json loader, then its encoder and decoder
#   fuzz_bpe_compare  the byte-level BPE encoder against its reference (ids must be identical)
#   fuzz_pretok the pre-tokenizer's bit-mask windows and hand matchers against PCRE2 (piece ends)
#
# Always: <target>_replay, the same source with tests/fuzz/replay.c as main(),
# and one ctest per target replaying tests/fuzz/corpus/<target>/ (with the
# sanitizers when TKS_SANITIZE=ON). With -DTKS_FUZZ=ON and clang: the real
# libFuzzer binaries, and the libraries compiled with -fsanitize=fuzzer-no-link
# (plus address,undefined) so the fuzzer sees their coverage:
#
#   CC=clang CXX=clang++ cmake -S . -B build-fuzz-clang -DTKS_FUZZ=ON -DTKS_SANITIZE=ON
#   cmake --build build-fuzz-clang --target fuzz_shard fuzz_audit fuzz_input
#   build-fuzz-clang/bin/fuzz_shard -max_total_time=180 NEW_DIR tests/fuzz/corpus/fuzz_shard
#   build-fuzz-clang/bin/fuzz_shard -merge=1 tests/fuzz/corpus/fuzz_shard NEW_DIR
#
# fuzz_audit and fuzz_input take a dictionary: -dict=tests/fuzz/<target>.dict.
set(TKS_FUZZ_DIR ${TKS_TEST_DIR}/fuzz)
set(TKS_FUZZ_TARGETS fuzz_shard fuzz_audit fuzz_input fuzz_jsonl fuzz_parquet fuzz_foreign fuzz_encode fuzz_bpe fuzz_bpe_compare fuzz_pretok)

foreach(t ${TKS_FUZZ_TARGETS})
  add_executable(${t}_replay ${TKS_FUZZ_DIR}/${t}.c ${TKS_FUZZ_DIR}/replay.c)
  target_link_libraries(${t}_replay PRIVATE tks_tokenize tks_interop)
  add_test(NAME ${t}_corpus COMMAND ${t}_replay ${TKS_FUZZ_DIR}/corpus/${t})
  set_tests_properties(${t}_corpus PROPERTIES TIMEOUT 300)
endforeach()

if(TKS_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang" OR NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(WARNING "TKS_FUZZ: libFuzzer needs clang (configure with CC=clang CXX=clang++); "
                    "building only the replay drivers")
  else()
    include(CheckCSourceCompiles)
    set(CMAKE_REQUIRED_FLAGS "-fsanitize=fuzzer")
    set(CMAKE_REQUIRED_LINK_OPTIONS "-fsanitize=fuzzer")
    check_c_source_compiles(
      "#include <stddef.h>
       #include <stdint.h>
       int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }"
      TKS_HAVE_LIBFUZZER)
    unset(CMAKE_REQUIRED_FLAGS)
    unset(CMAKE_REQUIRED_LINK_OPTIONS)
    if(NOT TKS_HAVE_LIBFUZZER)
      message(WARNING "TKS_FUZZ: clang cannot link -fsanitize=fuzzer (install libclang-rt-dev); "
                      "building only the replay drivers")
    else()
      # The libraries are defined before tests/ is added, so their flags can
      # be extended here: coverage for the fuzzer, and the sanitizers when the
      # whole build does not already have them. The sanitizer runtime is then
      # linked into everything that uses the libraries.
      set(_tks_lib_fuzz_flags -fsanitize=fuzzer-no-link)
      if(NOT TKS_SANITIZE)
        list(APPEND _tks_lib_fuzz_flags -fsanitize=address,undefined -fno-omit-frame-pointer
             -fno-sanitize-recover=undefined)
      endif()
      foreach(lib tks_common tks_dataset tks_tokenizer tks_tokenize tks_parquet tks_interop)
        target_compile_options(${lib} PRIVATE ${_tks_lib_fuzz_flags})
        if(NOT TKS_SANITIZE)
          target_link_options(${lib} INTERFACE -fsanitize=address,undefined)
        endif()
      endforeach()
      if(TARGET tks_parquet_module)
        target_compile_options(tks_parquet_module PRIVATE ${_tks_lib_fuzz_flags})
      endif()
      foreach(t ${TKS_FUZZ_TARGETS})
        add_executable(${t} ${TKS_FUZZ_DIR}/${t}.c)
        # UB must stop the run (a report the fuzzer cannot see is not a finding)
        target_compile_options(${t} PRIVATE -fsanitize=fuzzer,address,undefined
                               -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
        target_link_options(${t} PRIVATE -fsanitize=fuzzer,address,undefined)
        target_link_libraries(${t} PRIVATE tks_tokenize tks_interop)
        # The libFuzzer binary itself runs the corpus once (-runs=0: no mutation).
        add_test(NAME ${t}_libfuzzer COMMAND ${t} -runs=0 ${TKS_FUZZ_DIR}/corpus/${t})
        set_tests_properties(${t}_libfuzzer PROPERTIES TIMEOUT 300)
      endforeach()
    endif()
  endif()
endif()
