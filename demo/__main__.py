"""`python -m demo`: what `make demo` runs; the whole stack and a staged incident (see demo/fullstack.py)."""

import sys

from demo.fullstack import main

sys.exit(main())
