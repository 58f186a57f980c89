"""A paged KV cache with a prefix cache, as vLLM V1 keeps it.

Blocks of `block_size` token slots are handed out from one free queue. A full prompt block is entered in the
prefix cache under a hash chained over every token before it (and the LoRA adapter), so two prompts share
blocks exactly as far as their leading tokens agree. A freed block keeps its hash and stays findable until
the free queue hands it out again; allocation takes the queue's head, a freed cached block joins its tail (so
unreferenced cached blocks are evicted oldest first) and a freed block with no hash (a partly filled last
block) its head, to be used before any cached one, as vLLM's BlockPool.free_blocks does. A cached block nobody
references is free: it counts in `num_free_blocks` and `usage`, as in vLLM's get_usage.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from simulator.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 null_block: bool = False) -> None:
        """`null_block`: block 0 is vLLM V1's null block (the block pool takes it out of the free queue at start
        as a placeholder), so `num_blocks - 1` hold tokens, and usage is counted over those."""
        if num_blocks <= (1 if null_block else 0):
            raise ValueError("kv cache: num_blocks must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._null = 1 if null_block else 0
        self._ref_cnt = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(self._null, num_blocks))
        self._cached: dict[int, int] = {}  # block hash -> block id
        self.reserved_blocks = 0  # withheld by a reduced-capacity fault

    # ---------------------------------------------------------------- capacity
    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody references (cached or not), as vLLM counts free."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self._null - len(self._free)

    @property
    def usable_blocks(self) -> int:
        return self.num_blocks - self._null - self.reserved_blocks

    @property
    def usage(self) -> float:
        """vLLM's kv_cache_usage_perc: used over usable, 0..1."""
        return min(1.0, self.num_used_blocks / self.usable_blocks) if self.usable_blocks else 1.0

    def set_capacity_factor(self, factor: float) -> None:
        """Withhold a share of the blocks (fault injection); in-use blocks are reclaimed as they free up."""
        self.reserved_blocks = min(self.num_blocks - self._null - 1, int(round(self.num_blocks * (1.0 - factor))))

    def _available(self) -> int:
        return len(self._free) - self.reserved_blocks

    # ---------------------------------------------------------------- prefix cache
    def _block_hashes(self, req: Request) -> list[int]:
        """Hashes of the request's full blocks so far: its prompt's, then (as in vLLM V1, which caches every full
        block up to `request.num_tokens`) those its generated tokens fill, so a request preempted and recomputed
        finds its own blocks again while they are still cached. Generated tokens stand for themselves: position
        `i` of request `seed` (the simulator's output words are a function of both), so no two requests share one."""
        bs, hashes = self.block_size, req.block_hashes
        full = req.num_tokens // bs
        if len(hashes) < full:
            prompt, n_prompt = req.prompt_token_ids, req.num_prompt_tokens
            parent = hashes[-1] if hashes else hash(req.lora or "")
            for i in range(len(hashes), full):
                start, end = i * bs, (i + 1) * bs
                chunk: tuple[object, ...]  # prompt ids, then (seed, position) for each output token
                if end <= n_prompt:
                    chunk = tuple(prompt[start:end])
                else:
                    chunk = tuple(prompt[start:n_prompt]) + tuple(
                        (req.seed, j) for j in range(max(start, n_prompt) - n_prompt, end - n_prompt))
                parent = hash((parent, chunk))
                hashes.append(parent)
        return hashes

    def get_computed_blocks(self, req: Request) -> list[int]:
        """Cached blocks matching the request's leading full blocks. The last token is always recomputed, as
        in vLLM, so a prompt that is entirely cached still runs one step of prefill."""
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        limit = (req.num_tokens - 1) // self.block_size
        for h in self._block_hashes(req)[:limit]:
            block = self._cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    # ---------------------------------------------------------------- allocation
    def allocate_slots(
        self, req: Request, num_new_tokens: int, computed: Sequence[int] = (), reserve_tokens: int = 0,
        must_fit_tokens: int = 0,
    ) -> bool:
        """Give `req` slots for `num_new_tokens` more tokens (after `computed` cache hits), or nothing and False.
        `reserve_tokens` asks for blocks up to that many tokens at once (static batching reserves the whole
        sequence up front). `must_fit_tokens` allocates only the chunk but refuses unless blocks for that many
        tokens would fit now: vLLM V1's admission check (`scheduler_reserve_full_isl`, on by default), which
        admits a waiting request only if its whole sequence fits, not just its first prefill chunk."""
        bs = self.block_size
        if not computed and not reserve_tokens and not must_fit_tokens:
            # The hot path (a decode token within its last block): nothing to allocate or register.
            total = req.num_computed_tokens + num_new_tokens
            if -(-total // bs) <= len(req.block_ids) and (not self.enable_prefix_caching
                                                          or total // bs <= req.num_registered_blocks):
                return True
        computed_tokens = req.num_computed_tokens + len(computed) * bs
        wanted_tokens = max(computed_tokens + num_new_tokens, reserve_tokens)
        need = cdiv(wanted_tokens, bs) - len(req.block_ids) - len(computed)
        revived = sum(1 for b in computed if self._ref_cnt[b] == 0)  # cached but free: leaves the free queue
        if need + revived > self._available():
            return False
        if must_fit_tokens and cdiv(must_fit_tokens, bs) - len(req.block_ids) - len(computed) + revived > self._available():
            return False
        for b in computed:
            if self._ref_cnt[b] == 0:
                del self._free[b]
            self._ref_cnt[b] += 1
        req.block_ids.extend(computed)
        req.num_registered_blocks = len(req.block_ids) if computed else req.num_registered_blocks
        for _ in range(max(0, need)):
            b, _ = self._free.popitem(last=False)
            h = self._hash[b]
            if h is not None:  # evict the LRU cached block
                if self._cached.get(h) == b:
                    del self._cached[h]
                self._hash[b] = None
            self._ref_cnt[b] = 1
            req.block_ids.append(b)
        if self.enable_prefix_caching:
            self._register_full_blocks(req, computed_tokens + num_new_tokens)
        return True

    def _register_full_blocks(self, req: Request, computed_tokens: int) -> None:
        # the full blocks whose tokens are all known: prompt tokens, and generated ones already sampled
        upto = min(computed_tokens, req.num_tokens) // self.block_size
        hashes = self._block_hashes(req)
        upto = min(upto, len(hashes))
        for i in range(req.num_registered_blocks, upto):
            b, h = req.block_ids[i], hashes[i]
            if h not in self._cached:
                self._cached[h] = b
                self._hash[b] = h
        req.num_registered_blocks = max(req.num_registered_blocks, upto)

    def free(self, req: Request) -> None:
        """Drop the request's references; cached tail blocks go to the free queue first so they are evicted
        first, and blocks with no hash to its head, to be handed out before any cached block."""
        for b in reversed(req.block_ids):
            self._ref_cnt[b] -= 1
            if self._ref_cnt[b] == 0:
                self._free[b] = None
                if self._hash[b] is None:
                    self._free.move_to_end(b, last=False)
        req.block_ids = []
        req.num_registered_blocks = 0

    # ---------------------------------------------------------------- checks
    def check_consistency(self) -> None:
        """Every block is either referenced or in the free queue, never both; for tests."""
        for b in range(self._null, self.num_blocks):
            in_free = b in self._free
            if in_free == (self._ref_cnt[b] > 0) or self._ref_cnt[b] < 0:
                raise AssertionError(f"block {b}: ref_cnt={self._ref_cnt[b]} in_free_queue={in_free}")
