"""Shared test settings: Hypothesis profiles.

``ci`` (default under CI=1 or HYPOTHESIS_PROFILE=ci): derandomized, no example
database, few examples. ``dev``: the default locally, more examples. ``deep``:
long local campaigns (HYPOTHESIS_PROFILE=deep).
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=60, derandomize=True, database=None, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
