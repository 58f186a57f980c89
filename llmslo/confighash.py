"""The content hash of a set of SLO files: what a tap has loaded, and what slogen built the rules from.

Both sides compute it from the files' bytes alone, not their names or order: slogen reads
`slos/chat.yaml`, the tap reads the same text from its ConfigMap as `slos_chat.yaml`. A tap whose
hash (`llm_tap_config_info{hash}`) differs from the one in the rules runs on other thresholds
than the rules query (HEALTH.TAP_CONFIG_DRIFT).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

HASH_CHARS = 16  # hex digits kept: 64 bits tell configurations apart; a label value stays short


def config_hash(contents: Iterable[bytes | str]) -> str:
    """sha256 over the sorted sha256 digests of each file's bytes (UTF-8 for text), HASH_CHARS hex digits."""
    digests = sorted(hashlib.sha256(c.encode("utf-8") if isinstance(c, str) else c).digest() for c in contents)
    return hashlib.sha256(b"".join(digests)).hexdigest()[:HASH_CHARS]


__all__ = ["HASH_CHARS", "config_hash"]
