"""A trace's calls sent as one ``batch`` request give the verdicts that one request per call gives.

The harness plans a batch with the very code that replays the trace (PROTOCOL.md, "batch"), so the
scheduler receives the same calls in the same order; each reply is read, checked and compared as it
would be on its own. These tests replay one generated corpus both ways against the reference and
against mutants of it, each behind the protocol in its own process, and require the same verdict,
the same divergence (event, step, kind, differing fields) and the same count of events and steps run.
A fault mid-trace is the fault-injection suite's business (``test_fault_injection.py`` runs every
fault both ways).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from schedconf.conformance.adapters.stdio import StdioSut
from schedconf.conformance.checking.replay import replay
from schedconf.conformance.checking.shrink import shrink_trace
from schedconf.conformance.runs.campaign import CampaignSpec, fit_spec_to_sut, generate_workloads
from schedconf.conformance.traces.trace import Trace, render_trace
from schedconf.conformance.workloads.workload import WorkloadError, run_workload

SERVED = "tests.harness.served_mutants"
"""The module whose factories the protocol server runs (the reference, and mutants of it)."""


def get_corpus(profile: str, examples: int, seed: int, sut: Any = None) -> list[Trace]:
    """The traces a campaign under ``profile`` draws (for ``sut``, if given: fitted to what it can run), those
    the reference finishes."""
    spec = CampaignSpec(sut="reference", profile=profile, examples=examples, seed=seed)
    if sut is not None:
        spec, _ = fit_spec_to_sut(spec, sut)
    traces = []
    for workload in generate_workloads(spec):
        try:
            traces.append(run_workload(workload))
        except WorkloadError:
            continue
    return traces


def served(factory: str, batch: bool) -> StdioSut:
    sut = StdioSut(f"{sys.executable} -m schedconf.conformance.protocol_server {SERVED}:{factory}", timeout_s=30.0)
    sut.use_batch = batch
    return sut


def get_outcome(result: Any) -> tuple[Any, ...]:
    """What must not depend on how the calls travel."""
    d = result.divergence
    where = None if d is None else (d.event_index, d.line, d.step, d.kind, d.diffs, d.message)
    return result.verdict, where, result.events_run, result.steps_run, result.detail


def replay_both_ways(factory: str, traces: list[Trace]) -> tuple[list[tuple[Any, ...]], dict[bool, int]]:
    """The outcomes of each trace (equal both ways, or the test fails) and the messages each way sent."""
    outcomes: dict[bool, list[tuple[Any, ...]]] = {}
    messages: dict[bool, int] = {}
    for batch in (False, True):
        sut = served(factory, batch)
        try:
            outcomes[batch] = [get_outcome(replay(trace, sut, "strict")) for trace in traces]
            assert sut.child is not None
            messages[batch] = sut.child.messages
        finally:
            sut.close()
    for index, (per_call, batched) in enumerate(zip(outcomes[False], outcomes[True])):
        assert per_call == batched, f"trace {index} of {factory}: per call {per_call}, batched {batched}"
    return outcomes[True], messages


@pytest.fixture(scope="module")
def corpus() -> list[Trace]:
    traces = get_corpus("vllm-0.33", 40, seed=5) + get_corpus("vllm-0.33-async", 20, seed=6)
    assert len(traces) > 50
    return traces


def test_the_reference_passes_every_trace_both_ways_in_far_fewer_messages(corpus):
    outcomes, messages = replay_both_ways("reference", corpus)
    assert all(o[0] == "pass" for o in outcomes), [o for o in outcomes if o[0] != "pass"][:3]
    calls = sum(len(t.events) for t in corpus)
    # One request per call: init plus at least one per event. Batched: init plus one batch per trace
    # (none for a trace whose config is refused at init, or that has no events).
    assert messages[False] > calls
    assert messages[True] == sum(1 + ("expect_error" not in t.header and bool(t.events)) for t in corpus)
    assert messages[True] < len(corpus) * 2 + 1


@pytest.mark.parametrize("factory", ["fcfs_victim_head", "free_head_first", "stale_output_applied_as_fresh"])
def test_a_mutant_fails_the_same_traces_at_the_same_event_both_ways(factory, corpus):
    outcomes, _ = replay_both_ways(factory, corpus)
    failed = [o for o in outcomes if o[0] == "fail"]
    assert failed, f"{factory} fails no trace of the corpus: the comparison would show nothing"
    # The mutant diverges inside a trace, not at init: the batch's answers after it are never read.
    assert all(o[1][2] is not None for o in failed), failed[:3]


def test_a_failure_shrinks_to_the_same_minimal_trace_both_ways(corpus):
    """Shrinking replays hundreds of candidates; each way must accept the same ones and end alike."""
    sut = served("fcfs_victim_head", batch=True)
    try:
        failing = [t for t in corpus if replay(t, sut, "strict").verdict == "fail"]
    finally:
        sut.close()
    trace = min(failing, key=lambda t: len(t.events))
    shrunk = {}
    for batch in (False, True):
        sut = served("fcfs_victim_head", batch)
        try:
            result = shrink_trace(trace, sut, "strict", time_budget_s=120.0)
        finally:
            sut.close()
        assert result.seconds < 100, "the budget, not the search, ended the shrink: the two could differ"
        shrunk[batch] = (render_trace(result.trace), result.divergence, result.attempts, result.accepted)
    assert shrunk[True] == shrunk[False]
    assert shrunk[True][3] > 0, "nothing was shrunk: the comparison shows little"


def test_a_campaign_that_generates_the_next_trace_meanwhile_finds_what_one_request_per_call_finds(
    tmp_path, monkeypatch
):
    """``schedconf run`` with one job generates trace i+1 while the scheduler runs trace i's batch: the same
    verdicts and the same failing traces as one request per call. (Shrinking is left out: a campaign
    shrinks against a time budget, which the faster way fills with more attempts;
    ``test_a_failure_shrinks_to_the_same_minimal_trace_both_ways`` compares shrinks that end on their own.)"""
    from schedconf.conformance.runs.campaign import run_campaign

    command = f"stdio:{sys.executable} -m schedconf.conformance.protocol_server {SERVED}:fcfs_victim_head"
    summaries = {}
    for batch in ("0", "1"):
        monkeypatch.setenv("SCHEDCONF_PROTOCOL_BATCH", batch)
        spec = CampaignSpec(
            sut=command,
            examples=40,
            seed=5,
            out_dir=str(tmp_path),
            run_id=f"batch{batch}",
            quiet=True,
            shrink_budget_s=0,
        )
        summaries[batch] = run_campaign(spec)
    per_call, batched = summaries["0"], summaries["1"]
    for key in ("passed", "failed", "unknown", "discarded", "examples_run"):
        assert per_call[key] == batched[key], key
    assert per_call["failed"] > 0
    assert [(f["index"], f["signature"]) for f in per_call["failures"]] == [
        (f["index"], f["signature"]) for f in batched["failures"]
    ]


def test_an_error_while_generating_the_next_trace_is_raised_at_its_turn_not_blamed_on_the_scheduler(
    monkeypatch, corpus
):
    from schedconf.conformance.runs import campaign

    workloads = generate_workloads(CampaignSpec(sut="reference", examples=3, seed=5))
    real_generate = campaign._generate

    def generate(index, workload):  # noqa: ANN001, ANN202
        if index == 1:
            raise RuntimeError("the generator broke")
        return real_generate(index, workload)

    monkeypatch.setattr(campaign, "_generate", generate)
    sut = served("reference", batch=True)
    campaign._WORKER.update(spec=CampaignSpec(sut="reference", examples=3, seed=5), sut=sut)
    try:
        first = campaign.run_one(0, workloads[0], (1, workloads[1]))
        assert first.verdict == "pass", first.report  # the scheduler is not blamed for the generator
        assert campaign._WORKER["prefetched"][0] == 1  # it was generated while trace 0 ran
        with pytest.raises(RuntimeError, match="the generator broke"):
            campaign.run_one(1, workloads[1], (2, workloads[2]))
    finally:
        campaign._WORKER.clear()
        sut.close()


@pytest.mark.parametrize("factory", ["reference_columns", "free_head_first_columns"])
def test_replies_in_column_form_give_the_outcomes_of_replies_in_lists(factory, corpus):
    """A scheduler that lists ``capabilities.columns`` answers the lists of requests as one list per field
    where the harness asks for it (PROTOCOL.md, "Column form"); the harness turns them back into lists of
    objects before its checks. Lists one request per call against columns in a batch: the same outcomes."""
    outcomes = {}
    for columns in (False, True):
        sut = served(factory, batch=columns)
        sut.use_columns = columns
        try:
            outcomes[columns] = [get_outcome(replay(trace, sut, "strict")) for trace in corpus]
            assert sut.columns is columns, "the column form was not agreed at init as asked"
        finally:
            sut.close()
    for index, (lists, columns) in enumerate(zip(outcomes[False], outcomes[True])):
        assert lists == columns, f"trace {index} of {factory}: in lists {lists}, in columns {columns}"
    verdicts = {o[0] for o in outcomes[True]}
    assert verdicts == ({"pass"} if factory == "reference_columns" else {"pass", "fail"}), verdicts


def test_columns_of_different_lengths_are_a_protocol_error_at_their_step(corpus):
    """``ragged_columns`` drops the last value of one column of the third step's cached requests."""

    def get_third_step(trace: Trace) -> dict[str, Any]:
        steps = [e for e in trace.events if e["kind"] == "step"]
        return steps[2] if len(steps) > 2 else {}

    trace = next(t for t in corpus if get_third_step(t).get("expect", {}).get("scheduled_cached_reqs"))
    event_index = trace.events.index(get_third_step(trace))
    for batch in (False, True):
        sut = served("ragged_columns", batch)
        try:
            result = replay(trace, sut, "strict")
        finally:
            sut.close()
        assert result.verdict == "fail" and result.divergence.kind == "protocol_error", result
        assert (result.divergence.event_index, result.divergence.step) == (event_index, 3), result.divergence
        # Hand-derived: the other four columns keep every cached request, the ragged one lacks the last.
        n = len(get_third_step(trace)["expect"]["scheduled_cached_reqs"])
        expected = (
            "result.scheduled_cached_reqs: expected columns of one length (column form), found "
            f"{n} value{'' if n == 1 else 's'} in new_block_ids, num_output_tokens, req_id, resumed and "
            f"{n - 1} value{'' if n - 1 == 1 else 's'} in num_computed_tokens"
        )
        assert expected in (result.divergence.message), result.divergence.message
