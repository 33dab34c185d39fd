"""bpe_peers.py - what bench_bpe.py and bpe_contender.py share about the peers."""


def tt_encoding(stem, path):
    """tiktoken's own definition of cl100k_base/o200k_base over a local ranks file."""
    import tiktoken
    import tiktoken.load as tload
    import tiktoken_ext.openai_public as op
    op.load_tiktoken_bpe = lambda url, expected_hash=None: tload.load_tiktoken_bpe(path, expected_hash)
    return tiktoken.Encoding(**getattr(op, stem + "_base")())
