"""llmslo: SLO and capacity observability for LLM inference serving."""

__version__ = "0.1.0"
