"""The v0 golden scenario files: each block's output must match, invariants checked after every command."""

from pathlib import Path

import pytest

from schedconf.conformance.workloads.datadriven_v0 import run_file

SCENARIOS = sorted((Path(__file__).parents[2] / "conformance" / "testdata" / "scenarios_v0").glob("*.txt"))


def test_scenarios_exist():
    # One scenario per rule the issue lists (issue 11, part 1).
    names = {p.stem for p in SCENARIOS}
    for required in (
        "default_prefill_first",
        "notes_11_simple_schedule",
        "notes_11_prefill_prioritized",
        "notes_11_preempt_and_abort",
        "notes_11_max_num_seqs",
        "notes_11_prefix_caching_aware_prefills",
        "notes_11_chunked_prefill_prefix_caching",
        "budget_seats_precounted",
        "watermark_and_never",
        "later_head_of_line",
        "prompt_over_limit_ignored",
        "recompute_preemption",
        "swap_out_swap_in",
        "swap_space_exhausted",
        "swap_in_never_ignored",
        "chunked_partial_prefills",
        "priority_preemption",
        "stop_checker_order",
        "abort_each_queue",
        "evictor_order",
        "bad_input",
    ):
        assert required in names, required


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_scenario(path):
    failures = run_file(path, rewrite=False)
    assert not failures, "\n\n".join(failures)
