"""The block-id properties of ``--comparison safety``: ids within the pool, and the reported tables.

``block_ids``: every block id a SchedulerOutput hands out, and every id in
``observe()``'s ``block_tables`` and free queue, is a usable block of the
pool (``1..num_gpu_blocks - 1``; block 0 is the null block). ``block_tables``:
the tables ``observe()`` reports equal the tables the SchedulerOutputs built.
A scheduler that numbers its blocks from 100000 upwards, or one that reports
tables other than those it handed out, fails them (the two schedulers below;
``tests/harness/test_safety.py`` runs them with the other broken schedulers).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.checking.replay import FAIL, PASS, replay
from schedconf.conformance.checking.safety.properties import (
    RequestRecord,
    check_block_ids,
    check_block_tables,
    check_observed_block_ids,
)
from schedconf.conformance.runs.campaign import CampaignSpec, run_campaign
from schedconf.conformance.traces.trace import read_trace

sys.path.insert(0, str(Path(__file__).parent))

OFFSET = 100_000


def _shift(ids: list[int]) -> list[int]:
    return [b + OFFSET for b in ids]


class OffsetBlockIdsSut(ReferenceSut):
    """The reference with every block id moved up by 100000, in its outputs and in observe() alike (block_ids)."""

    def schedule(self) -> dict[str, Any]:
        out = super().schedule()
        for r in out["scheduled_new_reqs"]:
            r["block_ids"] = _shift(r["block_ids"])
        for r in out["scheduled_cached_reqs"]:
            r["new_block_ids"] = _shift(r["new_block_ids"])
        return out

    def observe(self) -> dict[str, Any] | None:
        obs = super().observe()
        assert obs is not None
        obs["free_block_queue"] = _shift(obs["free_block_queue"])
        obs["block_tables"] = {rid: _shift(t) for rid, t in obs["block_tables"].items()}
        return obs


class SwappedTablesSut(ReferenceSut):
    """Reports every table of two or more blocks with its first two blocks swapped (block_tables): the same
    blocks held and free, so conservation holds; without prefix caching no block is shared, so exclusivity
    holds too."""

    def observe(self) -> dict[str, Any] | None:
        obs = super().observe()
        assert obs is not None
        obs["block_tables"] = {
            rid: [t[1], t[0], *t[2:]] if len(t) >= 2 else t for rid, t in obs["block_tables"].items()
        }
        return obs


def _step(new: list[tuple[str, list[int]]], cached: list[tuple[str, list[int]]] = ()) -> dict[str, Any]:
    return {
        "scheduled_new_reqs": [{"req_id": r, "block_ids": b, "num_computed_tokens": 0} for r, b in new],
        "scheduled_cached_reqs": [
            {"req_id": r, "new_block_ids": b, "resumed": False, "num_computed_tokens": 4, "num_output_tokens": 1}
            for r, b in cached
        ],
        "num_scheduled_tokens": {},
    }


# ------------------------------------------------------------------ the checks themselves


def test_block_ids_are_the_usable_blocks_of_the_pool():
    # a pool of 9 blocks: the null block 0 and the usable 1..8
    assert check_block_ids(_step([("r0", [1, 8])], [("r1", [2])]), 9) == []
    for bad, why in ((9, ""), (0, "null block"), (-1, ""), (100_001, ""), (True, "")):
        problems = check_block_ids(_step([("r0", [1])], [("r1", [2, bad])]), 9)
        assert len(problems) == 1, bad
        assert f"request 'r1' has block {bad!r} (scheduled_cached_reqs new_block_ids)" in problems[0]
        assert "outside the pool's usable blocks 1..8" in problems[0] and why in problems[0]


def test_observed_ids_in_tables_and_free_queue_are_the_usable_blocks():
    assert check_observed_block_ids({"r0": [1, 2]}, [3, 4, 5, 6, 7, 8], 9) == []
    assert check_observed_block_ids(None, None, 9) == []
    table = check_observed_block_ids({"r0": [1, 9]}, [2], 9)
    assert len(table) == 1 and "request 'r0' has block 9 (observe block_tables)" in table[0]
    free = check_observed_block_ids({"r0": [1]}, [0, 2], 9)
    assert len(free) == 1 and "the free queue has block 0 (observe free_block_queue)" in free[0]
    assert "null block" in free[0]


def _record(rid: str, table: list[int], ended: str | None = None) -> RequestRecord:
    return RequestRecord(rid, [5, 6, 7], 3, 4, 0, None, (), 0, table=table, ended=ended)


def test_reported_tables_must_equal_the_handed_out_ones():
    records = {"a": _record("a", [3, 4]), "b": _record("b", []), "c": _record("c", [5], ended="aborted")}
    # b was given no block yet (it may hold some); c ended (blocks_return looks at it)
    assert check_block_tables({"a": [3, 4], "b": [6], "c": [5]}, records) == []
    swapped = check_block_tables({"a": [4, 3]}, records)
    assert len(swapped) == 1 and "'a': observe() reports block table [4, 3]" in swapped[0]
    assert "handed out [3, 4]" in swapped[0]
    assert len(check_block_tables({"a": [3]}, records)) == 1
    # missing counts as empty when the release reports preemptions; without them (0.11) it may be preempted
    assert len(check_block_tables({}, records)) == 1
    assert check_block_tables({}, records, preemptions_reported=False) == []
    assert len(check_block_tables({"a": [3, 5]}, records, preemptions_reported=False)) == 1


# ------------------------------------------------------------------ broken schedulers in campaigns


@pytest.mark.parametrize(
    ("name", "prop", "overrides"),
    [
        ("OffsetBlockIdsSut", "block_ids", {}),
        ("SwappedTablesSut", "block_tables", {"enable_prefix_caching": False}),
    ],
)
def test_a_broken_scheduler_fails_a_safety_campaign_by_the_property(name, prop, overrides, tmp_path):
    """Every trace that schedules a request (the offset ids) or a request of two blocks (the swapped
    tables) fails, by the property's name; the minimal trace fails the same way."""
    summary = run_campaign(
        CampaignSpec(
            sut=f"module:test_safety_block_ids:{name}",
            examples=30,
            seed=1,
            comparison="safety",
            out_dir=str(tmp_path),
            quiet=True,
            shrink_budget_s=10,
            config_overrides=overrides,
        )
    )
    sections = {f["section"] for f in summary["failures"]}
    assert f"safety:{prop}" in sections and summary["failed"] >= 10, sections
    # besides: the engine's own modelled crash (vLLM 0.32/0.33's padded admission), never another safety property
    assert sections <= {f"safety:{prop}", "sut_error:error"}, sections
    first = next(f for f in summary["failures"] if f["section"] == f"safety:{prop}")
    assert first.get("shrunk_file"), first
    minimal = read_trace(str(Path(summary["run_dir"]) / first["shrunk_file"]))
    sut = OffsetBlockIdsSut() if name == "OffsetBlockIdsSut" else SwappedTablesSut()
    again = replay(minimal, sut, "safety")
    assert again.verdict == FAIL and again.divergence.section() == f"safety:{prop}"
    if prop == "block_ids":
        assert f"outside the pool's usable blocks 1..{minimal.config['num_gpu_blocks'] - 1}" in again.divergence.message
    # the same traces pass on the reference
    assert replay(minimal, ReferenceSut(), "safety").verdict == PASS


def test_checks_md_has_a_row_for_every_property():
    from schedconf.conformance.checking.safety.properties import PROPERTIES

    text = (Path(__file__).parents[2] / "conformance" / "CHECKS.md").read_text()
    assert [p for p in PROPERTIES if f"| `{p}` |" not in text] == []
