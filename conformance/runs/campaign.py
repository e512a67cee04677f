"""Campaigns: generate many workloads, replay each against a SUT, shrink every failure.

A campaign is deterministic given its seed: the workloads are drawn first (by
the Hypothesis strategy, or by the seeded PRNG generator), then replayed,
in parallel with ``jobs`` worker processes, each holding its own SUT. Every
failing trace is saved, then shrunk (distinct kinds of divergence first)
within a time budget. Everything lands in ``reports/<run-id>/``:
``summary.json`` (rewritten atomically as the run goes, so a crash or Ctrl-C
leaves a valid one), ``summary.md``, ``report.html``, ``failures/`` (original
and minimal traces) and, on request, a JUnit XML file.

A campaign of a v0 profile (``vllm-0.10``, vLLM's legacy scheduler) draws v0
workloads (``conformance/workloads/workload_v0.py``) and its summary states the v0
coverage shares (``coverage``: swap-out, swap-in, recompute, ignored, partial
prefills, prefix hits; zeros included), in ``summary.json`` and ``summary.md``.
"""

# Size: a campaign is one loop (generate, check, shrink, record, report progress, stop cleanly on a
# signal) whose parts share the run folder's state; the checking itself lives in checking/.

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from schedconf.conformance.checking.replay import FAIL, PASS, UNKNOWN, ReplayResult, render_divergence, replay
from schedconf.conformance.traces.trace import Trace, parse_trace_text, render_trace, write_atomic
from schedconf.conformance.workloads.workload import RefusedConfigWorkload, Workload, WorkloadError, run_workload


@dataclass
class CampaignSpec:
    """What to run."""

    sut: str
    profile: str = "vllm-0.33"
    examples: int = 100
    seed: int = 0
    jobs: int = 1
    comparison: str = "strict"
    generator: str = "random"
    step_timeout: float | None = 30.0
    shrink_budget_s: float = 60.0
    out_dir: str = "reports"
    run_id: str | None = None
    junit_xml: str | None = None
    quiet: bool = False
    config_overrides: dict[str, Any] = field(default_factory=dict)
    """Config fields forced in every generated workload (e.g. enable_prefix_caching=False)."""
    prefix_cache_resets: bool = True
    """Keep the generator's ``reset_prefix_cache`` events (off for schedulers without them)."""
    pool_headroom_blocks: int = 0
    """KV blocks added to every generated pool, for a scheduler that keeps some of its pool back
    (its adapter's ``pool_headroom_blocks``): the generator's tight pools, sized to the rules of
    vLLM, would otherwise make most of its traces *unknown*."""

    def __post_init__(self) -> None:
        problems = get_spec_problems(self)
        if problems:
            raise ValueError("; ".join(problems))


def get_spec_problems(spec: CampaignSpec) -> list[str]:
    """What is wrong with a campaign's numbers (a campaign of 0 traces must never pass)."""
    problems = []
    if spec.examples < 1:
        problems.append(f"examples must be at least 1, got {spec.examples}")
    if spec.jobs < 1:
        problems.append(f"jobs must be at least 1, got {spec.jobs}")
    if spec.step_timeout is not None and not spec.step_timeout > 0:
        problems.append(f"step_timeout must be a positive number of seconds, got {spec.step_timeout}")
    if not spec.shrink_budget_s >= 0:
        problems.append(f"shrink_budget_s must be 0 or more seconds, got {spec.shrink_budget_s}")
    return problems


class RunFolderError(Exception):
    """The run folder cannot be made (``--out`` is a file or not writable, or ``--run-id`` is taken)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM: handled like Ctrl-C (a valid report, children killed), with exit code 143."""


@dataclass
class TraceOutcome:
    """One trace's result, small enough to send between processes."""

    index: int
    verdict: str
    steps: int
    events: int
    trace_text: str = ""
    divergence: dict[str, Any] | None = None
    report: str = ""
    features: list[str] = field(default_factory=list)


# ------------------------------------------------------------ generation


def get_pool_headroom(sut: Any) -> int:
    """The KV blocks a scheduler keeps back from its pool (its adapter's ``pool_headroom_blocks``, else 0)."""
    return int(getattr(sut, "pool_headroom_blocks", 0) or 0)


def get_forced_for_protocol_level(probe: Any, spec: CampaignSpec) -> dict[str, Any]:
    """Config the campaign must force for what the SUT can run (v1 profiles only).

    A scheduler that does not declare ``in_flight`` was written against the
    protocol before steps in flight, the 0.32 knobs and resets existed: it gets
    none of them (all optional config fields at their defaults; the resets are
    dropped by the caller). The safety comparison runs one step at a time.
    """
    from schedconf.conformance.workloads.workload import is_v0_profile
    from schedconf.spec.v1.config import OPTIONAL_FIELDS

    if is_v0_profile(spec.profile):
        return {}
    forced: dict[str, Any] = {}
    if not getattr(probe, "in_flight", False):
        forced.update(OPTIONAL_FIELDS)
    if spec.comparison == "safety":
        forced["max_concurrent_batches"] = 1
    if spec.profile.endswith("-async"):
        forced.pop("max_concurrent_batches", None)  # an async profile runs steps in flight by definition
    return forced


def fit_spec_to_sut(spec: CampaignSpec, probe: Any) -> tuple[CampaignSpec, list[str]]:
    """The campaign ``spec`` for what the SUT ``probe`` can run, and a line saying each change.

    Its adapter's ``forced_config`` and the protocol level's defaults become
    config overrides (explicit ``--set`` values win), its ``pool_headroom_blocks``
    the pools' headroom, and a SUT without steps in flight gets no prefix-cache
    resets. ``schedconf run`` and the pytest plugin draw their traces this way.
    """
    notes: list[str] = []
    forced = dict(getattr(probe, "forced_config", {}) or {})
    forced.update(get_forced_for_protocol_level(probe, spec))
    if not getattr(probe, "in_flight", False) and spec.prefix_cache_resets:
        spec = replace(spec, prefix_cache_resets=False)
    headroom = get_pool_headroom(probe)
    if headroom > spec.pool_headroom_blocks:
        spec = replace(spec, pool_headroom_blocks=headroom)
        notes.append(f"the SUT keeps {headroom} KV block(s) of its pool back: generated pools get {headroom} more")
    if forced:
        # The SUT cannot express these config values at all (e.g. vLLM has no
        # free lookahead knob): generate traces without them rather than
        # collect "unknown" verdicts.
        spec = replace(spec, config_overrides={**forced, **spec.config_overrides})
        notes.append(f"the SUT forces config {forced} in generated traces")
    return spec, notes


def generate_workload(spec: CampaignSpec, index: int) -> Workload | RefusedConfigWorkload:
    """The ``index``-th workload of a random-generator campaign, drawn alone (the pytest plugin's items).

    As :func:`generate_workloads` draws it, but for a draw that the overrides
    make invalid: it is replaced from a stream of its own index rather than
    from the campaign's shared one.
    """
    from schedconf.conformance.workloads.workload_v0 import make_random_workload
    from schedconf.spec.errors import InvalidConfig

    example = spec.seed * 1_000_003 + index
    workload = make_random_workload(example, spec.profile)
    for attempt in range(1, 101):
        try:
            workload = _with_overrides(spec, workload)
            break
        except InvalidConfig:
            fresh = make_random_workload(example * 101 + 10_000_000 + attempt, spec.profile)
            workload = fresh.replace(seed=workload.seed, origin=workload.origin)
    else:
        raise ValueError(f"no draw of trace {index} is valid under the forced config {spec.config_overrides}")
    (workload,) = _add_pool_headroom(spec, [workload])
    return _finish_workload(spec, index, workload)


def generate_workloads(spec: CampaignSpec) -> list[Workload | RefusedConfigWorkload]:
    """Draw ``spec.examples`` workloads, deterministically from ``spec.seed``.

    Config overrides are applied to each; a workload whose overridden config
    is invalid (e.g. chunking off with a small budget) is replaced by the
    next draw of the seeded generator. Then a share of them, all but the
    first (the report's sample trace), becomes their config one step past a
    start-up limit, the overrides still in force (``conformance/workloads/generate.py``
    ``choose_refused_config``: a stream of the example's seed of its own, so
    the other workloads stay as they were).
    """
    drawn = _add_pool_headroom(spec, _apply_overrides(spec, _draw(spec)))
    return [_finish_workload(spec, i, w) for i, w in enumerate(drawn)]


def _finish_workload(spec: CampaignSpec, index: int, workload: Workload) -> Workload | RefusedConfigWorkload:
    """The last two steps of a draw: trace ``index`` (all but the first) may become a refused config, and the
    resets go where the SUT or the comparison has none."""
    from schedconf.conformance.workloads.generate import choose_refused_config

    chosen = (
        choose_refused_config(spec.seed * 1_000_003 + index, workload, spec.config_overrides) if index else workload
    )
    if (spec.comparison == "safety" or not spec.prefix_cache_resets) and isinstance(chosen, Workload) and chosen.resets:
        # The safety comparison drives one step at a time and has no prefix-cache
        # reset (a reset is a vLLM API, not a rule every scheduler shares).
        chosen = chosen.replace(resets=())
    return chosen


def _with_overrides(spec: CampaignSpec, workload: Workload) -> Workload:
    """``workload`` with ``spec.config_overrides`` in force; InvalidConfig if the model or the release refuses it."""
    if not spec.config_overrides:
        return workload
    from dataclasses import replace as dc_replace

    from schedconf.spec.v1.profiles import PROFILES, check_config_for_profile

    config = dc_replace(workload.config, **spec.config_overrides)
    if spec.profile in PROFILES:  # the release's own start-up refusals too
        check_config_for_profile(config, PROFILES[spec.profile])
    return workload.replace(config=config)


def _apply_overrides(spec: CampaignSpec, drawn: list[Workload]) -> list[Workload]:
    """``spec.config_overrides`` on each workload; an invalid result is replaced by a fresh draw."""
    if not spec.config_overrides:
        return drawn
    from schedconf.conformance.workloads.workload_v0 import make_random_workload
    from schedconf.spec.errors import InvalidConfig

    out: list[Workload] = []
    extra = 0
    for w in drawn:
        while True:
            try:
                out.append(_with_overrides(spec, w))
                break
            except InvalidConfig:
                extra += 1
                if extra > 100 * spec.examples + 100:
                    raise
                w = make_random_workload(spec.seed * 1_000_003 + 10_000_000 + extra, spec.profile).replace(
                    seed=w.seed, origin=w.origin
                )
    return out


def _add_pool_headroom(spec: CampaignSpec, drawn: list[Workload]) -> list[Workload]:
    """``spec.pool_headroom_blocks`` more blocks in each workload's pool (where the config stays valid)."""
    if spec.pool_headroom_blocks <= 0:
        return drawn
    from dataclasses import replace as dc_replace

    from schedconf.spec.errors import InvalidConfig

    out: list[Workload] = []
    for w in drawn:
        if "num_gpu_blocks" in spec.config_overrides or not hasattr(w.config, "num_gpu_blocks"):
            out.append(w)  # a pool size the user forced stays as forced
            continue
        try:
            out.append(
                w.replace(
                    config=dc_replace(w.config, num_gpu_blocks=w.config.num_gpu_blocks + spec.pool_headroom_blocks)
                )
            )
        except InvalidConfig:
            out.append(w)
    return out


def _draw(spec: CampaignSpec) -> list[Workload]:
    from schedconf.conformance.workloads.workload_v0 import make_random_workload, make_workload_strategy

    if spec.generator == "random":
        return [make_random_workload(spec.seed * 1_000_003 + i, spec.profile) for i in range(spec.examples)]
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    drawn: list[Workload] = []

    @hypothesis_seed(spec.seed)
    @settings(
        max_examples=spec.examples,
        phases=[Phase.generate],
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=False,
    )
    @given(make_workload_strategy(spec.profile))
    def draw(workload: Workload) -> None:
        drawn.append(workload)

    draw()
    # Hypothesis may stop short of max_examples; top up from the PRNG generator.
    if len(drawn) < spec.examples:
        drawn.extend(
            make_random_workload(spec.seed * 1_000_003 + i, spec.profile) for i in range(len(drawn), spec.examples)
        )
    return [w.replace(seed=spec.seed, origin=f"{spec.generator}#{i}") for i, w in enumerate(drawn)]


# ---------------------------------------------------------------- workers

_WORKER: dict[str, Any] = {}


def _init_worker(spec: CampaignSpec) -> None:
    from schedconf.conformance.adapters import make_sut

    _WORKER["spec"] = spec
    _WORKER.pop("prefetched", None)
    _WORKER["sut"] = make_sut(spec.sut)


def _init_worker_process(spec: CampaignSpec) -> None:
    """A worker process: the parent handles Ctrl-C; SIGTERM and exit close the worker's SUT first."""
    import multiprocessing.util

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_worker)
    _init_worker(spec)
    multiprocessing.util.Finalize(None, _leave_worker_process, exitpriority=100)


def _close_worker_sut() -> None:
    sut = _WORKER.pop("sut", None)
    if sut is not None:
        try:
            sut.close()
        except Exception:  # noqa: BLE001 - closing must not mask the run's result
            pass


def _leave_worker_process() -> None:
    """A worker's last act: close its SUT and kill any scheduler process it started."""
    from schedconf.conformance.adapters.stdio import kill_all_started

    _close_worker_sut()
    kill_all_started()


def _exit_worker(signum: int, frame: Any) -> None:  # noqa: ARG001
    _leave_worker_process()
    os._exit(128 + signum)


def get_campaign_features(trace: Trace) -> list[str]:
    """What a campaign counts for a trace: :func:`features_of`, and ``refused_config`` for a config refused at start."""
    return ["refused_config"] if "expect_error" in trace.header else features_of(trace)


def features_of(trace: Trace) -> list[str]:
    """The hard cases a trace reaches (for coverage shares in the summary).

    A v0 trace: :func:`schedconf.conformance.workloads.workload_v0.get_v0_features`. A config
    refused at start (the header's ``expect_error``) reaches none
    (:func:`get_campaign_features` counts it as ``refused_config``).
    """
    if trace.scheduler == "v0":
        from schedconf.conformance.workloads.workload_v0 import get_v0_features

        return get_v0_features(trace)
    out = set()
    cfg = trace.config
    for e in trace.events:
        if "expect_error" in e:
            out.add("invalid_input")
        if e["kind"] == "abort" and "expect_error" not in e:
            out.add("abort")
        if e["kind"] == "reset_prefix_cache" and "expect" in e:
            out.add("prefix_cache_reset" if e["expect"]["success"] else "prefix_cache_reset_refused")
            if e["reset_running_requests"]:
                out.add("prefix_cache_reset_running")
        if e["kind"] != "step" or "expect" not in e:
            continue
        x = e["expect"]
        if x["preempted_req_ids"]:
            out.add("preemption")
        if any(r["num_computed_tokens"] for r in x["scheduled_new_reqs"]):
            out.add("prefix_hit")
        if x["total_num_scheduled_tokens"] == cfg["max_num_batched_tokens"]:
            out.add("budget_exhausted")
        if x["scheduled_spec_decode_tokens"]:
            out.add("spec_decode")
        if any(c["resumed"] for c in x["scheduled_cached_reqs"]):
            out.add("resume")
    if trace.is_in_flight:
        out |= get_in_flight_features(trace)
    return sorted(out)


def get_in_flight_features(trace: Trace) -> set[str]:
    """The in-flight cases a trace reaches, read from its events alone.

    ``steps_in_flight``: a step scheduled before an older one's output;
    ``scheduled_in_flight``: a request scheduled again while a step of it is
    in flight (a placeholder decode, or the next prefill chunk);
    ``preempted_in_flight``: preempted with a step of it in flight;
    ``stale_output``: tokens delivered to a request preempted after the step
    that produced them; ``aborted_in_flight``: aborted with a step of it in
    flight; ``finished_in_flight``: stopped by one step's output while a later
    step of it is in flight; ``drafts_in_flight``: drafts scheduled for a
    request while a step of it is in flight (AsyncScheduler's placeholder
    drafts on top of pending placeholders); ``drafts_rejected_in_flight``: an
    output rejecting drafts of a request that a later step in flight has
    already counted on.
    """
    out: set[str] = set()
    in_flight: dict[int, set[str]] = {}
    num_drafts: dict[int, dict[str, int]] = {}  # step -> request -> drafts scheduled
    preempted_at: dict[str, int] = {}
    for e in trace.events:
        if "expect_error" in e:
            continue
        kind = e["kind"]
        older = set().union(*in_flight.values()) if in_flight else set()
        if kind == "step" and "expect" in e:
            x = e["expect"]
            scheduled = set(x["num_scheduled_tokens"])
            if in_flight:
                out.add("steps_in_flight")
            if scheduled & older:
                out.add("scheduled_in_flight")
            num_drafts[e["step"]] = {r: len(d) for r, d in x["scheduled_spec_decode_tokens"].items()}
            if set(num_drafts[e["step"]]) & older:
                out.add("drafts_in_flight")
            for rid in x["preempted_req_ids"] or ():
                preempted_at[rid] = e["step"]
                if rid in older:
                    out.add("preempted_in_flight")
            in_flight[e["step"]] = scheduled
        elif kind == "abort" and e["request_id"] in older:
            out.add("aborted_in_flight")
        elif kind == "model_output":
            in_flight.pop(e["step"], None)
            later = set().union(*in_flight.values()) if in_flight else set()
            for rid, tokens in e["sampled_token_ids"].items():
                if tokens and len(tokens) - 1 < num_drafts.get(e["step"], {}).get(rid, 0) and rid in later:
                    out.add("drafts_rejected_in_flight")
            for o in e.get("expect", {}).get("outputs", ()):
                if preempted_at.get(o["req_id"], 0) > e["step"] and o["new_token_ids"]:
                    out.add("stale_output")
                if o["finish_reason"] in ("stop", "length") and o["req_id"] in later:
                    out.add("finished_in_flight")
    return out


def _generate(index: int, workload: Workload | RefusedConfigWorkload) -> Trace | WorkloadError:
    """The trace of one workload (the reference's expected outputs), or why the reference discards it."""
    try:
        trace = run_workload(workload)
    except WorkloadError as exc:
        return exc
    trace.path = f"trace-{index}"
    return trace


def run_one(
    index: int,
    workload: Workload | RefusedConfigWorkload,
    next_item: tuple[int, Workload | RefusedConfigWorkload] | None = None,
) -> TraceOutcome:
    """Generate one trace with the reference and replay it on the worker's SUT.

    With ``next_item`` (the trace this worker replays next), a scheduler that takes the trace as one
    ``batch`` runs it while this process generates the next one (PROTOCOL.md): the harness's work and
    the scheduler's overlap. An error while generating is raised when that trace's turn comes, as it
    would be without the overlap.
    """
    spec: CampaignSpec = _WORKER["spec"]
    sut = _WORKER["sut"]
    prefetched = _WORKER.pop("prefetched", None)
    if prefetched is not None and prefetched[0] == index and prefetched[1] is workload:
        generated = prefetched[2]
        if isinstance(generated, BaseException) and not isinstance(generated, WorkloadError):
            raise generated
    else:
        generated = _generate(index, workload)
    if isinstance(generated, WorkloadError):
        return TraceOutcome(index=index, verdict="discarded", steps=0, events=0, report=str(generated))
    trace = generated

    def generate_next() -> None:
        assert next_item is not None
        try:
            _WORKER["prefetched"] = (*next_item, _generate(*next_item))
        except Exception as exc:  # noqa: BLE001 - a harness error, raised at that trace's turn
            _WORKER["prefetched"] = (*next_item, exc)

    result: ReplayResult = replay(
        trace,
        sut,
        spec.comparison,
        step_timeout=spec.step_timeout,
        while_running=generate_next if next_item is not None else None,
    )
    outcome = TraceOutcome(
        index=index,
        verdict=result.verdict,
        steps=trace.num_steps(),
        events=len(trace.events),
        features=get_campaign_features(trace),
    )
    if result.verdict != PASS or index == 0:
        outcome.trace_text = render_trace(trace)  # failures, and one sample for the report
        outcome.divergence = result.divergence.to_dict() if result.divergence else None
        try:
            outcome.report = render_divergence(trace, result)
        except Exception:  # noqa: BLE001 - the report must not lose the failure
            outcome.report = (result.detail or "") + traceback.format_exc()
        if result.verdict == UNKNOWN:
            outcome.report = result.detail
    return outcome


# ---------------------------------------------------------------- running


def make_run_id(spec: CampaignSpec) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in spec.sut)[:40]
    return f"run-{stamp}-{safe}-s{spec.seed}"


def make_run_dir(spec: CampaignSpec) -> tuple[str, Path]:
    """Create the run folder, never reusing one: two runs in the same second get ``-2``, ``-3``, ...

    An explicit ``run_id`` whose folder already holds a run is refused.
    """
    out = Path(spec.out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise RunFolderError(f"--out {out}: not a folder (a file of that name exists)") from None
    except OSError as exc:
        raise RunFolderError(f"--out {out}: cannot create the folder: {exc.strerror or exc}") from None
    if not out.is_dir():
        raise RunFolderError(f"--out {out}: not a folder")
    from schedconf.conformance.bounds import check_run_id

    base = spec.run_id or make_run_id(spec)
    problem = check_run_id(base)
    if problem:
        raise RunFolderError(f"--run-id {base!r}: {problem}")
    for n in range(1, 1000):
        run_id = base if n == 1 else f"{base}-{n}"
        run_dir = out / run_id
        try:
            run_dir.mkdir()
        except FileExistsError:
            if spec.run_id and not any(run_dir.iterdir()):
                return run_id, run_dir  # an empty folder made for us: use it
            if spec.run_id:
                raise RunFolderError(
                    f"--run-id {base}: {run_dir} already holds a run; choose another id or remove the folder"
                ) from None
            continue
        except OSError as exc:
            raise RunFolderError(f"--out {out}: cannot create {run_dir}: {exc.strerror or exc}") from None
        return run_id, run_dir
    raise RunFolderError(f"--out {out}: too many runs named {base}")


class Progress:
    """A one-line progress display on stderr: done, failures, rate, time left."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.total = total
        self.quiet = quiet
        self.start = time.monotonic()
        self.last = 0.0
        self.tty = sys.stderr.isatty()

    def update(self, done: int, failures: int, force: bool = False) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if not force and now - self.last < (0.5 if self.tty else 10.0):
            return
        self.last = now
        elapsed = max(now - self.start, 1e-9)
        rate = done / elapsed
        eta = (self.total - done) / rate if rate > 0 else 0.0
        line = (
            f"[{done:>{len(str(self.total))}}/{self.total}] {100 * done // max(self.total, 1):3d}%  "
            f"{failures} failure(s)  {rate:6.1f} traces/s  eta {eta:5.0f}s"
        )
        sys.stderr.write(("\r" + line) if self.tty else (line + "\n"))
        sys.stderr.flush()

    def finish(self) -> None:
        if not self.quiet and self.tty:
            sys.stderr.write("\n")


def run_campaign(spec: CampaignSpec, on_event: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run a campaign; return its summary (also written to ``reports/<run-id>/``)."""
    say = on_event or (lambda msg: None if spec.quiet else print(msg, file=sys.stderr))
    run_id, run_dir = make_run_dir(spec)
    (run_dir / "failures").mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    summary: dict[str, Any] = {
        "run_id": run_id,
        "run_dir": str(run_dir),
        "spec": asdict(spec),
        "status": "starting",
        "examples_requested": spec.examples,
        "examples_run": 0,
        "passed": 0,
        "failed": 0,
        "unknown": 0,
        "discarded": 0,
        "interrupted": False,
        "failures": [],
        "unknowns": [],
        "features": {},
        "command": " ".join(sys.argv),
    }
    _write_summary(run_dir, summary)
    say(
        f"campaign {run_id}: {spec.examples} trace(s), sut={spec.sut}, profile={spec.profile}, "
        f"comparison={spec.comparison}, seed={spec.seed}, jobs={spec.jobs}"
    )
    from schedconf.conformance.adapters import make_sut

    probe = make_sut(spec.sut)
    try:
        spec, notes = fit_spec_to_sut(spec, probe)
    finally:
        probe.close()
    for note in notes:
        say(note)
    summary["spec"] = asdict(spec)
    try:
        workloads = generate_workloads(spec)
    except BaseException as exc:  # bad --set values, an interrupt: the folder must not say "starting"
        summary["status"] = "interrupted" if isinstance(exc, KeyboardInterrupt) else "harness_error"
        summary["harness_error"] = f"generation failed: {type(exc).__name__}: {exc}"
        _write_summary(run_dir, summary)
        raise
    summary["generation_s"] = round(time.monotonic() - t0, 3)
    summary["status"] = "replaying"
    _write_summary(run_dir, summary)
    from schedconf.conformance.bounds import compute_jobs

    jobs, jobs_warning = compute_jobs(spec.jobs, len(workloads), os.cpu_count())
    if jobs_warning:
        print(f"warning: {jobs_warning}", file=sys.stderr)
    if jobs != spec.jobs:
        say(f"{jobs} worker(s) for {len(workloads)} trace(s) (--jobs {spec.jobs})")
    progress = Progress(len(workloads), spec.quiet)
    outcomes: list[TraceOutcome] = []
    failures: list[TraceOutcome] = []
    executor: cf.ProcessPoolExecutor | None = None
    try:
        if jobs <= 1:
            _init_worker(spec)
            stream = (
                run_one(i, w, (i + 1, workloads[i + 1]) if i + 1 < len(workloads) else None)
                for i, w in enumerate(workloads)
            )
        else:
            executor = cf.ProcessPoolExecutor(max_workers=jobs, initializer=_init_worker_process, initargs=(spec,))
            futures = [executor.submit(run_one, i, w) for i, w in enumerate(workloads)]
            stream = (f.result() for f in cf.as_completed(futures))
        for outcome in stream:
            outcomes.append(outcome)
            _account(summary, outcome, run_dir, failures)
            progress.update(len(outcomes), summary["failed"])
            if outcome.verdict == FAIL and len(failures) <= 3:
                _write_summary(run_dir, summary)
    except KeyboardInterrupt as exc:
        _mark_interrupted(summary, exc, say)
    except Exception as exc:  # noqa: BLE001 - a harness error still leaves a report
        summary["harness_error"] = f"{type(exc).__name__}: {exc}"
        summary["harness_traceback"] = traceback.format_exc()
    finally:
        with _no_interrupts():
            _stop_workers(executor)
            _close_worker_sut()
            progress.update(len(outcomes), summary["failed"], force=True)
            progress.finish()
    summary["replay_s"] = round(time.monotonic() - t0 - summary["generation_s"], 3)
    if failures and not summary["interrupted"] and spec.shrink_budget_s > 0:
        summary["status"] = "shrinking"
        _write_summary(run_dir, summary)
        try:
            _shrink_failures(spec, summary, failures, run_dir, say)
        except KeyboardInterrupt as exc:
            _mark_interrupted(summary, exc, say)
    with _no_interrupts():
        _finish(summary, outcomes, t0)
        _write_summary(run_dir, summary)
        from schedconf.conformance.runs.report import write_reports

        write_reports(run_dir, summary)
    if spec.junit_xml:
        from schedconf.conformance.runs.junit import write_junit

        write_junit(spec.junit_xml, summary, outcomes)
    return summary


def _mark_interrupted(summary: dict[str, Any], exc: BaseException, say: Callable[[str], None]) -> None:
    summary["interrupted"] = True
    summary["interrupted_by"] = "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"
    say(f"\ninterrupted ({summary['interrupted_by']}): writing the report of what was found so far")


@contextmanager
def _no_interrupts() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM while the report is written (a second Ctrl-C must not lose it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _stop_workers(executor: cf.ProcessPoolExecutor | None) -> None:
    """Stop worker processes now: cancel what is queued, SIGTERM the workers (they close their SUTs)."""
    if executor is None:
        return
    executor.shutdown(wait=False, cancel_futures=True)
    processes = list((getattr(executor, "_processes", None) or {}).values())
    for proc in processes:
        if proc.is_alive():
            proc.terminate()
    for proc in processes:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)


def _account(summary: dict[str, Any], outcome: TraceOutcome, run_dir: Path, failures: list[TraceOutcome]) -> None:
    from schedconf.conformance.runs.report import get_failure_facts

    summary["examples_run"] += 1
    if outcome.index == 0 and outcome.trace_text:
        write_atomic(run_dir / "sample.jsonl", outcome.trace_text)
    for feature in outcome.features:
        summary["features"][feature] = summary["features"].get(feature, 0) + 1
    if outcome.verdict == PASS:
        summary["passed"] += 1
        if "refused_config" in outcome.features:
            summary["passed_refused_config"] = summary.get("passed_refused_config", 0) + 1
    elif outcome.verdict == "discarded":
        summary["discarded"] += 1
    elif outcome.verdict == UNKNOWN:
        summary["unknown"] += 1
        if len(summary["unknowns"]) < 20:
            summary["unknowns"].append({"index": outcome.index, "reason": outcome.report})
    else:
        summary["failed"] += 1
        failures.append(outcome)
        name = f"trace-{outcome.index:05d}"
        write_atomic(run_dir / "failures" / f"{name}.jsonl", outcome.trace_text)
        write_atomic(run_dir / "failures" / f"{name}.txt", outcome.report + "\n")
        div = outcome.divergence or {}
        summary["failures"].append(
            {
                "index": outcome.index,
                "trace_file": f"failures/{name}.jsonl",
                "report_file": f"failures/{name}.txt",
                "events": outcome.events,
                "signature": div.get("signature", "?"),
                "section": _section(div),
                **get_failure_facts(div),
                "shrunk_file": None,
                "shrunk_events": None,
            }
        )


def _section(div: dict[str, Any]) -> str:
    return str(div.get("signature", "?")).split(".")[0]


def _shrink_failures(
    spec: CampaignSpec, summary: dict[str, Any], failures: list[TraceOutcome], run_dir: Path, say: Callable[[str], None]
) -> None:
    """Shrink failures, one of each kind first, until the time budget is spent."""
    from schedconf.conformance.adapters import make_sut
    from schedconf.conformance.checking.shrink import ShrinkInterrupted, shrink_trace
    from schedconf.conformance.runs.report import get_failure_facts

    sut = make_sut(spec.sut)
    deadline = time.monotonic() + spec.shrink_budget_s
    seen: set[str] = set()
    by_index = {f["index"]: f for f in summary["failures"]}
    order = sorted(failures, key=lambda o: (_section(o.divergence or {}) in seen, o.index))
    first_of_kind = []
    for o in order:
        sec = _section(o.divergence or {})
        if sec not in seen:
            seen.add(sec)
            first_of_kind.append(o)
    rest = [o for o in failures if o not in first_of_kind]
    queue = first_of_kind + rest
    try:
        for number, o in enumerate(queue, 1):
            left = deadline - time.monotonic()
            if left <= 1:
                say(f"shrink budget spent: {len(queue) - number + 1} failure(s) left unshrunk")
                break
            entry = by_index[o.index]
            say(
                f"shrinking failure #{o.index} ({number}/{len(queue)}, {entry['signature']}), "
                f"{left:.0f} s of the shrink budget left"
            )
            trace = parse_trace_text(o.trace_text, entry["trace_file"])
            try:
                result = shrink_trace(
                    trace,
                    sut,
                    spec.comparison,
                    step_timeout=spec.step_timeout,
                    time_budget_s=min(left, max(10.0, spec.shrink_budget_s / 3)),
                )
            except ShrinkInterrupted as exc:
                # keep what the interrupted shrink had found, marked not minimal, then stop
                name = f"trace-{o.index:05d}.partial.jsonl"
                write_atomic(run_dir / "failures" / name, render_trace(exc.partial.trace))
                entry.update(partial_file=f"failures/{name}", partial_events=exc.partial.num_events)
                raise exc.cause from None
            except ValueError as exc:
                entry["shrink_error"] = str(exc)
                continue
            name = f"trace-{o.index:05d}.min.jsonl"
            result.trace.path = str(run_dir / "failures" / name)
            write_atomic(run_dir / "failures" / name, render_trace(result.trace))
            entry.update(
                shrunk_file=f"failures/{name}",
                shrunk_events=result.num_events,
                shrunk_signature=result.divergence.signature(),
                shrink_s=round(result.seconds, 2),
                **{f"shrunk_{k}": v for k, v in get_failure_facts(result.divergence.to_dict()).items()},
            )
            from schedconf.conformance.checking.replay import ReplayDeadline
            from schedconf.conformance.checking.replay import replay as _replay

            try:
                detail = render_divergence(
                    result.trace, _replay(result.trace, sut, spec.comparison, step_timeout=spec.step_timeout)
                )
            except ReplayDeadline:
                detail = "(the minimal trace could not be replayed again within the time budget)"
            write_atomic(run_dir / "failures" / f"trace-{o.index:05d}.min.txt", detail + "\n")
            say(f"shrunk failure #{o.index} ({entry['signature']}): {entry['events']} -> {result.num_events} events")
            _write_summary(run_dir, summary)
    finally:
        sut.close()


def _finish(summary: dict[str, Any], outcomes: list[TraceOutcome], t0: float) -> None:
    duration = time.monotonic() - t0
    summary["duration_s"] = round(duration, 3)
    run = summary["examples_run"]
    summary["traces_per_s"] = round(run / summary["replay_s"], 2) if summary.get("replay_s") else None
    summary["steps_run"] = sum(o.steps for o in outcomes)
    summary["feature_shares"] = {k: round(v / run, 3) for k, v in sorted(summary["features"].items())} if run else {}
    from schedconf.conformance.workloads.workload import is_v0_profile

    if is_v0_profile(summary["spec"]["profile"]):
        from schedconf.conformance.workloads.workload_v0 import V0_COVERAGE

        # The v0 shares the issue asks every run to state, zeros included.
        summary["coverage"] = {k: round(summary["features"].get(k, 0) / run, 3) if run else 0.0 for k in V0_COVERAGE}
    if summary.get("harness_error"):
        summary["status"] = "harness_error"
    elif summary["failed"]:
        summary["status"] = "fail"
    elif summary["interrupted"]:
        summary["status"] = "interrupted"
    elif summary["unknown"] and summary["passed"] == summary.get("passed_refused_config", 0):
        # Refusing a config one step past a limit is a real check, but not a verdict on the
        # scheduler's schedules: a run whose every other trace is unknown is not a pass.
        summary["status"] = "unknown"
    else:
        summary["status"] = "pass"


def _write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")


def exit_code(summary: dict[str, Any]) -> int:
    """130 interrupted by Ctrl-C, 143 by SIGTERM (whatever was found before: the summary lists it),
    else 1 conformance failure, 2 harness error or nothing conclusive (every trace unknown), 0 pass."""
    if summary["interrupted"]:
        return 143 if summary.get("interrupted_by") == "SIGTERM" else 130
    if summary["failed"]:
        return 1
    if summary.get("harness_error") or summary["status"] == "unknown":
        return 2
    return 0


def default_jobs() -> int:
    return max(1, (os.cpu_count() or 1))
