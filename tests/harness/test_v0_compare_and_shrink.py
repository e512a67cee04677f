"""v0 divergences: a changed output field fails with the right kind, and a v0 failure shrinks.

The schedulers under test here are the reference with one deliberate bug each
(``make_wrong_block_sut``, ``make_lost_swap_pair_sut``); a campaign reaches the
second as ``module:test_v0_compare_and_shrink:make_lost_swap_pair_sut``.
"""

import json
from pathlib import Path

import pytest

from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.checking.replay import FAIL, PASS, UNKNOWN, replay
from schedconf.conformance.checking.shrink import shrink_trace
from schedconf.conformance.runs.campaign import CampaignSpec, run_campaign
from schedconf.conformance.traces.trace import read_trace
from schedconf.conformance.workloads.workload import AbortSpec, run_workload
from schedconf.conformance.workloads.workload_v0 import example_v0_swap

HERE = Path(__file__).parent


class WrongBlockSut(ReferenceSut):
    """The reference, but a scheduled group with three or more blocks reports its last block id wrong."""

    name = "v0-wrong-block"

    def schedule(self):
        out = super().schedule()
        for group in out.get("scheduled_seq_groups", []):
            if len(group["block_table"]) >= 3:
                group["block_table"] = [*group["block_table"][:-1], group["block_table"][-1] + 1000]
                break
        return out


class LostSwapPairSut(ReferenceSut):
    """The reference, but the last pair of every swap-out is missing from its output."""

    name = "v0-lost-swap-pair"

    def schedule(self):
        out = super().schedule()
        if out.get("blocks_to_swap_out"):
            out["blocks_to_swap_out"] = out["blocks_to_swap_out"][:-1]
        return out


def make_wrong_block_sut():
    return WrongBlockSut()


def make_lost_swap_pair_sut():
    return LostSwapPairSut()


@pytest.fixture(scope="module")
def swap_trace():
    # r1 decodes into a third block at step 3; r2 is swapped out at step 2 (two pairs), then in.
    return run_workload(example_v0_swap())


def test_the_reference_passes_its_own_trace(swap_trace):
    assert replay(swap_trace, ReferenceSut(), "strict").verdict == PASS


def test_a_wrong_block_id_is_a_block_table_divergence(swap_trace):
    result = replay(swap_trace, WrongBlockSut(), "strict")
    d = result.divergence
    assert result.verdict == FAIL and d.kind == "scheduler_output"
    assert d.signature() == "scheduler_output:scheduled_seq_groups.block_table"
    step = swap_trace.events[d.event_index]
    assert step["kind"] == "step" and d.step == step["step"] == 3 and d.line == d.event_index + 2
    assert [x.field for x in d.diffs] == ["scheduled_seq_groups[0].block_table"]
    expected = step["expect"]["scheduled_seq_groups"][0]["block_table"]
    assert d.diffs[0].expected == expected and d.diffs[0].actual == [*expected[:-1], expected[-1] + 1000]


def test_a_missing_swap_pair_is_a_swap_out_divergence(swap_trace):
    for comparison in ("strict", "observable"):
        result = replay(swap_trace, LostSwapPairSut(), comparison)
        d = result.divergence
        assert result.verdict == FAIL, comparison
        assert d.signature() == "scheduler_output:blocks_to_swap_out" and d.step == 2, comparison
        assert d.diffs[0].expected == [[2, 0], [3, 1]] and d.diffs[0].actual == [[2, 0]]


def test_the_safety_comparison_says_unknown_for_a_v0_trace(swap_trace):
    result = replay(swap_trace, ReferenceSut(), "safety")
    assert result.verdict == UNKNOWN and "v1 schedulers" in result.detail


def test_observable_accepts_renamed_blocks_and_catches_a_wrong_count(swap_trace):
    class Renamed(ReferenceSut):
        def schedule(self):  # every GPU block id shifted by 10: one consistent renaming
            out = super().schedule()
            for g in out["scheduled_seq_groups"]:
                g["block_table"] = [b + 10 for b in g["block_table"]]
            return out

    class LongerChunk(ReferenceSut):
        def schedule(self):
            out = super().schedule()
            for g in out["scheduled_seq_groups"]:
                g["token_chunk_size"] += 1
            return out

    assert replay(swap_trace, Renamed(), "observable").verdict == PASS
    assert (
        replay(swap_trace, Renamed(), "strict").divergence.signature()
        == "scheduler_output:scheduled_seq_groups.block_table"
    )
    d = replay(swap_trace, LongerChunk(), "observable").divergence
    assert d.signature() == "scheduler_output:scheduled_seq_groups.token_chunk_size" and d.step == 1


def test_a_v0_failure_shrinks_to_a_smaller_v0_trace_of_the_same_kind():
    # The swap example plus noise the shrinker should remove: a third request and an abort of it.
    workload = example_v0_swap()
    from schedconf.conformance.workloads.workload import RequestSpec

    workload = workload.replace(
        requests=(*workload.requests, RequestSpec("r3", tuple(range(40, 45)), max_tokens=3, eos_token_id=0, at_step=1)),
        aborts=(AbortSpec("r3", 4),),
    )
    trace = run_workload(workload)
    sut = LostSwapPairSut()
    original = replay(trace, sut, "strict")
    assert original.divergence.signature() == "scheduler_output:blocks_to_swap_out"
    result = shrink_trace(trace, sut, "strict", time_budget_s=60)
    assert result.trace.scheduler == "v0" and result.trace.header["origin"] == "shrink"
    assert result.num_events < len(trace.events)
    assert result.divergence.signature() == "scheduler_output:blocks_to_swap_out"
    # the minimal trace still fails the same way, and the reference passes it
    again = replay(result.trace, LostSwapPairSut(), "strict")
    assert again.verdict == FAIL and again.divergence.signature() == "scheduler_output:blocks_to_swap_out"
    assert replay(result.trace, ReferenceSut(), "strict").verdict == PASS
    # One request is enough: in a pool it fills, its first decode finds no free block (v0's
    # can_append_slots reserves one per decode) and it swaps itself out: add, step, output, step.
    assert [e["kind"] for e in result.trace.events] == ["add_request", "step", "model_output", "step"]
    assert result.trace.events[-1]["expect"]["preempted"] == 1


def test_a_v0_campaign_finds_and_shrinks_the_lost_swap_pair(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    summary = run_campaign(
        CampaignSpec(
            sut="module:test_v0_compare_and_shrink:make_lost_swap_pair_sut",
            profile="vllm-0.10",
            examples=30,
            seed=1,
            out_dir=str(tmp_path),
            run_id="lost",
            quiet=True,
            shrink_budget_s=8,
        )
    )
    assert summary["status"] == "fail" and summary["failed"] >= 1
    first = summary["failures"][0]
    assert first["signature"] == "scheduler_output:blocks_to_swap_out"
    assert first["shrunk_file"] and first["shrunk_events"] <= first["events"]
    minimal = read_trace(tmp_path / "lost" / first["shrunk_file"])
    assert minimal.scheduler == "v0"
    assert replay(minimal, LostSwapPairSut(), "strict").divergence.signature() == "scheduler_output:blocks_to_swap_out"
    html = (tmp_path / "lost" / "report.html").read_text()
    assert "v0 steps of the smallest trace" in html and "out gpu-&gt;cpu" in html
    md = (tmp_path / "lost" / "summary.md").read_text()
    assert "## v0 coverage" in md and "| swap_out |" in md
    assert json.loads((tmp_path / "lost" / "summary.json").read_text())["coverage"]["swap_out"] > 0
