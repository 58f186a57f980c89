"""promtool unit tests generated beside the rules: per service (`slo_tests.py`, expectations from
`simulate.py`), and for the health and capacity alerts."""
