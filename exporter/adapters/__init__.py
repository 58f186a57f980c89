"""Engine adapters: pure functions from parsed families to normalized samples, one module per engine."""
