"""Our engine (``impl/``) as systems under test for the harness (``conformance/sut.py``).

* :class:`ImplSchedulerSut` (``--sut impl``): the fast scheduler alone. The
  harness feeds the model outputs recorded in the trace; outputs are the
  canonical form of ``spec/output.py`` and ``observe()`` returns the free queue.
* :class:`ImplEngineSut` (``--sut impl-engine``): the whole engine, teacher
  forced. Every step also runs the real model over the scheduled
  batch (paged KV cache, chunked prefill, prefix hits, drafts, preemption by
  recompute), while the tokens appended are the trace's, so the scheduler
  outputs are compared with the trace as for ``impl``. In addition, every
  position whose token the trace samples is checked against a dense, cache-free
  forward of the same model over the same tokens: a logit difference above the
  tolerance, or a different greedy token without a near tie, fails the step
  (``EngineMismatch``). The free-running mode, where the engine's own tokens
  drive both the engine and the reference scheduler, is
  ``gpu_checks/engine_check.py``: the replay harness reads tokens from the
  trace and so cannot drive it.

Both run traces with steps in flight (``in_flight = True``: ``max_concurrent_batches
> 1``, the ``-async`` profiles): ``update_from_output(..., step=N)`` applies the
output of step N, which must be the oldest in flight (the model's refusal codes
otherwise). The engine adapter prepares each step's batch when it is scheduled
and runs the forward pass when that step's output is applied, in schedule order:
a decode scheduled on an output placeholder then reads the token the trace
sampled there.

With a v0 profile (``vllm-0.10``, chosen by ``schedconf.spec.schedulers.get_scheduler_kind``)
both run the v0 path instead: ``schedconf.impl.v0_scheduler.FastV0Scheduler`` (outputs in
the v0 canonical form, ``observe()`` the v0 observation) and, for the engine,
``schedconf.impl.v0_runner.V0ModelRunner`` (swaps between the device and a host KV cache,
then the forward; every sampled position checked against the dense forward as
above).

``impl/`` does not know it is being checked: its adapters live here, with the
other adapters. Nothing imports this module when ``conformance`` or
``schedconf.conformance.adapters`` is imported; the adapter registry loads it by name on ``make_sut("impl")`` or
``make_sut("impl-engine")``. The scheduler adapter needs no torch; the engine
adapter imports torch only in ``start()``.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from schedconf.conformance.sut import InProcessSut, SutInputError, SutUnsupported, refused_as_input_error
from schedconf.impl.scheduler import FastScheduler, UnsupportedProfile
from schedconf.impl.v0_scheduler import FastV0Scheduler, V0StepOutput
from schedconf.spec.v1.config import SchedulerConfig


def get_scheduler_kind(profile: str) -> str:
    """``"v0"`` for a v0 profile (``vllm-0.10``), else ``"v1"`` (``schedconf.spec.schedulers`` decides when present)."""
    try:
        from schedconf.spec.schedulers import get_scheduler_kind as kind_of
    except ImportError:
        return "v0" if profile == "vllm-0.10" else "v1"
    try:
        return kind_of(profile)
    except Exception:  # an unknown profile: the v1 path reports it unsupported
        return "v1"


def make_v0_config(config: dict[str, Any], profile: str) -> Any:
    """The validated v0 config (the model's refusal codes): ``schedconf.spec.schedulers.make_config`` when present."""
    try:
        from schedconf.spec.schedulers import make_config
    except ImportError:
        from schedconf.spec.v0.config import V0SchedulerConfig

        return V0SchedulerConfig.from_dict(config)
    return make_config(config, profile)


def canonical_request_outputs(results: list[tuple[str, Any, str | None, int | None]]) -> list[dict[str, Any]]:
    """``(req_id, tokens, finish_reason, stop_reason)`` tuples in the trace form of RequestOutput."""
    return [
        {"req_id": rid, "new_token_ids": list(tokens), "finish_reason": reason, "stop_reason": stop}
        for rid, tokens, reason, stop in results
    ]


class ImplSchedulerSut(InProcessSut):
    """The fast scheduler behind the SchedulerUnderTest protocol (scheduler only)."""

    name = "impl"
    in_flight = True
    """Runs traces with steps in flight (``max_concurrent_batches > 1``, ``-async`` profiles)."""
    scheduler: Any
    pending: Any
    v0 = False
    """True when the profile is a v0 one (``vllm-0.10``): the scheduler is a FastV0Scheduler."""

    def start(self, config: dict[str, Any], profile: str) -> None:
        """Build a fast scheduler, v1 or v0 by the profile; a bad config is refused with its code.

        v1 profiles the fast scheduler does not model are unsupported.
        """
        self.v0 = get_scheduler_kind(profile) == "v0"
        with refused_as_input_error():
            if self.v0:
                self.scheduler = FastV0Scheduler(make_v0_config(config, profile))
            else:
                cfg = SchedulerConfig.from_dict(config)
                try:
                    self.scheduler = FastScheduler(cfg, profile)
                except UnsupportedProfile as exc:
                    raise SutUnsupported(str(exc)) from None
        self.pending = None

    def update_from_output(
        self, sampled_token_ids: dict[str, list[int]], draft_token_ids: dict[str, list[int]], step: int | None = None
    ) -> list[dict[str, Any]]:
        """Apply the model output of ``step`` (None: the oldest step in flight); refusals change nothing."""
        sched = self._sched()
        if self.v0:
            if self.pending is None:
                raise SutInputError("unexpected_model_output", "model output without a pending step")
            return self._update_v0(sched, sampled_token_ids, draft_token_ids)
        out = self._step_to_apply(step)
        with refused_as_input_error():
            sched.validate_model_output(out, sampled_token_ids, draft_token_ids)
        return self._apply(out, sampled_token_ids, draft_token_ids)

    def _step_to_apply(self, step: int | None) -> Any:
        """The in-flight StepOutput the model output answers (refused with the model's codes)."""
        sched = self._sched()
        if step is None:
            with refused_as_input_error():
                sched._require_alive()  # a dead engine refuses every call first (engine_dead), as the model does
            if not sched.in_flight:
                raise SutInputError("unexpected_model_output", "model output without a pending step")
            return sched.in_flight[0]
        with refused_as_input_error():
            return sched.get_in_flight_output(step)

    def _apply(
        self, out: Any, sampled_token_ids: dict[str, list[int]], draft_token_ids: dict[str, list[int]]
    ) -> list[dict[str, Any]]:
        """Apply a validated model output of the oldest step in flight."""
        sched = self._sched()
        aligned = [sampled_token_ids.get(e[0].req_id, ()) for e in out.entries]
        results = sched.update_from_output(out, aligned, draft_token_ids)
        self.pending = sched.pending
        return canonical_request_outputs(results)

    def reset_prefix_cache(self, reset_running_requests: bool) -> bool:
        """``FastScheduler.reset_prefix_cache`` (v1 only: the v0 trace format has no reset)."""
        if self.v0:
            raise SutUnsupported("the v0 scheduler has no reset_prefix_cache in the trace format")
        with refused_as_input_error():
            return bool(self._sched().reset_prefix_cache(reset_running_requests))

    def _update_v0(
        self, sched: FastV0Scheduler, sampled_token_ids: dict[str, list[int]], draft_token_ids: dict[str, list[int]]
    ) -> list[dict[str, Any]]:
        pending: V0StepOutput = self.pending
        with refused_as_input_error():
            sched.validate_model_output(pending, sampled_token_ids, draft_token_ids)
        aligned = [(sampled_token_ids.get(e[0].req_id) or (None,))[0] if e[3] else None for e in pending.entries]
        results = sched.update_from_output(pending, aligned)
        self.pending = None
        return canonical_request_outputs(results)

    def observe(self) -> dict[str, Any] | None:
        """The free queue, its length, and each request's block table (``block_tables``, for ``--comparison safety``).

        v0: free GPU and CPU blocks and the GPU and CPU block tables (the contract's v0 ``observe``).
        """
        sched = self._sched()
        if self.v0:
            return sched.observe()
        return {
            **sched.observe(),
            "block_tables": {rid: list(req.blocks) for rid, req in sorted(sched.requests.items()) if req.blocks},
        }


def make_scheduler_sut() -> ImplSchedulerSut:
    """Factory for ``--sut impl`` (and ``module:schedconf.conformance.adapters.impl:make_scheduler_sut``)."""
    return ImplSchedulerSut()


_MODELS: dict[tuple[str, str, str], Any] = {}
"""Models built by ImplEngineSut, by (name, device, dtype): weights are read-only, so SUTs share them."""


class EngineMismatch(Exception):
    """The engine's logits at a sampled position disagree with the dense forward over the same tokens."""


class ImplEngineSut(ImplSchedulerSut):
    """The whole engine behind the SchedulerUnderTest protocol, teacher forced by the trace.

    ``schedule()`` also runs the model over the scheduled batch on the paged KV
    cache; ``update_from_output()`` appends the trace's tokens. For every
    position at which a token is sampled (the last real token and each draft
    whose context the sequence confirms), the engine's logits are kept; when
    the request ends (stop, length or abort) one dense forward over its final
    tokens checks them all: ``max |engine - dense| <= tolerance`` and the same
    greedy token unless the choice is a near tie (kept in ``near_ties``).
    A failure raises :class:`EngineMismatch`.
    """

    name = "impl-engine"

    def __init__(
        self,
        model: str = "tiny",
        device: str = "cpu",
        dtype: str = "float64",
        tolerance: float | None = None,
        cpu_threads: int | None = 1,
    ) -> None:
        """``cpu_threads`` sets torch's CPU threads (process-wide) on a CPU device; None leaves them."""
        super().__init__()
        self.cpu_threads = cpu_threads
        self.model_name, self.device, self.dtype_name = model, device, dtype
        self.tolerance = tolerance
        self.model: Any = None
        self.runner: Any = None
        self.result: Any = None
        self._positions: dict[Any, dict[int, Any]] = {}
        self._prepared: deque[Any] = deque()
        """v1: the prepared batch of every step in flight, oldest first (runs when its output is applied)."""
        self.near_ties: list[Any] = []
        self.failures: list[str] = []
        self.num_checked_positions = 0
        self.max_abs_diff = 0.0

    def start(self, config: dict[str, Any], profile: str) -> None:
        import torch

        from schedconf.impl.model import DTYPES, MODEL_CONFIGS, LlamaModel
        from schedconf.impl.runner import ModelRunner

        super().start(config, profile)
        dtype = DTYPES[self.dtype_name]
        if self.cpu_threads and torch.device(self.device).type == "cpu":
            torch.set_num_threads(self.cpu_threads)  # small models lose time to thread hand-offs
        if self.model is None:
            key = (self.model_name, self.device, self.dtype_name)
            if key not in _MODELS:
                _MODELS[key] = LlamaModel(MODEL_CONFIGS[self.model_name], device=self.device, dtype=dtype)
            self.model = _MODELS[key]
        if self.tolerance is None:
            self.tolerance = {torch.float64: 1e-8, torch.float32: 1e-3}.get(dtype, 0.25)
        sched = self._sched()
        if self.v0:
            from schedconf.impl.v0_runner import V0ModelRunner

            self.runner = V0ModelRunner(self.model, sched)
        else:
            self.runner = ModelRunner(
                self.model,
                sched.pool,
                sched.bs,
                sched.mml,
                sched.k,
                drafter=None,
                async_scheduling=sched.async_scheduling,
            )
        self._positions = {}
        self._prepared = deque()

    def schedule(self, throttle_prefills: bool = False) -> dict[str, Any]:
        """Schedule; v1: prepare the step's batch now (block tables as scheduled), run it when its output comes.

        A step runs when its model output is applied (in schedule order, as on
        a device): by then the trace's tokens of every earlier step are in the
        requests, so a decode scheduled on an output placeholder (async
        profiles) reads the token the trace sampled there.
        """
        canonical = super().schedule(throttle_prefills)
        assert self.pending is not None
        if self.v0:  # swaps, copies and the forward pass; the logits of sampled positions are kept
            self.result = self.runner.execute(self.pending, keep_logits=True)
        else:
            self._prepared.append(self.runner.prepare(self.pending))
        return canonical

    def abort(self, request_id: str) -> None:
        req = self._sched().requests.get(request_id)
        super().abort(request_id)
        if req is not None and req.is_finished:
            self._verify(req)

    def update_from_output(
        self, sampled_token_ids: dict[str, list[int]], draft_token_ids: dict[str, list[int]], step: int | None = None
    ) -> list[dict[str, Any]]:
        if self.v0:
            pending, result = self.pending, self.result
            outputs = super().update_from_output(sampled_token_ids, draft_token_ids, step)
            self._keep_v0(pending, result, outputs)
            return outputs
        sched = self._sched()
        pending = self._step_to_apply(step)
        with refused_as_input_error():
            sched.validate_model_output(pending, sampled_token_ids, draft_token_ids)
        prepared = self._prepared.popleft()
        assert prepared.out is pending
        # Async + spec decode: the scheduled drafts are -1s the worker fills;
        # teacher forced, they are the trace's accepted tokens (the rest: the runner's filler).
        drafts_in = {rid: list(t[:-1]) for rid, t in sampled_token_ids.items()} if self.runner.async_spec else None
        result = self.runner.run(prepared, keep_logits=True, drafts=drafts_in)
        outputs = self._apply(pending, sampled_token_ids, draft_token_ids)
        # the trace's tokens decide the drafts rejected (async + spec: later steps' positions)
        self.runner.commit(result, [list(sampled_token_ids.get(e[0].req_id, ())) for e in pending.entries])
        for index, req in enumerate(e[0] for e in pending.entries):
            rows = result.logits.get(index)
            if rows is None:
                continue
            kept = self._positions.setdefault(req, {})
            seg = result.segments[index]  # positions as run (async + spec: moved back over rejected drafts)
            ntok, drafts = seg.num_tokens, seg.drafts
            tokens = req.tokens
            for i in range(rows.shape[0]):
                # position ntok-1+i had a valid context iff its tokens (placeholders
                # included) are the sequence's and drafts 1..i are too
                if ntok + i - 1 >= len(tokens) or (i > 0 and tokens[ntok + i - 1] != drafts[i - 1]):
                    break
                kept[ntok - 1 + i] = rows[i]
        for out in outputs:
            if out["finish_reason"] is not None:
                req = next(e[0] for e in pending.entries if e[0].req_id == out["req_id"])
                self._verify(req)
        return outputs

    def _keep_v0(self, pending: V0StepOutput, result: Any, outputs: list[dict[str, Any]]) -> None:
        """Keep each sampled position's logits (the token appended is the trace's); verify finished requests."""
        for index, row in result.logits.items():
            req = pending.entries[index][0]
            if req.finish_reason == "abort":
                continue
            # the sampled position is the last one before this update appended the trace's token
            self._positions.setdefault(req, {})[len(req.tokens) - 2] = row
        by_id = {e[0].req_id: e[0] for e in pending.entries}
        for out in outputs:
            req = by_id.get(out["req_id"])  # ignored groups end without being scheduled
            if out["finish_reason"] is not None and req is not None:
                self._verify(req)

    def _verify(self, req: Any) -> None:
        """Check the kept logits of one finished request against the dense forward."""
        from schedconf.impl.dense import dense_logits
        from schedconf.impl.sampling import TIE_EPS, NearTie

        kept = self._positions.pop(req, None)
        if not kept:
            return
        dense = dense_logits(self.model, req.tokens)
        tie_eps = TIE_EPS.get(self.model.dtype, 1e-3)
        for pos, row in sorted(kept.items()):
            ref = dense[pos]
            diff = float((row - ref).abs().max())
            self.max_abs_diff = max(self.max_abs_diff, diff)
            self.num_checked_positions += 1
            top = ref.topk(2)
            margin = float(top.values[0] - top.values[1])
            if diff > (self.tolerance or 0.0):
                raise EngineMismatch(
                    f"request {req.req_id!r} position {pos}: engine logits differ from the dense "
                    f"forward by {diff:.3g} (tolerance {self.tolerance:g})"
                )
            if int(row.argmax()) != int(ref.argmax()):
                if margin >= tie_eps:
                    raise EngineMismatch(
                        f"request {req.req_id!r} position {pos}: greedy token {int(row.argmax())} "
                        f"!= dense {int(ref.argmax())} with margin {margin:.3g}"
                    )
            if margin < tie_eps:
                self.near_ties.append(
                    NearTie(req.req_id, pos - req.num_prompt + 1, int(ref.argmax()), int(top.indices[1]), margin)
                )

    def close(self) -> None:
        """Check what is left of unfinished requests; a mismatch is kept in ``failures``, not raised."""
        for req in list(self._positions):
            try:
                self._verify(req)
            except EngineMismatch as exc:
                self.failures.append(str(exc))
        super().close()


def make_engine_sut() -> ImplEngineSut:
    """Factory for ``--sut impl-engine`` (and ``module:schedconf.conformance.adapters.impl:make_engine_sut``)."""
    return ImplEngineSut()
