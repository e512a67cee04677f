"""Replay and the comparison profiles."""

import copy

import pytest

from schedconf.conformance.adapters import UnknownSut, make_sut
from schedconf.conformance.checking.compare import BlockRenaming, Comparator
from schedconf.conformance.checking.replay import FAIL, PASS, UNKNOWN, render_divergence, replay
from schedconf.conformance.sut import SutUnsupported
from schedconf.conformance.traces.examples import example_mixed
from schedconf.conformance.traces.trace import read_trace
from schedconf.conformance.traces.vectors import iter_corpus
from schedconf.conformance.workloads.workload import run_workload


@pytest.fixture(scope="module")
def trace():
    return run_workload(example_mixed())


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.32", "vllm-0.11"])
def test_reference_passes_the_corpus(profile):
    sut = make_sut("reference")
    entries = iter_corpus(profile)
    assert len(entries) >= 20
    for _, path, _ in entries:
        result = replay(read_trace(path), sut, "strict")
        assert result.verdict == PASS, (path, result.divergence)


def test_first_divergence_is_reported_with_fields_and_state(trace):
    bad = copy.deepcopy(trace)
    step_events = [i for i, e in enumerate(bad.events) if e["kind"] == "step"]
    target = step_events[3]
    bad.events[target]["expect"]["total_num_scheduled_tokens"] += 1
    result = replay(bad, make_sut("reference"), "strict")
    assert result.verdict == FAIL and result.divergence.event_index == target
    assert result.divergence.step == 4
    assert [d.field for d in result.divergence.diffs] == ["total_num_scheduled_tokens"]
    text = render_divergence(bad, result)
    assert "first divergence at step 4" in text and "reference state before this event" in text
    assert "running:" in text and "free (" in text


def test_observable_allows_a_consistent_renaming_of_blocks(trace):
    # Rename every block id by a fixed bijection: strict fails, observable passes.
    renamed = copy.deepcopy(trace)
    perm = {b: 1000 + b for b in range(trace.config["num_gpu_blocks"])}
    for e in renamed.events:
        if e["kind"] == "step":
            for r in e["expect"]["scheduled_new_reqs"]:
                r["block_ids"] = [perm[b] for b in r["block_ids"]]
            for c in e["expect"]["scheduled_cached_reqs"]:
                c["new_block_ids"] = [perm[b] for b in c["new_block_ids"]]
            e.pop("observe", None)
    ref = make_sut("reference")
    assert replay(renamed, ref, "strict").verdict == FAIL
    assert replay(renamed, ref, "observable").verdict == PASS


def test_renaming_must_stay_consistent():
    r = BlockRenaming()
    assert r.match([1, 2], [7, 8])
    assert r.match([2], [8])
    assert not r.match([1], [9])  # 1 was renamed to 7
    assert not r.match([3], [7])  # 7 already stands for 1


def test_observable_still_catches_counts_and_sets():
    c = Comparator("observable")
    expected = {
        "scheduled_new_reqs": [{"req_id": "a", "block_ids": [1, 2], "num_computed_tokens": 0}],
        "scheduled_cached_reqs": [],
        "num_scheduled_tokens": {"a": 5},
        "total_num_scheduled_tokens": 5,
        "scheduled_spec_decode_tokens": {},
        "finished_req_ids": [],
        "preempted_req_ids": [],
    }
    actual = copy.deepcopy(expected)
    actual["scheduled_new_reqs"][0]["block_ids"] = [4]
    assert [d.field for d in c.compare_scheduler_output(expected, actual)] == ["scheduled_new_reqs.num_blocks.<a>"]
    actual = copy.deepcopy(expected)
    actual["preempted_req_ids"] = ["b"]
    assert [d.field for d in c.compare_scheduler_output(expected, actual)] == ["preempted_req_ids"]


def test_unsupported_gives_unknown(trace):
    class Picky:
        name = "picky"

        def start(self, config, profile):
            raise SutUnsupported("no prefix caching here")

    assert replay(trace, Picky(), "strict").verdict == UNKNOWN


def test_unknown_sut_name():
    with pytest.raises(UnknownSut):
        make_sut("nonsense")
