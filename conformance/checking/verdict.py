"""The verdict of one trace against one scheduler: what every comparison returns.

``replay`` (strict, observable) and the safety comparison both produce a
:class:`ReplayResult`; this module holds it so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schedconf.conformance.checking.compare import Divergence

PASS, FAIL, UNKNOWN = "pass", "fail", "unknown"


@dataclass
class ReplayResult:
    """The verdict of one trace against one SUT."""

    verdict: str
    divergence: Divergence | None = None
    events_run: int = 0
    steps_run: int = 0
    detail: str = ""
    """A traceback or the reason for ``unknown``."""
    sut_stderr: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
