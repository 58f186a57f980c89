"""What `--gpu` may say, apart from the providers: parsing it must not import them (start-up time; `--gpu off`
imports none of them at all), and the fake reads its cap from here."""

from __future__ import annotations

MAX_FAKE_GPUS = 64
SPEC_HELP = f"use nvml, fake:N (N = 0..{MAX_FAKE_GPUS}) or off"


def parse_spec(spec: str) -> tuple[str, int]:
    """'nvml' -> ('nvml', 0); 'fake:4' -> ('fake', 4); 'off' -> ('off', 0). ValueError says what to write."""
    text = spec.strip().lower()
    if text in ("nvml", "off"):
        return text, 0
    if text.startswith("fake:"):
        count = text.removeprefix("fake:")
        if count.isdigit() and int(count) <= MAX_FAKE_GPUS:
            return "fake", int(count)
    raise ValueError(f"GPU provider {spec!r} not understood: {SPEC_HELP}")
