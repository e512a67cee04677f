"""The v0 engine loop: vLLM 0.10.2's ``LLMEngine.step`` over the fast v0 scheduler.

``V0Engine.step()`` = ``schedule()`` (``FastV0Scheduler``), the runner's swaps,
copies and forward pass (``V0ModelRunner.execute``), then the update with the
greedy tokens (computed tokens, stop checks, freeing finished groups). Requests
the scheduler ignores (prompt over the limit, never fits) end with ``length``
and no tokens, as vLLM reports them. Same surface as :class:`schedconf.impl.engine.Engine`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from schedconf.impl.engine import EngineStats, RequestRecord
from schedconf.impl.model import LlamaModel
from schedconf.impl.v0_runner import V0ExecuteResult, V0ModelRunner
from schedconf.impl.v0_scheduler import FastV0Scheduler, RequestOutputTuple, V0StepOutput


@dataclass
class V0EngineStep:
    """One step: the scheduler's decision, what the runner did, the request outputs."""

    output: V0StepOutput
    result: V0ExecuteResult
    request_outputs: list[RequestOutputTuple]


class V0Engine:
    """A paged-KV greedy engine with vLLM v0 scheduling and real swapping (device <-> host KV blocks)."""

    def __init__(self, config: Any, model: LlamaModel, *, repair: bool = True) -> None:
        self.config = config
        self.model = model
        self.scheduler = FastV0Scheduler(config)
        self.runner = V0ModelRunner(model, self.scheduler, repair=repair)
        self.records: list[RequestRecord] = []
        self._live: dict[str, RequestRecord] = {}
        self.stats = EngineStats()
        self.num_swapped_in_blocks = 0
        self.num_swapped_out_blocks = 0

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Iterable[int],
        max_tokens: int,
        *,
        priority: int = 0,
        arrival_time: int = 0,
        eos_token_id: int | None = None,
        ignore_eos: bool = False,
        stop_token_ids: Iterable[int] = (),
        min_tokens: int = 0,
    ) -> None:
        prompt = tuple(prompt_token_ids)
        stops = tuple(stop_token_ids)
        self.scheduler.add_request(
            request_id,
            prompt,
            max_tokens,
            priority=priority,
            arrival_time=arrival_time,
            eos_token_id=eos_token_id,
            ignore_eos=ignore_eos,
            stop_token_ids=stops,
            min_tokens=min_tokens,
        )
        record = RequestRecord(
            request_id,
            prompt,
            max_tokens,
            eos_token_id,
            bool(ignore_eos),
            stops,
            min_tokens,
            self.scheduler.requests[request_id],
        )  # type: ignore[arg-type]
        self.records.append(record)
        self._live[request_id] = record

    def abort(self, request_id: str) -> list[str]:
        finished = self.scheduler.abort(request_id)
        for rid in finished:
            self._live.pop(rid).finish_reason = "abort"
        return finished

    def step(self) -> V0EngineStep:
        """One engine step: schedule, swap/copy/forward, update."""
        out = self.scheduler.schedule()
        result = self.runner.execute(out)
        outputs = self.scheduler.update_from_output(out, result.sampled)
        stats = self.stats
        stats.num_steps += 1
        stats.num_forward_tokens += sum(len(s.input_ids) for s in result.segments)
        stats.num_repaired_tokens += result.num_repaired_tokens
        stats.near_ties.extend(result.near_ties)
        self.num_swapped_in_blocks += len(out.blocks_to_swap_in)
        self.num_swapped_out_blocks += len(out.blocks_to_swap_out)
        for req in out.ignored:
            record = self._live.pop(req.req_id, None)
            if record is not None:
                record.finish_reason = "length"
        for rid, tokens, reason, stop in outputs:
            stats.num_generated_tokens += len(tokens)
            if reason is not None:
                record = self._live.pop(rid)
                record.finish_reason, record.stop_reason = reason, stop
        return V0EngineStep(out, result, outputs)

    def has_requests(self) -> bool:
        return self.scheduler.has_requests()

    def run(self, max_steps: int = 100_000, max_idle_steps: int = 1000) -> None:
        """Step until no request is left; refuse to spin where vLLM 0.10.2 would spin forever.

        ``max_idle_steps`` consecutive steps that schedule, swap and finish nothing raise
        RuntimeError (e.g. a chunked prefill swapped out with more uncomputed tokens than
        ``max_num_batched_tokens``: its swap-in is never chunked, so it never fits).
        """
        idle = 0
        for _ in range(max_steps):
            if not self.has_requests():
                return
            st = self.step()
            out = st.output
            busy = out.entries or out.blocks_to_swap_in or out.blocks_to_swap_out or out.ignored or st.request_outputs
            idle = 0 if busy else idle + 1
            if idle >= max_idle_steps:
                raise RuntimeError(f"no progress for {idle} steps with requests left (a v0 livelock)")
        raise RuntimeError(f"engine still has requests after {max_steps} steps")

    def outputs(self) -> dict[str, list[int]]:
        return {r.req_id: r.output_tokens for r in self.records}
