"""``schedconf diff`` on a real pair: vLLM 0.32.0 against 0.33.0 differ exactly as their profiles say.

The reference under the two profiles, on the same generated traces (with the
config the vLLM adapter forces: no lookahead), is the expectation: the diff of
the real releases must find the same groups on the same traces. What those
groups are is pinned by tests/harness/test_diff.py: the one knob of the two
profiles that one-token steps can show, ``priority_self_preemption``.
"""

from __future__ import annotations

import dataclasses

import pytest

from schedconf.conformance.engines.vllm_env import ensure_vllm_env
from schedconf.conformance.runs.diff import DiffSpec, run_diff

pytestmark = pytest.mark.vllm


def test_the_real_releases_differ_as_their_profiles_do():
    for version in ("0.32.0", "0.33.0"):
        ensure_vllm_env(version)
    real = DiffSpec(
        sut="vllm-v1@0.32.0",
        against="vllm-v1@0.33.0",
        profile="vllm-0.32",
        against_profile="vllm-0.33",
        examples=200,
        seed=11,
        shrink_budget_s=0,
    )
    model = dataclasses.replace(
        real, sut="reference", against="reference", config_overrides={"num_lookahead_tokens": 0}
    )
    real_groups, real_counts = run_diff(real)
    model_groups, model_counts = run_diff(model)
    assert real_counts["unknown"] == 0 and real_counts["traces"] == model_counts["traces"]
    assert [(g.signature, g.indices) for g in real_groups] == [(g.signature, g.indices) for g in model_groups]
    assert [g.signature for g in real_groups] == ["scheduler_output:scheduled_cached_reqs"]
    assert all(not g.safety for g in real_groups)
