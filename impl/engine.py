"""The engine loop: requests in, greedy tokens out, one scheduled batch per step.

``Engine.step()`` is vLLM's ``EngineCore.step`` without async scheduling:
``schedule()`` on the fast scheduler, one forward pass of the batch on the
paged KV cache (``ModelRunner.execute``), ``update_from_output`` with the
sampled tokens and the drafter's proposals, then the runner records which KV
blocks became valid. ``add_request`` and ``abort`` may come between steps.

``Engine.step_overlapped()`` is vLLM's ``EngineCore.step_with_batch_queue``
(async scheduling, ``max_concurrent_batches > 1``): it schedules step N+1
while step N's forward pass runs on a worker thread (the batch queue holds
up to ``max_concurrent_batches`` steps), and applies outputs oldest first.
Under an ``-async`` profile step N+1 may decode a token step N is still
sampling (an output placeholder); the runner fills that input when N+1 runs
(``impl/runner.py``). ``run()`` picks the overlapped loop when the scheduler
allows more than one step in flight.

Async scheduling with spec decode: as in vLLM's worker, the drafts never reach
the scheduler. The runner proposes them on the thread that runs the steps,
right after sampling, and puts them in place of the ``[-1] * k`` placeholders
the scheduler gives the request's next step, whose positions it moves back
over the drafts the steps before rejected; ``update`` hands the scheduler no
drafts.

The pieces are public (``schedule`` / ``execute`` / ``update``) so that a
checker can run a reference scheduler in lockstep (``gpu_checks/engine_check.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from schedconf.impl.drafter import NgramDrafter
from schedconf.impl.model import LlamaModel
from schedconf.impl.runner import ExecuteResult, ModelRunner, PreparedStep
from schedconf.impl.sampling import NearTie
from schedconf.impl.scheduler import FINISHED_ABORTED, FastScheduler, Req, RequestOutputTuple, StepOutput
from schedconf.spec.v1.config import SchedulerConfig


@dataclass
class RequestRecord:
    """One request as the engine saw it: its parameters, its scheduler record, how it ended."""

    req_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    eos_token_id: int | None
    ignore_eos: bool
    stop_token_ids: tuple[int, ...]
    min_tokens: int
    req: Req
    finish_reason: str | None = None
    stop_reason: int | None = None

    @property
    def output_tokens(self) -> list[int]:
        """The tokens generated so far (all of them once finished)."""
        return self.req.output_token_ids


@dataclass
class EngineStep:
    """One step: the scheduler's decision, the forward pass, the request outputs."""

    output: StepOutput
    result: ExecuteResult
    request_outputs: list[RequestOutputTuple]


@dataclass
class EngineStats:
    """Counters over the engine's life."""

    num_steps: int = 0
    num_generated_tokens: int = 0
    num_forward_tokens: int = 0
    num_drafts_proposed: int = 0
    num_drafts_accepted: int = 0
    num_repaired_tokens: int = 0
    near_ties: list[NearTie] = field(default_factory=list)


class Engine:
    """A paged-KV greedy inference engine over one :class:`LlamaModel`."""

    def __init__(
        self,
        config: SchedulerConfig,
        model: LlamaModel,
        *,
        profile: str = "vllm-0.33",
        drafter: NgramDrafter | None = None,
        use_drafter: bool = True,
        repair_prefix_hits: bool = True,
    ) -> None:
        self.config = config
        self.model = model
        self.scheduler = FastScheduler(config, profile)
        if drafter is None and use_drafter and config.num_spec_tokens > 0:
            drafter = NgramDrafter(config.num_spec_tokens)
        self.runner = ModelRunner(
            model,
            self.scheduler.pool,
            config.block_size,
            config.max_model_len,
            config.num_spec_tokens,
            drafter,
            repair_prefix_hits,
            async_scheduling=self.scheduler.async_scheduling,
        )
        self.records: list[RequestRecord] = []
        self._live: dict[str, RequestRecord] = {}
        self.stats = EngineStats()
        self.batch_queue: deque[tuple[StepOutput, PreparedStep, Future[ExecuteResult]]] = deque()
        """Steps scheduled by ``step_overlapped`` whose output is not applied yet, oldest first."""
        self._worker: ThreadPoolExecutor | None = None

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
        """Queue a request (the scheduler validates it; InvalidEvent leaves everything unchanged)."""
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
        )
        self.records.append(record)
        self._live[request_id] = record

    def abort(self, request_id: str) -> list[str]:
        """Abort a request; its tokens so far stay in its record."""
        finished = self.scheduler.abort(request_id)
        for rid in finished:
            record = self._live.pop(rid)
            record.finish_reason = "abort"
            self.runner.forget(rid)
        return finished

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget the prefix cache (the KV stays; no block can be hit any more); True if it was reset."""
        return self.scheduler.reset_prefix_cache(reset_running_requests)

    def schedule(self, throttle_prefills: bool = False) -> StepOutput:
        return self.scheduler.schedule(throttle_prefills)

    def execute(self, out: StepOutput) -> ExecuteResult:
        """Prepare, run and propose ``out`` on this thread (the synchronous path)."""
        return self.runner.execute(out)

    def update(self, out: StepOutput, result: ExecuteResult) -> list[RequestOutputTuple]:
        """Apply the forward pass's tokens and drafts, record KV validity and finished requests."""
        outputs = self.scheduler.update_from_output(out, result.sampled, result.drafts)
        self.runner.commit(result)
        stats = self.stats
        stats.num_steps += 1
        stats.num_forward_tokens += sum(len(s.input_ids) for s in result.segments)
        stats.num_drafts_proposed += sum(len(s.drafts) for s in result.segments if s.end > s.num_tokens)
        stats.num_drafts_accepted += result.num_drafts_accepted
        stats.num_repaired_tokens += result.num_repaired_tokens
        stats.near_ties.extend(result.near_ties)
        for rid, tokens, reason, stop in outputs:
            stats.num_generated_tokens += len(tokens)
            if reason is not None:
                record = self._live.pop(rid)
                record.finish_reason, record.stop_reason = reason, stop
        return outputs

    def step(self) -> EngineStep:
        """One engine step: schedule, forward, update."""
        out = self.schedule()
        result = self.execute(out)
        return EngineStep(out, result, self.update(out, result))

    @property
    def max_concurrent_batches(self) -> int:
        return self.scheduler.max_concurrent_batches

    def step_overlapped(self) -> EngineStep | None:
        """One call of vLLM's ``step_with_batch_queue``: schedule ahead if the queue has room, else apply.

        If there is work and the batch queue is not full, schedule a step,
        prepare it (on this thread: it reads the scheduler's state) and hand
        its forward pass to the worker thread; return None at once unless the
        queue is now full or nothing is left to schedule. Otherwise wait for
        the oldest step's forward pass and apply its output (returned).
        """
        queue = self.batch_queue
        assert len(queue) < self.max_concurrent_batches
        if self.scheduler.has_requests():
            out = self.schedule()
            prepared = self.runner.prepare(out)
            if self._worker is None:
                self._worker = ThreadPoolExecutor(
                    max_workers=1,
                    thread_name_prefix="impl-forward",
                    initializer=_init_worker,
                    initargs=(torch.get_num_threads(),),
                )
            queue.append((out, prepared, self._worker.submit(self.runner.run, prepared)))
            if len(queue) < self.max_concurrent_batches and (
                out.total_num_scheduled_tokens > 0 or self.scheduler.has_requests()
            ):
                return None
        elif not queue:
            return None
        out, _, future = queue.popleft()
        result = future.result()
        self.runner.propose(result)
        return EngineStep(out, result, self.update(out, result))

    def has_requests(self) -> bool:
        return self.scheduler.has_requests()

    def run(self, max_steps: int = 100_000, *, overlap: bool | None = None) -> None:
        """Step until no request is left (and no step is in flight).

        ``overlap`` (default: when ``max_concurrent_batches > 1``) runs the
        overlapped loop, else the synchronous one.
        """
        if overlap is None:
            overlap = self.max_concurrent_batches > 1
        if overlap:
            for _ in range(max_steps):
                if not self.has_requests() and not self.batch_queue:
                    return
                self.step_overlapped()
        else:
            for _ in range(max_steps):
                if not self.has_requests():
                    return
                self.step()
        raise RuntimeError(f"engine still has requests after {max_steps} steps")

    def close(self) -> None:
        """Wait for the steps in flight (their outputs are dropped) and stop the worker thread."""
        for _, _, future in self.batch_queue:
            future.result()
        self.batch_queue.clear()
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None

    def outputs(self) -> dict[str, list[int]]:
        """Generated tokens per request id (the latest request of each id)."""
        return {r.req_id: r.output_tokens for r in self.records}


def _init_worker(num_threads: int) -> None:
    """The forward thread uses the caller's torch CPU thread count (OpenMP's is per thread)."""
    torch.set_num_threads(num_threads)


def is_aborted(record: RequestRecord) -> bool:
    """True for a request that ended by abort."""
    return record.req.status == FINISHED_ABORTED
