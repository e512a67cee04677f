"""Findings V1-V6 of vLLM 0.10.2's legacy v0 scheduler: their standalone reproductions fail on 0.10.2.

Marked ``vllm``. A missing environment is built (``ensure_vllm_env("0.10.2")``),
never skipped, as in ``test_vllm_v0.py``. Each file
``reports/findings/repro_v<N>_vllm_0_10_2.py`` is written for a vLLM maintainer:
vLLM's own API only, asserting the correct behaviour. What is checked, per file:

* it imports only vLLM, pytest and the standard library (its source parsed),
  and does not touch ``sys.path``;
* copied to a folder outside the checkout and run with the release's
  interpreter and no ``PYTHONPATH`` (``python FILE``: its ``__main__`` block
  runs every test), it exits 1, every test FAILs, and the output carries the
  plain-words message of the bug.

V5's second test (a block hash differs from process to process) fails only
where the kernel randomises addresses (``/proc/sys/kernel/randomize_va_space``
not 0): ``hash(None)`` is the address of None on Python 3.11. Without that,
the file's first test still fails and the second passes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from standalone_files import get_imported_top_names, run_standalone

from schedconf.conformance.engines.engine_env import REPO_ROOT
from schedconf.conformance.engines.vllm_env import ensure_vllm_env

pytestmark = pytest.mark.vllm

VERSION = "0.10.2"
FINDINGS = REPO_ROOT / "reports" / "findings"
ALLOWED_IMPORTS = {"vllm", "pytest"}
RUN_TIMEOUT_S = 120

# finding -> (number of tests in the file, fragments its output must contain)
EXPECTED: dict[str, tuple[int, list[str]]] = {
    "v1": (
        2,
        [
            "Rule broken at step 2 [preempted_group_is_waiting_or_swapped]: request 'a' is in Scheduler.waiting but its "
            "sequence is SWAPPED, its KV mapped to CPU block(s) [0]",
            "Rule broken at step 3 [engine_survives]: Scheduler.schedule() raised AssertionError('Waiting sequence group "
            "should have only one prompt sequence.') in _schedule_prefills (vllm/core/scheduler.py:1078)",
        ],
    ),
    "v2": (
        1,
        [
            "Rule broken at step 2 [abort_of_a_swapped_request]: Scheduler.abort_seq_group('b') raised KeyError('2') in "
            "mark_blocks_as_accessed (vllm/core/block/prefix_caching_block.py:573)",
        ],
    ),
    "v3": (
        1,
        [
            "Rule broken at step 3 [blocks_return_to_the_pool]: no request is left ('r' FINISHED_IGNORED), yet only 1 of "
            "4 CPU blocks are free after Scheduler.abort_seq_group: the block manager still holds the block tables "
            "{'r': [3, 4, 5]}",
        ],
    ),
    "v4": (
        2,
        [
            "Rule broken at step 100 [a_lone_request_that_fits_finishes]: preemption_mode 'recompute': after 100 steps "
            "request 'a'",
            "is WAITING with 0 outputs; steps 1-6: [4 tok, 0 tok +preempted, 4 tok, 0 tok +preempted, 4 tok, 0 tok "
            "+preempted]",
            "Rule broken at step 100 [a_lone_request_that_fits_finishes]: preemption_mode 'swap': after 100 steps "
            "request 'a'",
            "is SWAPPED with 0 outputs; steps 1-6: [4 tok, 0 tok +preempted +swap-out 4, 0 tok, 0 tok, 0 tok, 0 tok]",
        ],
    ),
    "v5": (
        2,
        [
            "FAIL test_evict_returns_the_content_the_block_holds_now: LRUEvictor.evict() returned block 7 with the "
            "content hash it held before",
            "a stale heap entry tied with the live one on (last_accessed -1, num_hashed_tokens 4)",
        ],
    ),
    "v6": (
        2,
        [
            "Rule broken at step 11 [engine_survives]: Scheduler.schedule() raised AssertionError('') in remove_seq "
            "(vllm/core/block/prefix_caching_block.py:1086). Request 'r2', swapped out as a decode at step 9",
            'Rule broken at step 4 [engine_survives]: Scheduler.schedule() raised AssertionError("Number of cached tokens '
            "should not be less than the number of computed tokens for a sequence that's still in prefill. But there are "
            '0 cached tokens and 4 computed tokens for sequence 1.") in _get_num_new_uncached_and_cached_tokens '
            "(vllm/core/scheduler.py:1939)",
        ],
    ),
}


def is_address_space_randomised() -> bool:
    try:
        return Path("/proc/sys/kernel/randomize_va_space").read_text().strip() != "0"
    except OSError:
        return True


def repro_path(finding: str) -> Path:
    return FINDINGS / f"repro_{finding}_vllm_0_10_2.py"


@pytest.mark.parametrize("finding", sorted(EXPECTED))
def test_the_reproduction_imports_only_vllm_pytest_and_the_standard_library(finding: str) -> None:
    source = repro_path(finding).read_text(encoding="utf-8")
    foreign = sorted(
        n for n in get_imported_top_names(source) if n not in ALLOWED_IMPORTS and n not in sys.stdlib_module_names
    )
    assert foreign == [], f"{repro_path(finding).name} imports {foreign}"
    assert "sys.path" not in source and "importlib" not in source, f"{repro_path(finding).name} touches the import path"


@pytest.mark.parametrize("finding", sorted(EXPECTED))
def test_the_reproduction_fails_on_0_10_2_with_its_message(finding: str, tmp_path: Path) -> None:
    """Run from a folder outside the checkout with the release's interpreter: no schedconf on the path."""
    python = ensure_vllm_env(VERSION)
    proc = run_standalone(python, repro_path(finding), tmp_path, RUN_TIMEOUT_S)
    num_tests, fragments = EXPECTED[finding]
    output = proc.stdout
    assert proc.returncode == 1, output[-4000:]
    verdicts = [line.split()[0] for line in output.splitlines() if line.startswith(("PASS test_", "FAIL test_"))]
    expected = ["FAIL"] * num_tests
    if finding == "v5" and not is_address_space_randomised():
        expected[1] = "PASS"  # hash(None) is then the same in every process
    assert verdicts == expected, output[-4000:]
    for fragment in fragments:
        assert fragment in output, f"missing {fragment!r} in:\n{output[-4000:]}"
