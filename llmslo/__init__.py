"""llmslo: SLO and capacity observability for LLM inference serving."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    # `llmslo.__version__`, read from the installed distribution's metadata (llmslo/version.py) when first asked
    # for, so that `import llmslo` does not load importlib.metadata.
    if name == "__version__":
        from llmslo.version import version

        return version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
