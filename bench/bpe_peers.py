"""bpe_peers.py - what bench_bpe.py, bpe_contender.py and llama3_json.py share
about the peers and the tokenizers."""

# Llama 3's pre-tokenization pattern (Meta's llama_models/llama3/tokenizer.py, pat_str)
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def tt_encoding(stem, path):
    """tiktoken's own definition of cl100k_base/o200k_base over a local ranks file."""
    import tiktoken
    import tiktoken.load as tload
    import tiktoken_ext.openai_public as op
    op.load_tiktoken_bpe = lambda url, expected_hash=None: tload.load_tiktoken_bpe(path, expected_hash)
    return tiktoken.Encoding(**getattr(op, stem + "_base")())
