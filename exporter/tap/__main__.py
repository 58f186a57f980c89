"""`python -m exporter.tap ...`: the same as `llmslo-exporter tap ...`."""

import sys

from exporter.tap.cli import main

raise SystemExit(main(sys.argv[1:]))
