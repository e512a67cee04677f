"""Shared test settings: Hypothesis profiles.

``ci`` (default under CI=1 or HYPOTHESIS_PROFILE=ci): derandomized, no example
database, few examples. ``dev``: the default locally, more examples. ``deep``:
long local campaigns (HYPOTHESIS_PROFILE=deep).

Tests marked ``deep`` run only when the ``-m`` expression names ``deep``:
``addopts`` leaves them out, but a ``-m`` on the command line replaces
``addopts``' one, so ``pytest -m symbolic`` would otherwise run the deep
proofs too (about 23 minutes more on 2 cores).
"""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=60,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect ``deep`` tests unless the ``-m`` expression mentions ``deep`` (``-m deep``, ``-m "symbolic and deep"``)."""
    if "deep" in (config.option.markexpr or ""):
        return
    deep = [item for item in items if item.get_closest_marker("deep")]
    if deep:
        config.hook.pytest_deselected(items=deep)
        items[:] = [item for item in items if not item.get_closest_marker("deep")]
