"""`python -m demo`: what `make demo` runs; the whole stack and a staged incident (see demo/fullstack.py).
`python -m demo --fleet`: two clusters remote-writing into VictoriaMetrics, the rules in vmalert (demo/fleet.py)."""

import sys

if "--fleet" in sys.argv[1:]:
    from demo.fleet import main

    sys.exit(main([a for a in sys.argv[1:] if a != "--fleet"]))

from demo.fullstack import main

sys.exit(main())
