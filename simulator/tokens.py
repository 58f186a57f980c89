"""Fake text for a fake model: one token is one word from a fixed vocabulary, so counts are exact and output is
deterministic. Prompts are tokenized by whitespace; any word outside the vocabulary still gets a stable id."""

from __future__ import annotations

import zlib
from functools import lru_cache

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS]
VOCAB: tuple[str, ...] = tuple(a + b for a in _SYLLABLES for b in _SYLLABLES)  # 4900 two-syllable words
VOCAB_SIZE = len(VOCAB)
_INDEX = {w: i for i, w in enumerate(VOCAB)}

# Chat template: each message is <role marker> content <end>, then the assistant marker opens the reply.
_ROLE_IDS = {"system": VOCAB_SIZE, "user": VOCAB_SIZE + 1, "assistant": VOCAB_SIZE + 2, "tool": VOCAB_SIZE + 3}
_END_ID = VOCAB_SIZE + 4


@lru_cache(maxsize=65536)
def token_id(word: str) -> int:
    idx = _INDEX.get(word)
    return idx if idx is not None else VOCAB_SIZE + 16 + zlib.crc32(word.encode()) % (1 << 30)


class PromptTooLong(ValueError):
    """More tokens than the caller's limit (the model's context): refused before the rest is tokenized."""


def tokenize(text: str, limit: int | None = None) -> list[int]:
    """Token ids of `text`; with `limit`, PromptTooLong past that many, after splitting off at most limit + 1
    words (a 64 MiB body of one-letter words would otherwise become 32 million strings)."""
    words = text.split() if limit is None else text.split(maxsplit=limit)
    if limit is not None and len(words) > limit:
        raise PromptTooLong(f"the prompt is longer than {limit} tokens")
    return [token_id(w) for w in words]


def tokenize_chat(messages: list[dict], limit: int | None = None) -> list[int]:
    """Token ids of a chat prompt: template markers plus each message's words. Raises ValueError (naming the
    message) on a malformed message, PromptTooLong past `limit` tokens."""
    ids: list[int] = []
    for i, m in enumerate(messages):
        if limit is not None and len(ids) >= limit:
            raise PromptTooLong(f"the prompt is longer than {limit} tokens")
        if not isinstance(m, dict) or m.get("role") not in _ROLE_IDS:
            raise ValueError(f"messages[{i}].role must be one of {', '.join(_ROLE_IDS)}")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            texts = [p.get("text") or "" for p in content if isinstance(p, dict)]
            if not all(isinstance(t, str) for t in texts):
                raise ValueError(f"messages[{i}].content: a part's text must be a string")
            content = " ".join(texts)
        if content is not None and not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string or a list of text parts")
        ids.append(_ROLE_IDS[m["role"]])
        ids.extend(tokenize(content or "", None if limit is None else max(0, limit - len(ids))))
        ids.append(_END_ID)
    ids.append(_ROLE_IDS["assistant"])
    if limit is not None and len(ids) > limit:
        raise PromptTooLong(f"the prompt is longer than {limit} tokens")
    return ids


def render(token_ids: list[int]) -> str:
    """Text whose tokenization gives back ids equal modulo the vocabulary (the load generator's prompts)."""
    return " ".join(VOCAB[t % VOCAB_SIZE] for t in token_ids)


def output_word(seed: int, index: int) -> str:
    """The `index`-th generated word of the request seeded `seed`, with its leading space."""
    return " " + VOCAB[(seed * 7919 + index * 104729) % VOCAB_SIZE]
