"""Run fidelity cases on whichever `simulator` package is first on PYTHONPATH (the old commit's, for `before`).

Reads a JSON list of cases on stdin, prints a JSON list of results. A case either replays a request list
(arrival, prompt tokens, output tokens) through the engine in virtual time, or asks for the time of the 32
layers' linear operators at a token count (Vidur's kernel profile rows). It touches only the simulator API
that both trees share (presets' GPUS/MODELS, Deployment, EngineConfig, EngineCore, run_virtual, summarize),
so the same requests run on the old cost model and the new one.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from simulator.clock import VirtualClock
from simulator.config import EngineConfig
from simulator.costmodel import CostModel, CostParams, StepShape
from simulator.engine import EngineCore, run_virtual
from simulator.presets import GPUS, MODELS, Deployment
from simulator.stats import summarize
from simulator.virtual import RunRecorder


def _deployment(case: dict) -> Deployment:
    return Deployment("fidelity", MODELS[case["model"]], GPUS[case["gpu"]], tp=case["tp"])


def _linear_s(case: dict) -> float:
    cost = CostModel(_deployment(case))
    if hasattr(cost, "layers_linear_time"):
        return cost.layers_linear_time(case["tokens"])
    # The old model has no separate linear term: its step time for the tokens, less the fixed costs.
    n = case["tokens"]
    return cost.step_time(StepShape(n, 1, 0, 0.0)) - cost._fixed_s - cost.params.per_seq_overhead_s


def _run(case: dict) -> dict:
    config = EngineConfig(deployment=_deployment(case), max_num_seqs=case["max_num_seqs"],
                          max_num_batched_tokens=case["max_num_batched_tokens"], enable_prefix_caching=False)
    params = dataclasses.replace(CostParams(), frontend_latency_s=0.0) if case["offline"] else None
    clock = VirtualClock()
    core = EngineCore(config, clock, params)
    recorder = RunRecorder()
    core.observers.append(recorder)
    arrivals = []
    for i, (at, prompt, output) in enumerate(case["items"]):
        ids = list(range(i << 20, (i << 20) + prompt))
        arrivals.append((at, core.new_request(ids, output, output_len=output)))
    run_virtual(core, clock, arrivals)
    s = summarize(recorder.records, recorder.last_finish, 1.0, 1.0)
    return {"throughput_rps": s["throughput_rps"], "tpot_ms": s["tpot_s"]["mean"] * 1e3,
            "ttft_ms": s["ttft_s"]["mean"] * 1e3, "e2e_ms": s["e2e_s"]["mean"] * 1e3}


def main() -> int:
    cases = json.load(sys.stdin)
    out = [{"linear_ms": _linear_s(c) * 1e3} if c["kind"] == "linear" else _run(c) for c in cases]
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
