"""The reference model as a system under test (the first adapter)."""

from __future__ import annotations

from typing import Any

from conformance.sut import SutInputError, add_request_kwargs
from spec.config import SchedulerConfig
from spec.errors import InvalidConfig, InvalidEvent
from spec.output import ModelRunnerOutput, SchedulerOutput
from spec.scheduler import Scheduler


class ReferenceSut:
    """Wraps :class:`spec.scheduler.Scheduler` in the SchedulerUnderTest interface."""

    name = "reference"

    def __init__(self) -> None:
        self.scheduler: Scheduler | None = None
        self.pending: SchedulerOutput | None = None

    def start(self, config: dict[str, Any], profile: str) -> None:
        try:
            self.scheduler = Scheduler(SchedulerConfig.from_dict(config), profile)
        except InvalidConfig as exc:
            raise SutInputError(exc.code, exc.message) from None
        self.pending = None

    def _sched(self) -> Scheduler:
        assert self.scheduler is not None, "start() first"
        return self.scheduler

    def add_request(self, event: dict[str, Any]) -> None:
        try:
            self._sched().add_request(**add_request_kwargs(event))
        except InvalidEvent as exc:
            raise SutInputError(exc.code, exc.message) from None

    def abort(self, request_id: str) -> None:
        try:
            self._sched().abort(request_id)
        except InvalidEvent as exc:
            raise SutInputError(exc.code, exc.message) from None

    def schedule(self) -> dict[str, Any]:
        try:
            self.pending = self._sched().schedule()
        except InvalidEvent as exc:
            raise SutInputError(exc.code, exc.message) from None
        return self.pending.to_canonical()

    def update_from_output(self, sampled_token_ids: dict[str, list[int]], draft_token_ids: dict[str, list[int]]) -> list[dict[str, Any]]:
        if self.pending is None:
            raise SutInputError("unexpected_model_output", "model output without a pending step")
        output = ModelRunnerOutput(
            sampled_token_ids={k: tuple(v) for k, v in sampled_token_ids.items()},
            draft_token_ids={k: tuple(v) for k, v in draft_token_ids.items()},
        )
        try:
            outputs = self._sched().update_from_output(self.pending, output)
        except InvalidEvent as exc:
            raise SutInputError(exc.code, exc.message) from None
        self.pending = None
        return [o.to_canonical() for o in outputs]

    def observe(self) -> dict[str, Any] | None:
        pool = self._sched().block_pool
        return {
            "free_block_queue": [b.block_id for b in pool.free_block_queue],
            "num_free_blocks": pool.get_num_free_blocks(),
        }

    def close(self) -> None:
        self.scheduler = None
