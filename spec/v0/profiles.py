"""v0 release profiles. One today: ``vllm-0.10`` (vLLM 0.10.2, the last release with ``vllm/core/``).

The v1 profiles (``schedconf.spec.v1.profiles.PROFILES``) are untouched; ``schedconf.spec.schedulers``
maps a profile name to its scheduler kind.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedconf.spec.errors import InvalidConfig


@dataclass(frozen=True)
class V0Profile:
    """One v0 release."""

    name: str
    vllm_version: str


VLLM_0_10 = V0Profile(name="vllm-0.10", vllm_version="0.10.2")

V0_PROFILES: dict[str, V0Profile] = {p.name: p for p in (VLLM_0_10,)}


def get_v0_profile(name: str | V0Profile) -> V0Profile:
    """The v0 profile of this name; InvalidConfig ``unknown_profile`` otherwise."""
    if isinstance(name, V0Profile):
        return name
    if name not in V0_PROFILES:
        raise InvalidConfig(
            "unknown_profile", f"unknown v0 profile {name!r}; known: {', '.join(sorted(V0_PROFILES))}", profile=name
        )
    return V0_PROFILES[name]
