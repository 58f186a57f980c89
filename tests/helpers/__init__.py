"""Helpers only tests use: reading generated outputs back (PromQL names, dashboard queries) and loading specs."""
