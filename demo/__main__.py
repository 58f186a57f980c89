"""`python -m demo`: what `make demo` runs; the whole stack and a staged incident (see demo/fullstack.py).
`python -m demo --engine vllm` (`make demo ENGINE=vllm`): the same story on a real vLLM (CPU build, tiny model).
`python -m demo --fleet`: two clusters remote-writing into VictoriaMetrics, the rules in vmalert (demo/fleet.py)."""

import argparse
import sys

args = sys.argv[1:]
if "--fleet" in args:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--engine", choices=("sim", "vllm"), default="sim")
    known, rest = pre.parse_known_args([a for a in args if a != "--fleet"])
    if known.engine != "sim":
        sys.exit("python -m demo --fleet: the fleet demo runs on the simulator only (--engine vllm is the "
                 "single-cluster demo: python -m demo --engine vllm)")
    from demo.fleet import main

    sys.exit(main(rest))

from demo.fullstack import main

sys.exit(main(args))  # --engine sim|vllm is fullstack's own flag
