"""`python -m exporter` is `llmslo-exporter`."""

import sys

from exporter.cli import main

sys.exit(main())
