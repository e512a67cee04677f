"""A behavioural diff of two schedulers: the same generated traces to both, no reference needed.

``schedconf diff --sut A --against B`` answers a reviewer's question about a
scheduler change: *what does it change, and is any of it unsafe?* Each
generated trace's inputs (requests, aborts, the model's tokens) drive both
schedulers as ``--comparison safety`` drives one (``conformance/checking/safety/drive.py``):
each scheduler's own schedule decides what runs, every step is answered from
the trace's token scripts, so two schedulers that decide alike see the very
same inputs. The two runs are compared call by call; the first call where
they differ is the trace's difference, and its kind and telling field (the
divergence *signature* of ``conformance/checking/compare.py``, e.g.
``scheduler_output:preempted_req_ids``) its group. Each side is also checked
against the safety properties on the way, so every group says whether
either side broke one.

Each group gets a minimal trace: shrunk against the pair (the smallest
workload whose first difference has the group's signature). The reference
model only turns workloads into traces (the token scripts); no verdict comes
from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from schedconf.conformance.checking.compare import Comparator, Divergence, FieldDiff
from schedconf.conformance.checking.replay import FAIL, UNKNOWN, replay
from schedconf.conformance.runs.report import get_first_diffs
from schedconf.conformance.sut import SchedulerUnderTest, SutInputError
from schedconf.conformance.traces.trace import Trace, render_trace, write_atomic
from schedconf.conformance.workloads.workload import RefusedConfigWorkload, Workload, WorkloadError, run_workload
from schedconf.spec.errors import SpecError


class RecordingSut:
    """A SUT whose every answer (and refusal) is kept in ``records``, in call order.

    Attributes it does not define are the inner SUT's (``timeout_s`` and
    ``deadline`` included, which the replay sets).
    """

    def __init__(self, inner: SchedulerUnderTest) -> None:
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "records", [])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.inner, name, value)

    def _record(self, method: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            result = fn(*args)
        except SutInputError as exc:
            self.records.append((method, args[:1], ("error", exc.code)))
            raise
        self.records.append((method, args[:1] if method in ("add_request", "abort") else (), ("ok", result)))
        return result

    def start(self, config: dict[str, Any], profile: str) -> None:
        self.records.clear()
        self._record("start", self.inner.start, config, profile)

    def add_request(self, event: dict[str, Any]) -> None:
        self._record("add_request", self.inner.add_request, event)

    def abort(self, request_id: str) -> None:
        self._record("abort", self.inner.abort, request_id)

    def schedule(self) -> dict[str, Any]:
        return self._record("schedule", self.inner.schedule)

    def update_from_output(self, sampled: dict[str, list[int]], drafts: dict[str, list[int]]) -> list[dict[str, Any]]:
        return self._record("update", self.inner.update_from_output, sampled, drafts)

    def observe(self) -> dict[str, Any] | None:
        return self.inner.observe()

    def close(self) -> None:
        self.inner.close()


@dataclass
class SideRun:
    """One scheduler's run of one trace: its answers in call order, and its safety verdict."""

    records: list[tuple[str, tuple[Any, ...], tuple[str, Any]]]
    verdict: str
    safety: str | None
    """The safety property this side broke (``safety:computed_kv``, ``sut_error``, ...), None if it broke none."""
    events_run: int


def run_side(trace: Trace, sut: RecordingSut, profile: str, step_timeout: float | None) -> SideRun:
    """Drive ``sut`` through ``trace``'s inputs under ``profile`` (the safety driver), keeping its answers."""
    side_trace = Trace(
        header={**trace.header, "profile": profile}, events=trace.events, path=trace.path, lines=trace.lines
    )
    result = replay(side_trace, sut, "safety", step_timeout=step_timeout)
    broke = result.divergence.signature() if result.verdict == FAIL and result.divergence else None
    return SideRun(list(sut.records), result.verdict, broke, result.events_run)


def compare_runs(a: SideRun, b: SideRun) -> Divergence | None:
    """The first call where the two runs answer differently, as a Divergence (None: they never differ)."""
    comparator = Comparator("strict")
    steps = 0
    for index, (ra, rb) in enumerate(zip(a.records, b.records)):
        (method, args, (status_a, value_a)), (_, _, (status_b, value_b)) = ra, rb
        steps += method == "schedule"
        if ra == rb:
            continue
        if method != rb[0]:
            return Divergence(
                index,
                0,
                steps or None,
                "calls",
                (FieldDiff("call", method, rb[0]),),
                f"the runs part ways: {method} against {rb[0]}",
            )
        if status_a != status_b or status_a == "error":
            return Divergence(
                index,
                0,
                steps or None,
                "input_error",
                (
                    FieldDiff(
                        "error", value_a if status_a == "error" else None, value_b if status_b == "error" else None
                    ),
                ),
                f"{method}{'(' + repr(args[0]) + ')' if args else ''}: one refused, the other did not",
            )
        if method == "schedule":
            diffs = comparator.compare_scheduler_output(value_a, value_b)
            kind = "scheduler_output"
        else:
            diffs = comparator.compare_request_outputs(value_a, value_b)
            kind = "request_outputs"
        return Divergence(index, 0, steps or None, kind, tuple(diffs), f"{method}() answers differently")
    if len(a.records) != len(b.records):
        longer = "the first" if len(a.records) > len(b.records) else "the second"
        return Divergence(
            min(len(a.records), len(b.records)),
            0,
            steps or None,
            "length",
            (FieldDiff("calls", len(a.records), len(b.records)),),
            f"{longer} scheduler ran longer (its requests ended later)",
        )
    return None


@dataclass
class DiffSpec:
    """What to diff: two SUTs, each with its profile, on a campaign's generated traces."""

    sut: str
    against: str
    profile: str
    against_profile: str
    examples: int = 100
    seed: int = 0
    step_timeout: float | None = 30.0
    shrink_budget_s: float = 60.0
    config_overrides: dict[str, Any] = field(default_factory=dict)
    """Config fields forced in every generated trace (``--set``), on top of what either side forces."""


@dataclass
class DiffGroup:
    """The traces whose first difference has one signature."""

    signature: str
    indices: list[int] = field(default_factory=list)
    first: Divergence | None = None
    safety: set[str] = field(default_factory=set)
    """``A: safety:...`` / ``B: safety:...`` for each side that broke a property in one of the traces."""
    minimal: Trace | None = None
    minimal_divergence: Divergence | None = None


def diff_workload(
    workload: Workload | RefusedConfigWorkload, spec: DiffSpec, a: RecordingSut, b: RecordingSut
) -> tuple[Trace, SideRun, SideRun, Divergence | None]:
    """Turn a workload into a trace (the reference's token scripts) and run both sides on it."""
    trace = run_workload(workload)
    run_a = run_side(trace, a, spec.profile, spec.step_timeout)
    run_b = run_side(trace, b, spec.against_profile, spec.step_timeout)
    return trace, run_a, run_b, compare_runs(run_a, run_b)


def get_forced_config(spec: DiffSpec, a: Any, b: Any) -> dict[str, Any]:
    """The config both sides' campaigns would force (what a SUT cannot express), so that no trace is
    unknown for a reason the generator could avoid; a field the two force to different values is refused."""
    from schedconf.conformance.runs.campaign import CampaignSpec, get_forced_for_protocol_level

    forced: dict[str, Any] = {}
    for sut, profile in ((a, spec.profile), (b, spec.against_profile)):
        probe = CampaignSpec(sut="reference", profile=profile, comparison="safety")
        own = {**(getattr(sut, "forced_config", None) or {}), **get_forced_for_protocol_level(sut, probe)}
        clash = {k for k in own if k in forced and forced[k] != own[k]}
        if clash:
            raise ValueError(
                f"the two schedulers force {', '.join(sorted(clash))} to different values: "
                "no generated trace can run on both"
            )
        forced.update(own)
    return forced


def get_safety_notes(run_a: SideRun, run_b: SideRun) -> set[str]:
    return {f"{side}: {broke}" for side, broke in (("A", run_a.safety), ("B", run_b.safety)) if broke}


def run_diff(spec: DiffSpec, say: Callable[[str], None] = lambda m: None) -> tuple[list[DiffGroup], dict[str, Any]]:
    """Diff the two SUTs on ``spec.examples`` generated traces; shrink one trace per group; the groups and counts."""
    from schedconf.conformance.adapters import make_sut
    from schedconf.conformance.checking.shrink import Shrinker
    from schedconf.conformance.runs.campaign import CampaignSpec, generate_workloads, get_pool_headroom

    a, b = RecordingSut(make_sut(spec.sut)), RecordingSut(make_sut(spec.against))
    # what either side's campaign would force (one step at a time under the safety driver, a SUT's forced_config)
    generation = CampaignSpec(
        sut="reference",
        profile=spec.profile,
        examples=spec.examples,
        seed=spec.seed,
        comparison="safety",
        config_overrides={**get_forced_config(spec, a.inner, b.inner), **spec.config_overrides},
        pool_headroom_blocks=max(get_pool_headroom(a.inner), get_pool_headroom(b.inner)),
    )
    workloads = generate_workloads(generation)
    groups: dict[str, DiffGroup] = {}
    counts = {"traces": 0, "same": 0, "different": 0, "unknown": 0, "discarded": 0}
    try:
        for index, workload in enumerate(workloads):
            try:
                _, run_a, run_b, difference = diff_workload(workload, spec, a, b)
            except WorkloadError:
                counts["discarded"] += 1
                continue
            counts["traces"] += 1
            if UNKNOWN in (run_a.verdict, run_b.verdict):
                counts["unknown"] += 1  # a side cannot run this config (unsupported at init): nothing to compare
                continue
            if difference is None:
                counts["same"] += 1
                continue
            counts["different"] += 1
            group = groups.setdefault(difference.signature(), DiffGroup(difference.signature()))
            group.indices.append(index)
            group.first = group.first or difference
            group.safety |= get_safety_notes(run_a, run_b)
        deadline = time.monotonic() + spec.shrink_budget_s
        for group in groups.values():
            left = deadline - time.monotonic()
            if left <= 1:
                break
            say(f"shrinking {group.signature} ({len(group.indices)} traces), {left:.0f} s left")

            def probe(
                candidate: Workload | RefusedConfigWorkload, key: str = group.signature
            ) -> tuple[Trace, Divergence] | None:
                try:
                    trace, run_a, run_b, difference = diff_workload(candidate, spec, a, b)
                except (SpecError, WorkloadError, ValueError, AssertionError):
                    # Not a valid workload for the reference (as checking.shrink.differential_probe says):
                    # a shrunk config it refuses (max_model_len cut below the profile's threshold, say)
                    # or an input it refuses is no smaller instance of this difference.
                    return None
                if UNKNOWN in (run_a.verdict, run_b.verdict) or difference is None:
                    return None
                return (trace, difference) if difference.signature() == key else None

            first = workloads[group.indices[0]]
            if isinstance(first, RefusedConfigWorkload):
                # A config one side refuses: the trace is its header alone, already minimal.
                found = probe(first)
                if found is not None:
                    group.minimal, group.minimal_divergence = found
                continue
            shrinker = Shrinker(probe, time_budget_s=min(left, max(10.0, spec.shrink_budget_s / 3)))
            try:
                shrinker.run(first)
            except ValueError:
                continue
            if shrinker.best is not None:
                group.minimal, group.minimal_divergence = shrinker.best
    finally:
        a.close()
        b.close()
    return sorted(groups.values(), key=lambda g: (-len(g.indices), g.signature)), counts


def render_diff_report(spec: DiffSpec, groups: list[DiffGroup], counts: dict[str, Any], files: dict[str, str]) -> str:
    """The report of a diff, as Markdown: the counts, then one section per group."""
    a, b = f"{spec.sut} ({spec.profile})", f"{spec.against} ({spec.against_profile})"
    lines = [
        f"# schedconf diff: A = {a}, B = {b}",
        "",
        f"{counts['traces']} traces (seed {spec.seed}; {counts['discarded']} discarded): "
        f"{counts['same']} alike, {counts['different']} different, in {len(groups)} group(s) by their first "
        f"difference; {counts['unknown']} that a side cannot run.",
        "",
    ]
    for number, group in enumerate(groups, 1):
        shown = group.minimal_divergence or group.first
        assert shown is not None
        lines.append(f"## {number}. `{group.signature}`: {len(group.indices)} trace(s)")
        lines.append("")
        where = f"step {shown.step}" if shown.step is not None else "before the first step"
        lines.append(f"First difference, {where}: {shown.message}")
        for d in get_first_diffs(shown.to_dict(), limit=5):  # the telling field first, values cut where they differ
            lines.append(f"- `{d['field']}`: A `{d['expected']}`, B `{d['actual']}`")
        lines.append("")
        safety = ", ".join(sorted(group.safety)) or "neither side broke a safety property"
        lines.append(f"Safety: {safety}.")
        if group.signature in files:
            size = len(group.minimal.events) if group.minimal else "?"
            lines.append(f"Minimal trace ({size} events): `{files[group.signature]}`")
        lines.append("")
    return "\n".join(lines)


def write_diff(spec: DiffSpec, groups: list[DiffGroup], counts: dict[str, Any], out: Path) -> Path:
    """Write ``diff.md``, ``diff.json`` and each group's minimal trace under ``out``; the report's path."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    for number, group in enumerate(groups, 1):
        if group.minimal is not None:
            name = f"group-{number:02d}.min.jsonl"
            trace = replace(
                group.minimal,
                header={**group.minimal.header, "origin": "diff", "description": f"diff: {group.signature}"},
            )
            write_atomic(out / name, render_trace(trace))
            files[group.signature] = str(out / name)
    report = out / "diff.md"
    write_atomic(report, render_diff_report(spec, groups, counts, files) + "\n")
    data = {
        "spec": spec.__dict__,
        "counts": counts,
        "groups": [
            {
                "signature": g.signature,
                "traces": g.indices,
                "safety": sorted(g.safety),
                "minimal": files.get(g.signature),
                "minimal_events": len(g.minimal.events) if g.minimal else None,
            }
            for g in groups
        ],
    }
    write_atomic(out / "diff.json", json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    return report
