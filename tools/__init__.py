"""Operator tools that run from a checkout, not in the image: `python -m tools.<name>`."""
