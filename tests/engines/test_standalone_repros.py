"""The reproductions of the other engines' findings stand alone and still fail where the bug is.

``reports/findings/repro_*.py`` for Aphrodite, LMDeploy, nano-vllm and SGLang
are written for those engines' maintainers: each imports only its engine and
the standard library, and each ``test_*`` function asserts the correct
behaviour, so it fails while the bug exists. (The vLLM files, written by
``schedconf repro``, are run by ``tests/vllm/test_vllm_repro.py``.)

Two checks per file. Statically, with no engine: the file imports nothing of
this project (``conformance``, ``spec``, ``impl``, ``schedconf``) and does not
put the checkout on ``sys.path``. Then, marked ``engines``, it is copied out of
the checkout and run as ``python FILE`` with the engine environment's
interpreter (built first by ``ensure_env`` if missing; these environments have
no pytest, so each file runs its own tests under ``__main__``), without
``PYTHONPATH``: it must exit 1, with one ``FAIL test_name: message`` line per
bug carrying the expected explanation, and a ``PASS`` line for the one
by-design observation (SGLang's ``ignore_eos`` ignoring ``stop_token_ids``).
A fixed bug (exit 0, a ``PASS`` line) or a file that no longer runs (an
``ERROR`` line, a traceback) fails here. Each file takes 2-20 s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from standalone_files import get_imported_top_names, run_standalone

from schedconf.conformance.engines.engine_env import REPO_ROOT, ensure_env, env_python

FINDINGS = REPO_ROOT / "reports" / "findings"
PROJECT_PACKAGES = {"conformance", "spec", "impl", "schedconf"}
RUN_TIMEOUT_S = 300.0
RESULT_LINE = re.compile(r"^(PASS|FAIL|ERROR) (test_\w+)", re.MULTILINE)


@dataclass(frozen=True)
class Repro:
    """One committed reproduction: where it runs and what each of its tests must print."""

    name: str
    family: str
    version: str
    expected: dict[str, str]
    """test function -> ``"PASS"`` (a by-design observation) or a fragment of its ``FAIL`` message."""


REPROS = [
    Repro(
        "repro_aphrodite_0_24_1_lone_padded_admission.py",
        "aphrodite",
        "0.24.1",
        {
            "test_a_lone_request_with_a_prefix_hit_does_not_crash_the_scheduler": "Aphrodite's schedule() crashed on a lone request: AssertionError at "
            "aphrodite/v1/core/sched/scheduler.py:1102 (assert num_new_tokens == 1 + self.num_spec_tokens)"
        },
    ),
    Repro(
        "repro_f7_aphrodite_0_24_1.py",
        "aphrodite",
        "0.24.1",
        {
            "test_prefix_hit_kv_was_computed": "Rule broken at step 6 [prefix_hit_kv_was_computed]: request 'r0' is scheduled with 20 computed "
            "tokens (a prefix-cache hit or tokens kept from earlier steps), but block 3, which holds its tokens "
            "16-19, has no KV computed for its token 16"
        },
    ),
    Repro(
        "repro_lmdeploy_0_18_0_prealloc_liveness.py",
        "lmdeploy",
        "0.18.0",
        {
            "test_a_request_within_the_session_length_is_admitted": "a 40-token prompt with max_new_tokens 8 fits the engine's session length of 48 tokens, yet 1000 "
            "prefill turns on an idle engine admitted nothing: with prefill_interval 32 > block_size 16 it needs "
            "5 blocks"
        },
    ),
    Repro(
        "repro_nanovllm_20260210.py",
        "nano-vllm",
        "20260210",
        {
            "test_a_preempted_sequence_leaves_the_running_queue": "b was preempted (WAITING, blocks freed, at the front of waiting) but is still in Scheduler.running",
            "test_a_wholly_cached_prompt_still_computes_a_token": "the prompt of 8 tokens is wholly served from the prefix cache (num_cached_tokens=8)",
            "test_a_guidance_pair_keeps_the_batch_within_max_num_seqs": "the prefill batch holds 4 sequences with max_num_seqs=3",
        },
    ),
    Repro(
        "repro_sglang_0_5_23.py",
        "sglang",
        "0.5.23",
        {
            "test_an_ignore_eos_request_that_intake_accepts_is_admitted": "PrefillAdder.add_one_req answered AddReqResult.NO_TOKEN for an ignore_eos request on an EMPTY pool",
            "test_the_ignore_eos_path_keeps_max_prefill_tokens": "one prefill batch admitted ['e', 'f'] = 5 prompt tokens under max_prefill_tokens=4",
            "test_by_design_ignore_eos_also_ignores_stop_token_ids": "PASS",
        },
    ),
]
IDS = [r.name for r in REPROS]


def test_every_other_engine_repro_is_checked_here():
    """A new non-vLLM reproduction must be added to REPROS (the vLLM ones, ``repro_*_vllm_*.py``, are run by
    tests/vllm/test_vllm_repro.py)."""
    others = {p.name for p in FINDINGS.glob("repro_*.py") if "_vllm_" not in p.name}
    assert others == set(IDS)


@pytest.mark.parametrize("repro", REPROS, ids=IDS)
def test_the_repro_imports_nothing_of_this_project(repro: Repro):
    text = (FINDINGS / repro.name).read_text()
    imported = get_imported_top_names(text)
    assert imported, "no import found: the parser missed them"
    assert not imported & (PROJECT_PACKAGES | {"."}), f"{repro.name} imports {sorted(imported & PROJECT_PACKAGES)}"
    assert "pytest" not in imported, "the engine environments have no pytest: the file must run without it"
    assert "sys.path" not in text and "SCHEDCONF" not in text, "the file must not reach into the checkout"
    assert 'if __name__ == "__main__":' in text


@pytest.mark.engines
@pytest.mark.parametrize("repro", REPROS, ids=IDS)
def test_the_repro_fails_in_its_engine_environment(repro: Repro, tmp_path):
    python = ensure_env(repro.family, repro.version)
    assert python == env_python(repro.family, repro.version)
    proc = run_standalone(python, FINDINGS / repro.name, tmp_path, RUN_TIMEOUT_S)
    out = proc.stdout
    results = {name: verdict for verdict, name in RESULT_LINE.findall(out)}
    assert results == {name: ("PASS" if want == "PASS" else "FAIL") for name, want in repro.expected.items()}, out
    for name, want in repro.expected.items():
        if want != "PASS":
            line = next(ln for ln in out.splitlines() if ln.startswith(f"FAIL {name}: "))
            assert want in line, line
    assert proc.returncode == 1, out
