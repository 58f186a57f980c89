"""Builds a tiny random-weight Llama and a word-level tokenizer into a folder vLLM loads.

Run with the real-engine environment's Python (it needs torch, transformers and tokenizers, which the
project's own environment does not carry). Nothing is downloaded: the weights are random (seeded), the
vocabulary is made-up words, so a prompt of N words is exactly N tokens (+1 for BOS) and generation is
random words: requests pass `ignore_eos` to control output length.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant {% endif %}"
)
ROLE_WORDS = ["system", "user", "assistant"]


def word(i: int) -> str:
    """The i-th vocabulary word; load generators build prompts from the same words."""
    return f"w{i}"


def build(out: str, vocab: int, layers: int, hidden: int, heads: int, kv_heads: int, max_len: int, seed: int) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    words = SPECIALS + ROLE_WORDS + [word(i) for i in range(vocab - len(SPECIALS) - len(ROLE_WORDS))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        model_max_length=max_len,
    )
    fast.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_len,
        bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=True, torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    tmp = f"{out}.tmp{os.getpid()}"
    os.makedirs(tmp, exist_ok=True)
    model.save_pretrained(tmp, safe_serialization=True)
    fast.save_pretrained(tmp)
    with open(os.path.join(tmp, "llmslo-model.json"), "w") as f:
        json.dump({"vocab": vocab, "layers": layers, "hidden": hidden, "seed": seed, "max_len": max_len}, f)
    try:
        os.rename(tmp, out)  # atomic; a concurrent build that finished first wins
    except OSError:
        import shutil
        shutil.rmtree(tmp)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    build(a.out, a.vocab, a.layers, a.hidden, a.heads, a.kv_heads, a.max_len, a.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
