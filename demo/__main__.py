"""`python -m demo [--duration S]`: what `make demo` runs.

Starts an engine (the simulator when it is installed, else a built-in vLLM-shaped page), the
exporter with fake GPUs scraping it, and prints a live summary of the exporter's /metrics. It
stops everything it started on exit, Ctrl-C or the end of --duration.
"""

import sys

from demo.run import main

sys.exit(main())
