"""Schedulers that each break one safety property (for tests/harness/test_safety.py).

Each subclasses the reference adapter and breaks one thing; the test checks
that ``--comparison safety`` catches it by exactly the named property.
"""

from __future__ import annotations

from typing import Any

from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.spec.v1.request import Request
from schedconf.spec.v1.scheduler import Scheduler


class OverBudgetSut(ReferenceSut):
    """Schedules with twice the configured token budget (token_budget)."""

    def start(self, config: dict[str, Any], profile: str) -> None:
        super().start({**config, "max_num_batched_tokens": 2 * config["max_num_batched_tokens"]}, profile)


class ExtraSeatSut(ReferenceSut):
    """Schedules one request more than max_num_seqs allows (seats)."""

    def start(self, config: dict[str, Any], profile: str) -> None:
        super().start({**config, "max_num_seqs": config["max_num_seqs"] + 1}, profile)


class ZeroTokensSut(ReferenceSut):
    """Reports its first scheduled request with 0 tokens (progress)."""

    def schedule(self) -> dict[str, Any]:
        out = super().schedule()
        if out["num_scheduled_tokens"]:
            rid = next(iter(out["num_scheduled_tokens"]))
            out["total_num_scheduled_tokens"] -= out["num_scheduled_tokens"][rid]
            out["num_scheduled_tokens"][rid] = 0
        return out


class IgnoreAbortSut(ReferenceSut):
    """Forgets aborts: the aborted request keeps running (known_requests)."""

    def abort(self, request_id: str) -> None:
        return None


class _KeepComputedOnPreempt(Scheduler):
    def _preempt_request(self, request: Request) -> None:
        computed = request.num_computed_tokens
        super()._preempt_request(request)
        request.num_computed_tokens = computed


class UncomputedHitSut(ReferenceSut):
    """A preempted request resumes claiming the KV it had, in blocks that never held it (computed_kv)."""

    def start(self, config: dict[str, Any], profile: str) -> None:
        super().start(config, profile)
        assert self.scheduler is not None
        self.scheduler = _KeepComputedOnPreempt(self.scheduler.config, profile)


class DoubleHandSut(ReferenceSut):
    """Reports a block of one request in the table of another too (block_exclusivity)."""

    def observe(self) -> dict[str, Any] | None:
        obs = super().observe()
        assert obs is not None
        tables = obs["block_tables"]
        if len(tables) >= 2:
            (a, ta), (b, tb) = list(tables.items())[:2]
            tables[b] = tb + [ta[0]]
        return obs


class FreeCountOffSut(ReferenceSut):
    """Counts one free block more than it has while requests run (block_conservation)."""

    def observe(self) -> dict[str, Any] | None:
        obs = super().observe()
        assert obs is not None
        if obs["block_tables"]:
            obs["num_free_blocks"] += 1
        return obs


class LeakSut(ReferenceSut):
    """Keeps reporting the blocks of requests that finished (blocks_return)."""

    def __init__(self) -> None:
        super().__init__()
        self.last: dict[str, list[int]] = {}
        self.done: set[str] = set()

    def start(self, config: dict[str, Any], profile: str) -> None:
        super().start(config, profile)
        self.last, self.done = {}, set()

    def update_from_output(self, sampled, drafts):  # noqa: ANN001
        outputs = super().update_from_output(sampled, drafts)
        self.done |= {o["req_id"] for o in outputs if o["finish_reason"] is not None}
        return outputs

    def observe(self) -> dict[str, Any] | None:
        obs = super().observe()
        assert obs is not None
        self.last.update(obs["block_tables"])
        for rid in self.done:
            if rid in self.last and rid not in obs["block_tables"]:
                obs["block_tables"][rid] = self.last[rid]
        return obs


class DropFinishedSut(ReferenceSut):
    """Never reports the output that finishes a request (request_lifecycle)."""

    def update_from_output(self, sampled, drafts):  # noqa: ANN001
        return [o for o in super().update_from_output(sampled, drafts) if o["finish_reason"] is None]


class FinishedTwiceSut(ReferenceSut):
    """Reports every finished request's last output again in the next update (request_lifecycle)."""

    def __init__(self) -> None:
        super().__init__()
        self.again: list[dict[str, Any]] = []

    def start(self, config: dict[str, Any], profile: str) -> None:
        super().start(config, profile)
        self.again = []

    def update_from_output(self, sampled, drafts):  # noqa: ANN001
        outputs = super().update_from_output(sampled, drafts)
        repeat, self.again = self.again, [o for o in outputs if o["finish_reason"] is not None]
        return outputs + repeat


class IgnoreStopSut(ReferenceSut):
    """Drops the requests' stop_token_ids (stop_rules)."""

    def add_request(self, event: dict[str, Any]) -> None:
        super().add_request({**event, "stop_token_ids": []} if isinstance(event.get("stop_token_ids"), list) else event)


class StarveSut(ReferenceSut):
    """Never gives the scheduler the first request it is sent: it is accepted and never runs (liveness)."""

    def __init__(self) -> None:
        super().__init__()
        self.starved: str | None = None

    def start(self, config: dict[str, Any], profile: str) -> None:
        super().start(config, profile)
        self.starved = None

    def add_request(self, event: dict[str, Any]) -> None:
        if self.starved is None and isinstance(event.get("request_id"), str):
            self.starved = event["request_id"]
            return None
        if event.get("request_id") == self.starved:
            from schedconf.conformance.sut import SutInputError

            raise SutInputError("duplicate_request_id", "starved, still live")
        return super().add_request(event)

    def abort(self, request_id: str) -> None:
        if request_id == self.starved:
            self.starved = ""  # aborted: ended, never to be seen again
            return None
        return super().abort(request_id)
