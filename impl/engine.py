"""The engine loop: requests in, greedy tokens out, one scheduled batch per step.

``Engine.step()`` is vLLM's ``EngineCore.step`` without async scheduling:
``schedule()`` on the fast scheduler, one forward pass of the batch on the
paged KV cache (``ModelRunner.execute``), ``update_from_output`` with the
sampled tokens and the drafter's proposals, then the runner records which KV
blocks became valid. ``add_request`` and ``abort`` may come between steps.

The pieces are public (``schedule`` / ``execute`` / ``update``) so that a
checker can run a reference scheduler in lockstep (``gpu_checks/engine_check.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from impl.drafter import NgramDrafter
from impl.model import LlamaModel
from impl.runner import ExecuteResult, ModelRunner
from impl.sampling import NearTie
from impl.scheduler import FINISHED_ABORTED, FastScheduler, Req, RequestOutputTuple, StepOutput
from spec.config import SchedulerConfig


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

    def __init__(self, config: SchedulerConfig, model: LlamaModel, *, profile: str = "vllm-0.33",
                 drafter: NgramDrafter | None = None, use_drafter: bool = True, repair_prefix_hits: bool = True) -> None:
        self.config = config
        self.model = model
        self.scheduler = FastScheduler(config, profile)
        if drafter is None and use_drafter and config.num_spec_tokens > 0:
            drafter = NgramDrafter(config.num_spec_tokens)
        self.runner = ModelRunner(model, self.scheduler.pool, config.block_size, config.max_model_len,
                                  config.num_spec_tokens, drafter, repair_prefix_hits)
        self.records: list[RequestRecord] = []
        self._live: dict[str, RequestRecord] = {}
        self.stats = EngineStats()

    def add_request(self, request_id: str, prompt_token_ids: Iterable[int], max_tokens: int, *, priority: int = 0,
                    arrival_time: int = 0, eos_token_id: int | None = None, ignore_eos: bool = False,
                    stop_token_ids: Iterable[int] = (), min_tokens: int = 0) -> None:
        """Queue a request (the scheduler validates it; InvalidEvent leaves everything unchanged)."""
        prompt = tuple(prompt_token_ids)
        stops = tuple(stop_token_ids)
        self.scheduler.add_request(request_id, prompt, max_tokens, priority=priority, arrival_time=arrival_time,
                                   eos_token_id=eos_token_id, ignore_eos=ignore_eos, stop_token_ids=stops,
                                   min_tokens=min_tokens)
        record = RequestRecord(request_id, prompt, max_tokens, eos_token_id, bool(ignore_eos), stops, min_tokens,
                               self.scheduler.requests[request_id])
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

    def schedule(self) -> StepOutput:
        return self.scheduler.schedule()

    def execute(self, out: StepOutput) -> ExecuteResult:
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

    def has_requests(self) -> bool:
        return self.scheduler.has_requests()

    def run(self, max_steps: int = 100_000) -> None:
        """Step until no request is left."""
        for _ in range(max_steps):
            if not self.has_requests():
                return
            self.step()
        raise RuntimeError(f"engine still has requests after {max_steps} steps")

    def outputs(self) -> dict[str, list[int]]:
        """Generated tokens per request id (the latest request of each id)."""
        return {r.req_id: r.output_tokens for r in self.records}


def make_engine(config: object, model: LlamaModel, profile: str = "vllm-0.33", **kwargs: object) -> object:
    """The engine of ``profile``'s scheduler: :class:`Engine` (v1 profiles, a ``SchedulerConfig``) or
    ``impl.v0_engine.V0Engine`` for ``vllm-0.10`` (a config with ``V0SchedulerConfig``'s fields; real
    swapping between the device and a host KV cache)."""
    if profile == "vllm-0.10":
        from impl.v0_engine import V0Engine

        return V0Engine(config, model, **kwargs)  # type: ignore[arg-type]
    return Engine(config, model, profile=profile, **kwargs)  # type: ignore[arg-type]


def is_aborted(record: RequestRecord) -> bool:
    """True for a request that ended by abort."""
    return record.req.status == FINISHED_ABORTED
