"""Every config the seeded generator draws is one its profile accepts.

A refused config used to reach run_workload and end a whole campaign as a
harness error (seed 1 of vllm-0.32 at trace 1079: a spec-decode cut
threshold of 3 above a boundary config's max_model_len of 2). Campaigns refuse
configs on purpose only through ``choose_refused_config``, whose header-only
traces expect the refusal (tests/harness/test_refused_generated.py).
"""

from __future__ import annotations

import pytest

from schedconf.conformance.workloads.config_limits import get_refusal
from schedconf.conformance.workloads.generate import random_workload


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.32", "vllm-0.11"])
def test_generated_configs_are_accepted_by_their_profile(profile):
    refused = []
    for campaign_seed in (0, 1, 2):
        for i in range(1200):
            workload = random_workload(campaign_seed * 1_000_003 + i, profile)
            code = get_refusal(workload.config.to_dict(), profile)
            if code:
                refused.append((campaign_seed, i, code))
    assert not refused, refused[:5]
