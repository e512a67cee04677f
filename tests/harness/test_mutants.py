"""Every mutant is killed by a campaign under the ci settings, fast, with a small minimal trace.

The targets of the project: each mutant killed in 30 s or less on 2 cores, its
failure shrunk to at most 10 events. The kill runs derandomized (a fixed seed).
"""

import pytest

from schedconf.conformance.checking.mutant_kill import kill_one
from schedconf.conformance.checking.mutants import MUTANTS, get_mutant_names


@pytest.mark.parametrize("name", get_mutant_names("v1"))  # the v0 ones: test_mutants_v0.py
def test_mutant_is_killed_and_shrunk(name):
    row = kill_one(MUTANTS[name], examples=1500, shrink_budget_s=15, seed=0, max_failures=4)
    assert row.killed, f"{name} survived {row.traces_tried} traces"
    assert row.seconds_to_kill is not None and row.seconds_to_kill <= 30, row
    assert row.shrunk_events is not None and row.shrunk_events <= 10, (row.killed_by, row.shrunk_events)
    print(
        f"\n{name}: killed by {row.killed_by} in {row.seconds_to_kill:.2f} s "
        f"after {row.traces_to_kill} traces; minimal trace {row.shrunk_events} events"
    )
