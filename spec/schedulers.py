"""Which scheduler a release profile runs: the v1 model or the v0 (legacy) model.

``get_scheduler_kind(profile_name)`` is ``"v0"`` for the v0 profiles
(``schedconf.spec.v0.profiles``), ``"v1"`` for ``schedconf.spec.v1.profiles.PROFILES``;
``make_config`` and ``make_scheduler`` build the matching config and model
from a trace header's ``config`` dict.
"""

from __future__ import annotations

from typing import Any, Literal

from schedconf.spec.errors import InvalidConfig
from schedconf.spec.v0.config import V0SchedulerConfig
from schedconf.spec.v0.profiles import V0_PROFILES
from schedconf.spec.v0.scheduler import Scheduler as V0Scheduler
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.profiles import PROFILES
from schedconf.spec.v1.scheduler import Scheduler as V1Scheduler

SchedulerKind = Literal["v1", "v0"]


def get_scheduler_kind(profile_name: str) -> SchedulerKind:
    """``"v0"`` or ``"v1"``; InvalidConfig ``unknown_profile`` for a name in neither table."""
    if profile_name in V0_PROFILES:
        return "v0"
    if profile_name in PROFILES:
        return "v1"
    known = ", ".join(sorted([*PROFILES, *V0_PROFILES]))
    raise InvalidConfig("unknown_profile", f"unknown profile {profile_name!r}; known: {known}", profile=profile_name)


def make_config(config_dict: dict[str, Any], profile_name: str) -> SchedulerConfig | V0SchedulerConfig:
    """The profile's config type built from ``config_dict`` (refusals as InvalidConfig)."""
    if get_scheduler_kind(profile_name) == "v0":
        return V0SchedulerConfig.from_dict(dict(config_dict))
    return SchedulerConfig.from_dict(dict(config_dict))


def make_scheduler(config_dict: dict[str, Any], profile_name: str) -> V1Scheduler | V0Scheduler:
    """A fresh model of the profile's kind for ``config_dict``."""
    config = make_config(config_dict, profile_name)
    if isinstance(config, V0SchedulerConfig):
        return V0Scheduler(config, profile_name)
    return V1Scheduler(config, profile_name)
