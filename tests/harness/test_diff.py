"""``schedconf diff``: the same generated traces to two schedulers, their differences grouped, no reference needed.

The expected groups are derived by hand from what each pair is known to differ
in: a scheduler and itself differ nowhere; the reference and the mutant that
preempts the head of running instead of the tail (conformance/checking/mutants.py)
differ first in ``preempted_req_ids``; the reference under vllm-0.32 and under
vllm-0.33 differ in their profiles' knobs (spec/v1/profiles.py), of which only
``priority_self_preemption`` can show when every step samples one token and
no drafts (the diff drives both sides as ``--comparison safety`` does):
switching that one knob back makes the two identical.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from schedconf.conformance.runs.diff import DiffSpec, run_diff, write_diff
from schedconf.conformance.traces.trace import read_trace
from schedconf.spec.v1 import profiles

REPO = Path(__file__).resolve().parents[2]


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "schedconf.conformance", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=600,
    )


def test_a_scheduler_and_itself_differ_nowhere(tmp_path):
    proc = run_cli(
        ["diff", "--sut", "reference", "--against", "impl", "--examples", "30", "--out", str(tmp_path), "-q"], tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "diff.json").read_text())
    assert data["groups"] == [] and data["counts"]["different"] == 0 and data["counts"]["same"] >= 25


def test_a_wrong_victim_is_one_group_with_a_minimal_trace_and_its_safety_breach(tmp_path):
    proc = run_cli(
        [
            "diff",
            "--sut",
            "reference",
            "--against",
            "mutant:fcfs_victim_head",
            "--examples",
            "60",
            "--shrink-budget",
            "20",
            "--out",
            str(tmp_path),
            "-q",
        ],
        tmp_path,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "diff.json").read_text())
    assert [g["signature"] for g in data["groups"]] == ["scheduler_output:preempted_req_ids"]
    (group,) = data["groups"]
    assert group["minimal"] and group["minimal_events"] < 20
    # the head-of-running victim takes the blocks of a request that then cannot progress (CHECKS.md)
    assert group["safety"] == ["B: safety:progress"]
    assert "`preempted_req_ids`: A" in proc.stdout
    # the minimal trace still shows the same first difference
    spec = DiffSpec(
        sut="reference", against="mutant:fcfs_victim_head", profile="vllm-0.33", against_profile="vllm-0.33"
    )
    from schedconf.conformance.adapters import make_sut
    from schedconf.conformance.runs.diff import RecordingSut, compare_runs, run_side

    trace = read_trace(group["minimal"])
    runs = [run_side(trace, RecordingSut(make_sut(name)), "vllm-0.33", None) for name in (spec.sut, spec.against)]
    assert compare_runs(*runs).signature() == "scheduler_output:preempted_req_ids"


def test_vllm_032_and_033_differ_only_by_the_priority_self_preemption_knob(tmp_path, monkeypatch):
    spec = DiffSpec(
        sut="reference",
        against="reference",
        profile="vllm-0.32",
        against_profile="vllm-0.33",
        examples=300,
        seed=11,
        shrink_budget_s=0,
    )
    groups, counts = run_diff(spec)
    assert [g.signature for g in groups] == ["scheduler_output:scheduled_cached_reqs"] and counts["different"] >= 1
    # the same traces with 0.33's one difference switched back to 0.32's: no difference left
    same_but_break = dataclasses.replace(
        profiles.PROFILES["vllm-0.33"],
        name="vllm-0.33-break",
        priority_self_preemption=profiles.PROFILES["vllm-0.32"].priority_self_preemption,
    )
    monkeypatch.setitem(profiles.PROFILES, "vllm-0.33-break", same_but_break)
    groups, counts = run_diff(dataclasses.replace(spec, against_profile="vllm-0.33-break"))
    assert groups == [] and counts["same"] == counts["traces"] - counts["unknown"]


def test_the_report_names_both_sides_and_each_group(tmp_path):
    spec = DiffSpec(
        sut="reference",
        against="mutant:fcfs_victim_head",
        profile="vllm-0.33",
        against_profile="vllm-0.33",
        examples=40,
        shrink_budget_s=0,
    )
    groups, counts = run_diff(spec)
    report = write_diff(spec, groups, counts, tmp_path).read_text()
    assert report.startswith("# schedconf diff: A = reference (vllm-0.33), B = mutant:fcfs_victim_head (vllm-0.33)")
    assert "## 1. `scheduler_output:preempted_req_ids`" in report


def test_sides_that_force_a_field_differently_are_refused(tmp_path):
    (tmp_path / "forcing.py").write_text(
        "from schedconf.conformance.adapters.reference import ReferenceSut\n"
        "class Off(ReferenceSut):\n    forced_config = {'enable_prefix_caching': False}\n"
        "class On(ReferenceSut):\n    forced_config = {'enable_prefix_caching': True}\n"
    )
    proc = run_cli(
        [
            "diff",
            "--sut",
            "module:forcing:Off",
            "--against",
            "module:forcing:On",
            "--examples",
            "2",
            "--out",
            str(tmp_path / "d"),
        ],
        tmp_path,
    )
    assert proc.returncode == 2 and "force enable_prefix_caching to different values" in proc.stderr


@pytest.mark.parametrize("args", [["--sut", "reference"], ["--against", "reference"]])
def test_both_sides_are_required(args, tmp_path):
    proc = run_cli(["diff", *args], tmp_path)
    assert proc.returncode == 2 and "required" in proc.stderr


def test_the_traces_leave_the_pool_headroom_either_side_asks_for(monkeypatch):
    """A side that keeps part of its pool back (its adapter's pool_headroom_blocks) gets it, as in a campaign."""
    from schedconf.conformance.adapters.reference import ReferenceSut
    from schedconf.conformance.runs import campaign

    seen = []
    monkeypatch.setattr(ReferenceSut, "pool_headroom_blocks", 3, raising=False)
    monkeypatch.setattr(campaign, "generate_workloads", lambda spec: seen.append(spec) or [])
    run_diff(
        DiffSpec(
            sut="reference",
            against="mutant:fcfs_victim_head",
            profile="vllm-0.33",
            against_profile="vllm-0.33",
            examples=1,
            seed=0,
        )
    )
    assert [spec.pool_headroom_blocks for spec in seen] == [3]


def test_profiles_that_refuse_different_configs_shrink_to_configs_both_accept_or_to_the_header():
    """vllm-0.33 and aphrodite-0.24 differ in which configs they accept (an ``input_error`` group: 0.33's
    knobs are not in Aphrodite's release, so it refuses at init, before any step) and in what they schedule. Shrinking the latter cuts ``max_model_len``, which can fall
    below ``long_prefill_token_threshold``: a config the reference refuses is no instance of the difference,
    not a crash of the diff. Every group ends with a minimal trace."""
    spec = DiffSpec(
        sut="reference",
        against="reference",
        profile="vllm-0.33",
        against_profile="aphrodite-0.24",
        examples=60,
        shrink_budget_s=10,
    )
    groups, counts = run_diff(spec)
    assert counts["different"] > 0 and groups
    assert all(group.minimal is not None for group in groups), [g.signature for g in groups if g.minimal is None]
    refused = [group for group in groups if group.signature.startswith("input_error")]
    assert refused and all(g.minimal_divergence.step is None for g in refused)
