"""Campaigns carry refused configs: a share of generated workloads is a config one step past a start-up limit.

``conformance/workloads/generate.py`` ``choose_refused_config`` replaces about
``REFUSED_CONFIG_RATE`` (4%) of a campaign's workloads by their own config
taken one step past one of the rules of ``conformance/workloads/config_limits.py``
(``PAST_THE_LIMIT``, ``V0_PAST_THE_LIMIT``), with the campaign's overrides
still in force; the trace is the header expecting the rule's code. A
scheduler that starts on such a config fails them at the header, under every
comparison, while the workloads kept are those the seed drew before.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.conformance.runs.campaign import CampaignSpec, _apply_overrides, _draw, generate_workloads, run_campaign
from schedconf.conformance.sut import SutInputError
from schedconf.conformance.traces.trace import parse_trace_text, render_trace
from schedconf.conformance.workloads.config_limits import (
    BASE_CONFIG,
    PAST_THE_LIMIT,
    V0_BASE_CONFIG,
    V0_PAST_THE_LIMIT,
    get_refusal,
    get_refused_variants,
    get_v0_refusal,
)
from schedconf.conformance.workloads.generate import REFUSED_CONFIG_RATE
from schedconf.conformance.workloads.workload import RefusedConfigWorkload, is_v0_profile, run_workload

EXAMPLES = 1500


class AcceptsEveryConfig(ReferenceSut):
    """The reference, except that start() swallows the config's refusal: it starts on anything."""

    def start(self, config, profile):
        try:
            super().start(config, profile)
        except SutInputError:
            self.scheduler = None


class ForcesFields(AcceptsEveryConfig):
    """As :class:`AcceptsEveryConfig`, with fields it cannot run forced to the value it can."""

    forced_config = {"long_prefill_token_threshold": 0, "num_lookahead_tokens": 0}


@pytest.fixture(scope="module", params=["vllm-0.33", "vllm-0.11", "vllm-0.10"])
def drawn(request):
    """(profile, the campaign's workloads, the workloads the seed drew before any was refused)."""
    spec = CampaignSpec(sut="reference", profile=request.param, examples=EXAMPLES, seed=0)
    return request.param, generate_workloads(spec), _apply_overrides(spec, _draw(spec))


def _refused(workloads):
    return [(i, w) for i, w in enumerate(workloads) if isinstance(w, RefusedConfigWorkload)]


def test_a_share_of_the_workloads_is_refused_the_rest_unchanged(drawn):
    profile, workloads, before = drawn
    refused = _refused(workloads)
    share = len(refused) / EXAMPLES
    assert REFUSED_CONFIG_RATE - 0.015 <= share <= REFUSED_CONFIG_RATE + 0.015, share
    assert 0 not in dict(refused)  # the first is the report's sample trace
    changed = [i for i, (w, b) in enumerate(zip(workloads, before)) if w != b]
    assert changed == [i for i, _ in refused]  # every other workload is the seed's draw, byte for byte
    assert all(w.seed == before[i].seed and w.profile == profile for i, w in refused)
    rules = Counter(w.rule for _, w in refused)
    table = {rule for rule, _, _ in (V0_PAST_THE_LIMIT if is_v0_profile(profile) else PAST_THE_LIMIT)}
    assert set(rules) <= table and len(rules) >= len(table) - 3, rules  # spread over the rules
    if profile == "vllm-0.11":
        assert "threshold_vs_max_model_len" not in rules  # 0.11 accepts a threshold above max_model_len


def _is_one_step_from_accepted(config: dict, profile: str) -> bool:
    """Some integer field one unit up or down gives a config the model accepts."""
    refusal = get_v0_refusal if is_v0_profile(profile) else get_refusal
    for name, value in config.items():
        if isinstance(value, int) and not isinstance(value, bool):
            if any(refusal({**config, name: value + d}, profile) is None for d in (-1, 1)):
                return True
    return False


def test_each_refused_trace_is_one_step_past_a_limit_and_refused_with_its_code(drawn):
    profile, workloads, _ = drawn
    for _, w in _refused(workloads):
        trace = run_workload(w)
        assert trace.events == [] and trace.header["expect_error"] == w.code
        # the written form reads back: the header's expect_error is the code the model refuses it with
        again = parse_trace_text(render_trace(trace), f"{w.rule}.jsonl")
        assert again.header["expect_error"] == w.code and again.profile == profile
        assert (again.scheduler == "v0") == is_v0_profile(profile)
        assert _is_one_step_from_accepted(w.config, profile), (w.rule, w.config)


@pytest.mark.parametrize(
    ("profile", "base", "table"),
    [("vllm-0.33", BASE_CONFIG.to_dict(), PAST_THE_LIMIT), ("vllm-0.10", V0_BASE_CONFIG, V0_PAST_THE_LIMIT)],
)
def test_every_rule_of_the_table_can_be_drawn(profile, base, table):
    """The corpus's base config can be taken past every rule its profile enforces, with the rule's code."""
    variants = get_refused_variants(base, profile)
    assert [(rule, code) for rule, _, code in variants] == [(rule, code) for rule, _, code in table]


def test_optional_fields_at_their_defaults_stay_out_of_the_header():
    """A scheduler that predates the optional fields (forced to their defaults) must see none of them: it
    would refuse the config as unknown_config_field, not with the rule's code."""
    from schedconf.spec.v1.config import OPTIONAL_FIELDS

    variants = get_refused_variants(BASE_CONFIG.to_dict(), "vllm-0.33", dict(OPTIONAL_FIELDS))
    assert len(variants) == len(PAST_THE_LIMIT)
    assert all(not set(config) & set(OPTIONAL_FIELDS) for _, config, _ in variants)


def test_overrides_stay_in_force_and_rules_they_undo_are_not_drawn():
    overrides = {"max_num_seqs": 2, "enable_prefix_caching": False}
    spec = CampaignSpec(sut="reference", examples=EXAMPLES, seed=0, config_overrides=overrides)
    refused = [w for _, w in _refused(generate_workloads(spec))]
    assert len(refused) >= 30
    assert all(w.config["max_num_seqs"] == 2 and w.config["enable_prefix_caching"] is False for w in refused)
    # one step past max_num_seqs, or past the seat-per-token rule through max_num_seqs, is undone by --set;
    # a budget of 0 needs a budget of 1 with one seat at the limit, which --set max_num_seqs=2 refuses
    assert not {w.rule for w in refused} & {"max_num_seqs", "budget_vs_max_num_seqs", "max_num_batched_tokens"}


def test_a_forced_config_of_the_scheduler_stays_in_force(tmp_path):
    summary = run_campaign(
        CampaignSpec(
            sut="module:test_refused_generated:ForcesFields",
            examples=400,
            seed=2,
            out_dir=str(tmp_path),
            quiet=True,
            shrink_budget_s=0,
        )
    )
    assert summary["failed"] == summary["features"]["refused_config"] >= 8
    from schedconf.conformance.traces.trace import read_trace

    configs = [read_trace(Path(summary["run_dir"]) / f["trace_file"]).config for f in summary["failures"]]
    assert all(c["long_prefill_token_threshold"] == 0 and c["num_lookahead_tokens"] == 0 for c in configs)


@pytest.mark.parametrize("comparison", ["strict", "observable", "safety"])
@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10"])
def test_a_scheduler_that_starts_on_any_config_fails_at_the_header(comparison, profile, tmp_path):
    """It runs every other trace as the reference does; each refused config fails at init (line 1)."""
    summary = run_campaign(
        CampaignSpec(
            sut="module:test_refused_generated:AcceptsEveryConfig",
            profile=profile,
            examples=80,
            seed=1,
            comparison=comparison,
            out_dir=str(tmp_path),
            quiet=True,
            shrink_budget_s=0,
        )
    )
    refused = summary["features"].get("refused_config", 0)
    assert refused >= 2 and summary["failed"] == refused, summary["failures"]
    assert summary["feature_shares"]["refused_config"] == round(refused / 80, 3)
    for f in summary["failures"]:
        assert f["section"] == "input_error:error" and f["line"] == 1 and f["step"] is None, f
        assert "init: expected error " in f["message"] and "the scheduler accepted the config" in f["message"]
    reference = run_campaign(
        CampaignSpec(
            sut="reference",
            profile=profile,
            examples=80,
            seed=1,
            comparison=comparison,
            out_dir=str(tmp_path),
            quiet=True,
            shrink_budget_s=0,
        )
    )
    assert reference["failed"] == 0 and reference["features"]["refused_config"] == refused


def test_the_refused_trace_of_a_workload_is_its_header_alone():
    w = RefusedConfigWorkload(
        config={**BASE_CONFIG.to_dict(), "block_size": 0},
        profile="vllm-0.33",
        rule="block_size",
        code="invalid_block_size",
        seed=7,
        origin="generate",
    )
    trace = run_workload(w)
    assert trace.events == [] and trace.header["seed"] == 7 and trace.header["config"]["block_size"] == 0
    assert "block_size limit" in trace.header["description"]
    assert run_workload(replace(w, origin="x")).header["origin"] == "x"


def test_refused_config_passes_alone_are_not_a_passing_run():
    """A scheduler that answers unsupported to every config it would run, and refuses the configs one step past
    a limit, has shown nothing of its schedules: its run is unknown (exit 2), as a run of all-unknown traces is."""
    from schedconf.conformance.runs.campaign import TraceOutcome, _account, _finish, exit_code

    def run(verdicts: list[tuple[str, list[str]]], tmp: Path) -> dict:
        summary = {
            "examples_run": 0,
            "passed": 0,
            "failed": 0,
            "unknown": 0,
            "discarded": 0,
            "interrupted": False,
            "failures": [],
            "unknowns": [],
            "features": {},
            "spec": {"profile": "vllm-0.33"},
            "replay_s": 1.0,
        }
        outcomes = [
            TraceOutcome(index=i, verdict=v, steps=0, events=0, features=f) for i, (v, f) in enumerate(verdicts)
        ]
        for o in outcomes:
            _account(summary, o, tmp, [])
        _finish(summary, outcomes, 0.0)
        return summary

    refused, unknown, plain = ("pass", ["refused_config"]), ("unknown", []), ("pass", [])
    only_refusals = run([refused, refused, unknown, unknown, unknown], Path(tempfile.mkdtemp()))
    assert only_refusals["status"] == "unknown" and exit_code(only_refusals) == 2
    with_a_real_pass = run([refused, plain, unknown], Path(tempfile.mkdtemp()))
    assert with_a_real_pass["status"] == "pass" and exit_code(with_a_real_pass) == 0
    all_refusals = run([refused, refused], Path(tempfile.mkdtemp()))  # no unknown: every trace checked and passed
    assert all_refusals["status"] == "pass"
