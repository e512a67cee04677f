"""Delta debugging of failing traces: the smallest trace with the same kind of divergence.

Works on any trace, ours or not: the trace is turned back into a workload
(``workload_from_trace``: arrivals and aborts at their steps, the model's
tokens as a recorded oracle), the workload is made smaller one reduction at a
time, and each candidate is re-run on the reference (which recomputes every
expected output) and replayed on the scheduler under test. A candidate is kept
when its first divergence is of the same kind as the original's: the same
``Divergence.section()`` (the divergence kind and the top-level field that
tells it, e.g. ``scheduler_output:preempted_req_ids``). The trace is finally cut right after its first divergence.

Reductions, tried until none helps: drop requests (halves first, then one by
one), drop aborts and invalid inputs, bring arrivals earlier, shorten prompts,
lower ``max_tokens``, shrink the pool, the budget, ``max_num_seqs``,
``max_model_len``, the spec-decode and lookahead sizes, and turn optional
features off (threshold, priorities, stop tokens, ``min_tokens``). A v0
trace (``"scheduler": "v0"``) gets the v0 machine's reductions
(``schedconf.conformance.workloads.workload_v0.get_v0_config_candidates``: the GPU and CPU pools,
the budgets, partial prefills, chunking, prefix caching, the preemption mode).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from schedconf.conformance.checking.compare import Divergence
from schedconf.conformance.checking.replay import FAIL, ReplayDeadline, replay
from schedconf.conformance.sut import SchedulerUnderTest
from schedconf.conformance.traces.trace import Trace
from schedconf.conformance.workloads.workload import (
    RequestSpec,
    Workload,
    WorkloadError,
    run_workload,
    workload_from_trace,
)
from schedconf.spec.errors import SpecError
from schedconf.spec.v1.config import OPTIONAL_FIELDS, SchedulerConfig, cdiv


@dataclass
class ShrinkResult:
    """The smallest failing trace found, and how the search went."""

    trace: Trace
    divergence: Divergence
    original_events: int
    attempts: int
    accepted: int
    seconds: float

    @property
    def num_events(self) -> int:
        return len(self.trace.events)


class NothingToShrink(ValueError):
    """The trace does not fail (``verdict`` pass or unknown), or did not replay once within the budget (None)."""

    def __init__(self, message: str, verdict: str | None) -> None:
        super().__init__(message)
        self.verdict = verdict


class ShrinkInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM (``cause``) during a shrink; ``partial`` is the smallest failing trace found so far.

    That trace (at least the original, cut after its first divergence) fails
    as the original does but is not minimal: its header says so (``origin``
    ``shrink-partial`` and a description).
    """

    def __init__(self, partial: ShrinkResult, cause: KeyboardInterrupt) -> None:
        super().__init__(str(cause))
        self.partial = partial
        self.cause = cause


def cut_after_divergence(trace: Trace, divergence: Divergence) -> Trace:
    """Keep the events up to and including the divergent one."""
    return Trace(header=dict(trace.header), events=trace.events[: divergence.event_index + 1], path=trace.path)


Probe = Callable[[Workload], "tuple[Trace, Divergence] | None"]
"""Runs a workload; returns the (cut) failing trace and its divergence, or None."""


def differential_probe(
    sut: SchedulerUnderTest,
    comparison: str,
    section: str,
    step_timeout: float | None = None,
    deadline: float | None = None,
) -> Probe:
    """Fails when the SUT's first divergence on the workload's trace has ``section``.

    A replay still running at ``deadline`` is cut short (``ReplayDeadline``
    propagates to the shrinker, which stops with what it has).
    """

    def probe(workload: Workload) -> tuple[Trace, Divergence] | None:
        try:
            trace = run_workload(workload, max_steps=2_000)
        except (SpecError, WorkloadError, AssertionError, ValueError):
            return None  # not a valid workload for the reference
        result = replay(trace, sut, comparison, step_timeout=step_timeout, deadline=deadline)
        if result.verdict != FAIL or result.divergence is None or result.divergence.section() != section:
            return None
        return cut_after_divergence(trace, result.divergence), result.divergence

    return probe


class Shrinker:
    """Greedy reduction of a workload while a probe keeps failing."""

    def __init__(
        self, probe: Probe, time_budget_s: float = 120.0, on_progress: Callable[[str], None] | None = None
    ) -> None:
        self.probe = probe
        self.deadline = time.monotonic() + time_budget_s
        self.on_progress = on_progress
        self.attempts = 0
        self.accepted = 0
        self.best: tuple[Trace, Divergence] | None = None
        self.timed_out = False

    def check(self, workload: Workload) -> tuple[Trace, Divergence] | None:
        """Run the probe on ``workload`` (None, and out of time, if the deadline cut it short)."""
        self.attempts += 1
        try:
            return self.probe(workload)
        except ReplayDeadline:
            self.timed_out = True
            return None

    def out_of_time(self) -> bool:
        return self.timed_out or time.monotonic() > self.deadline

    def run(self, workload: Workload) -> Workload:
        """Reduce ``workload`` until no reduction keeps the failure (or time runs out).

        One reduction at a time; when none helps, pairs of reductions are tried
        (a request may matter only together with the pool that makes it preempt).
        """
        found = self.check(workload)
        if found is None:
            if self.timed_out:
                raise ValueError("the time budget ran out before the trace replayed once")
            raise ValueError("the trace does not fail with the expected divergence before shrinking")
        self.best = found
        while not self.out_of_time():
            better = self._step(workload) or self._pair_step(workload)
            if better is None:
                break
            workload = better
        return workload

    def _accept(self, candidate: Workload) -> bool:
        found = self.check(candidate)
        if found is None or (self.best is not None and len(found[0].events) > len(self.best[0].events)):
            return False
        self.best = found
        self.accepted += 1
        if self.on_progress:
            self.on_progress(f"shrink: {len(found[0].events)} events")
        return True

    def _step(self, workload: Workload) -> Workload | None:
        for candidate in _candidates(workload):
            if self.out_of_time():
                return None
            if self._accept(candidate):
                return candidate
        return None

    def _pair_step(self, workload: Workload) -> Workload | None:
        for first in _candidates(workload):
            for candidate in _candidates(first):
                if self.out_of_time():
                    return None
                if self._accept(candidate):
                    return candidate
        return None


def shrink_workload(
    workload: Workload, probe: Probe, time_budget_s: float = 60.0, on_progress: Callable[[str], None] | None = None
) -> ShrinkResult:
    """Shrink a failing workload under any probe (differential or invariant)."""
    t0 = time.monotonic()
    shrinker = Shrinker(probe, time_budget_s, on_progress)
    shrinker.run(workload)
    assert shrinker.best is not None
    trace, divergence = shrinker.best
    trace.header["origin"] = "shrink"
    return ShrinkResult(
        trace=trace,
        divergence=divergence,
        original_events=-1,
        attempts=shrinker.attempts,
        accepted=shrinker.accepted,
        seconds=time.monotonic() - t0,
    )


def shrink_trace(
    trace: Trace,
    sut: SchedulerUnderTest,
    comparison: str = "strict",
    step_timeout: float | None = None,
    time_budget_s: float = 120.0,
    on_progress: Callable[[str], None] | None = None,
) -> ShrinkResult:
    """Shrink a failing trace against ``sut`` (see the module docstring)."""
    t0 = time.monotonic()
    deadline = t0 + time_budget_s
    try:
        original = replay(trace, sut, comparison, step_timeout=step_timeout, deadline=deadline)
    except ReplayDeadline:
        raise NothingToShrink(
            f"the time budget ({time_budget_s:g} s) ran out before the trace replayed once", None
        ) from None
    if original.verdict != FAIL or original.divergence is None:
        detail = f" ({original.detail})" if original.detail else ""
        raise NothingToShrink(f"the trace's verdict is {original.verdict}{detail}", original.verdict)
    if "expect_error" in trace.header:  # a refused config: the header alone is already minimal
        return ShrinkResult(
            trace=trace,
            divergence=original.divergence,
            original_events=0,
            attempts=0,
            accepted=0,
            seconds=time.monotonic() - t0,
        )
    probe = differential_probe(sut, comparison, original.divergence.section(), step_timeout, deadline)
    shrinker = Shrinker(probe, time_budget_s - (time.monotonic() - t0), on_progress)
    workload = workload_from_trace(trace)
    try:
        shrinker.run(workload)
        best_trace, best_div = shrinker.best  # type: ignore[misc]
    except KeyboardInterrupt as exc:
        raise ShrinkInterrupted(_get_partial(trace, original.divergence, shrinker, t0), exc) from None
    except ValueError:
        # The trace cannot be regenerated faithfully (e.g. made by another
        # tool with inputs the reference refuses); keep it, cut.
        best_trace, best_div = cut_after_divergence(trace, original.divergence), original.divergence
    if len(best_trace.events) > original.divergence.event_index + 1:
        best_trace, best_div = cut_after_divergence(trace, original.divergence), original.divergence
    best_trace.header["origin"] = "shrink"
    return ShrinkResult(
        trace=best_trace,
        divergence=best_div,
        original_events=len(trace.events),
        attempts=shrinker.attempts,
        accepted=shrinker.accepted,
        seconds=time.monotonic() - t0,
    )


def _get_partial(trace: Trace, divergence: Divergence, shrinker: Shrinker, t0: float) -> ShrinkResult:
    """The smallest failing trace an interrupted shrink had found (the cut original if none), marked not minimal."""
    best_trace, best_div = shrinker.best or (cut_after_divergence(trace, divergence), divergence)
    if len(best_trace.events) > divergence.event_index + 1:
        best_trace, best_div = cut_after_divergence(trace, divergence), divergence
    best_trace.header["origin"] = "shrink-partial"
    best_trace.header["description"] = (
        "the smallest failing trace found before the shrink was interrupted; not minimal: shrink it again to finish"
    )
    return ShrinkResult(
        trace=best_trace,
        divergence=best_div,
        original_events=len(trace.events),
        attempts=shrinker.attempts,
        accepted=shrinker.accepted,
        seconds=time.monotonic() - t0,
    )


# ------------------------------------------------------------- reductions


def _valid_config(**fields: object) -> SchedulerConfig | None:
    """The config, or None when the model refuses it or it is past schedconf's bounds (``schedconf.conformance.bounds``)."""
    from schedconf.conformance.bounds import check_config_bounds

    if check_config_bounds(fields) is not None:
        return None
    try:
        return SchedulerConfig(**fields)  # type: ignore[arg-type]
    except SpecError:
        return None


def _candidates(w: Workload) -> Iterator[Workload]:
    """Smaller variants of ``w``, most promising (biggest cuts) first."""
    reqs = list(w.requests)
    # Drop requests: halves, then one at a time (their aborts go with them).
    n = len(reqs)
    chunk = n // 2
    while chunk >= 1:
        for start in range(0, n, chunk):
            keep = reqs[:start] + reqs[start + chunk :]
            if keep:
                yield _with_requests(w, keep)
        chunk //= 2
    for i in range(len(w.aborts)):
        yield replace(w, aborts=w.aborts[:i] + w.aborts[i + 1 :])
    for i in range(len(w.invalid_inputs)):
        yield replace(w, invalid_inputs=w.invalid_inputs[:i] + w.invalid_inputs[i + 1 :])
    for i in range(len(w.resets)):
        yield replace(w, resets=w.resets[:i] + w.resets[i + 1 :])
    # Earlier arrivals (fewer idle steps before an input).
    for i, r in enumerate(reqs):
        if r.at_step > 0:
            for at in (0, r.at_step // 2, r.at_step - 1):
                yield _with_request(w, i, replace(r, at_step=at))
    # Shorter prompts and outputs.
    for i, r in enumerate(reqs):
        p = r.prompt_token_ids
        for length in _smaller(len(p)):
            yield _with_request(w, i, replace(r, prompt_token_ids=p[:length]))
        for mt in _smaller(r.max_tokens):
            yield _with_request(w, i, replace(r, max_tokens=mt, min_tokens=min(r.min_tokens, mt)))
        if r.stop_token_ids:
            yield _with_request(w, i, replace(r, stop_token_ids=()))
        if r.min_tokens:
            yield _with_request(w, i, replace(r, min_tokens=0))
        if r.priority:
            yield _with_request(w, i, replace(r, priority=0))
        if r.ignore_eos:
            yield _with_request(w, i, replace(r, ignore_eos=False))
    # A smaller machine.
    if not isinstance(w.config, SchedulerConfig):  # the v0 scheduler's config
        from schedconf.conformance.workloads.workload_v0 import get_v0_config_candidates

        yield from get_v0_config_candidates(w)
        return
    cfg = w.config.to_dict()
    longest = max((len(r.prompt_token_ids) for r in reqs), default=1)
    tweaks: list[dict[str, object]] = []
    min_blocks = cdiv(cfg["max_model_len"], cfg["block_size"]) + 1
    for nb in sorted({min_blocks, (cfg["num_gpu_blocks"] + min_blocks) // 2, cfg["num_gpu_blocks"] - 1}):
        if min_blocks <= nb < cfg["num_gpu_blocks"]:
            tweaks.append({"num_gpu_blocks": nb})
    for mml in sorted({longest + 1, (cfg["max_model_len"] + longest + 1) // 2, cfg["max_model_len"] - 1}):
        if longest + 1 <= mml < cfg["max_model_len"]:
            tweaks.append({"max_model_len": mml})
    for budget in sorted({1, cfg["max_num_batched_tokens"] // 2, cfg["max_num_batched_tokens"] - 1}):
        if 0 < budget < cfg["max_num_batched_tokens"]:
            tweaks.append({"max_num_batched_tokens": budget})
    for seqs in sorted({1, cfg["max_num_seqs"] - 1}):
        if 0 < seqs < cfg["max_num_seqs"]:
            tweaks.append({"max_num_seqs": seqs})
    for key in ("num_spec_tokens", "num_lookahead_tokens", "long_prefill_token_threshold"):
        if cfg[key]:
            tweaks.append({key: 0})
    if cfg["policy"] == "priority":
        tweaks.append({"policy": "fcfs"})
    if cfg["enable_prefix_caching"]:
        tweaks.append({"enable_prefix_caching": False})
    if cfg["scheduler_reserve_full_isl"] is not None:
        tweaks.append({"scheduler_reserve_full_isl": None})
    # Fewer steps in flight, and the optional knobs back at their defaults.
    if cfg.get("max_concurrent_batches", 1) > 1:
        tweaks.append({"max_concurrent_batches": cfg["max_concurrent_batches"] - 1})
    for key, default in OPTIONAL_FIELDS.items():
        if key != "max_concurrent_batches" and cfg.get(key, default) != default:
            tweaks.append({key: default})
    for bs in (1, 2, 4):
        if bs < cfg["block_size"]:
            # Same capacity in smaller blocks: fewer tokens reach a boundary.
            capacity = (cfg["num_gpu_blocks"] - 1) * cfg["block_size"]
            tweaks.append({"block_size": bs, "num_gpu_blocks": cdiv(capacity, bs) + 1})
    for tweak in tweaks:
        new = _valid_config(**{**cfg, **tweak})
        if new is not None:
            yield replace(w, config=new)


def _smaller(n: int) -> list[int]:
    """Smaller positive values to try for a size ``n``: every one when small, else a few."""
    if n <= 12:
        return list(range(1, n))
    return sorted({1, 2, n // 4, n // 2, (3 * n) // 4, n - 1})


def _with_requests(w: Workload, keep: list[RequestSpec]) -> Workload:
    ids = {r.request_id for r in keep}
    return replace(w, requests=tuple(keep), aborts=tuple(a for a in w.aborts if a.request_id in ids))


def _with_request(w: Workload, index: int, new: RequestSpec) -> Workload:
    reqs = list(w.requests)
    reqs[index] = new
    return replace(w, requests=tuple(reqs))
