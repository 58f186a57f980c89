"""Writes a tiny random-weight Llama as a GGUF file that llama.cpp's server loads.

Run with the llama.cpp environment's Python (`scripts/install-llamacpp.sh` makes it: numpy and the gguf-py that
the llama.cpp sources carry); the project's own environment has neither. Nothing is downloaded: the weights are
seeded random float32, the vocabulary is a SentencePiece-style (`llama`) one of made-up words: three specials,
the 256 byte tokens SentencePiece falls back to, the pieces words are merged from, then `▁w0`..`▁w{N-1}`. llama.cpp adds the leading space, so a
prompt of N words `w17 w4 ...` is exactly N tokens (+1 for BOS), the same words realengine/build_model.py gives
vLLM. Generation is random words; requests pass `ignore_eos` to control output length.
"""

from __future__ import annotations

import argparse
import os
import sys

SPECIALS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: unknown, BOS, EOS


def word(i: int) -> str:
    """The i-th vocabulary word (without SentencePiece's space marker)."""
    return f"w{i}"


def build(out: str, words: int, layers: int, hidden: int, heads: int, ff: int, ctx: int, seed: int) -> int:
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens: list[bytes] = []
    scores: list[float] = []
    types: list[int] = []
    for i, special in enumerate(SPECIALS):
        tokens.append(special.encode())
        scores.append(0.0)
        types.append(gguf.TokenType.UNKNOWN if i == 0 else gguf.TokenType.CONTROL)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>".encode())
        scores.append(0.0)
        types.append(gguf.TokenType.BYTE)
    # SentencePiece builds a word by merging adjacent pieces that are in the vocabulary, from single characters
    # up: `▁` + `w` -> `▁w`, + `1` -> `▁w1`, + `2` -> `▁w12`. The characters and `▁w` must be pieces, and every
    # word's prefixes are words themselves; without them each word falls back to its five bytes.
    for piece in ("\u2581", "w", *"0123456789", "\u2581w"):
        tokens.append(piece.encode())
        scores.append(-10.0)
        types.append(gguf.TokenType.NORMAL)
    for i in range(words):
        tokens.append(("\u2581" + word(i)).encode())
        scores.append(-1e-3 * i)  # SentencePiece merges by score; every word is one piece anyway
        types.append(gguf.TokenType.NORMAL)
    vocab = len(tokens)

    def weights(*shape: int) -> "np.ndarray":
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    tmp = f"{out}.tmp-{os.getpid()}"
    w = gguf.GGUFWriter(tmp, "llama")
    w.add_name("llmslo-tiny-random-llama")
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_rope_dimension_count(hidden // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_tensor("token_embd.weight", weights(vocab, hidden))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.add_tensor("output.weight", weights(vocab, hidden))
    for layer in range(layers):
        p = f"blk.{layer}."
        w.add_tensor(p + "attn_norm.weight", np.ones(hidden, np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(p + name + ".weight", weights(hidden, hidden))
        w.add_tensor(p + "ffn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(p + "ffn_gate.weight", weights(ff, hidden))
        w.add_tensor(p + "ffn_up.weight", weights(ff, hidden))
        w.add_tensor(p + "ffn_down.weight", weights(hidden, ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, out)  # whole or not at all: a cached file is always a complete model
    return vocab


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="the .gguf file to write")
    p.add_argument("--words", type=int, default=4096)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ff", type=int, default=512)
    p.add_argument("--ctx", type=int, default=8192, help="the model's training context (caps a slot's context)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    vocab = build(a.out, a.words, a.layers, a.hidden, a.heads, a.ff, a.ctx, a.seed)
    print(f"{a.out}: vocab {vocab}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
