"""`make demo`: the exporter with fake GPUs scraping an engine, its output summarised live."""
