"""One request's state inside the engine, with the timestamps vLLM's metrics are computed from."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, Sequence


class Status(enum.Enum):
    PENDING = "pending"  # in the frontend (tokenizing), not yet visible to the scheduler
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


# vLLM's finished reasons, as the `finished_reason` label spells them.
FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_ABORT = "abort"
FINISH_ERROR = "error"


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_token_ids: Sequence[int]
    max_tokens: int  # the cap the client asked for (or what the context leaves)
    output_len: int  # where the sequence would stop by itself (EOS); >= max_tokens means "runs to length"
    arrival_time: float
    lora: str | None = None
    seed: int = 0  # picks the fake output words

    status: Status = Status.PENDING
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # of the prompt's full blocks, filled on first use
    num_registered_blocks: int = 0  # leading blocks already entered in the prefix cache
    num_preemptions: int = 0
    num_cached_tokens: int = -1  # prefix-cache hit at first admission; -1 until admitted
    deferred: bool = False  # skipped last step for want of a LoRA slot

    queued_time: float = 0.0  # reached the engine core
    scheduled_time: float = 0.0  # first admitted to the batch
    first_token_time: float = 0.0
    prev_token_time: float = 0.0
    last_token_time: float = 0.0
    finished_time: float = 0.0
    finish_reason: str = ""
    # Called by the engine after each step that gave this request a token or finished it.
    listener: Callable[["Request"], None] | None = None
    num_prompt_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
