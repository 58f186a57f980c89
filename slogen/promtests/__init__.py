"""promtool unit tests generated beside the rules: per service (`slo_tests.py`, expectations from
`simulate.py`, with `fixtures`, `series`, `checks`, `no_data_tests` and `threshold_change`), and for the health and
capacity alerts."""
