"""Load for the real engine: the simulator's seeded workload, sent with the tiny model's own words.

`simulator.loadgen` renders prompts in the simulator's vocabulary; the tiny random Llama the real-engine
tier builds (realengine/build_model.py) has a word-level vocabulary of its own (`w0`, `w1`, ...), so those
words would all be `<unk>`: every prompt the same token, one prefix shared by all, a KV cache that never
fills. Here each prompt token id becomes one of the model's words, so a prompt of N words is N tokens and
prompts differ as the workload drew them (the shared-prefix share included). The load itself is
`simulator.loadgen.run_load` with `render_prompt=prompt_text`: the same schedule and the same timing.
"""

from __future__ import annotations

from realengine.build_model import ROLE_WORDS, SPECIALS, word

# The tiny model's vocabulary (build_model.py's default --vocab 4096): specials, role words, then w0..w4088.
MODEL_WORDS = 4096 - len(SPECIALS) - len(ROLE_WORDS)


def prompt_text(token_ids: list[int]) -> str:
    """One model word per token id: the tokenizer gives back exactly len(token_ids) tokens."""
    return " ".join(word(t % MODEL_WORDS) for t in token_ids)
