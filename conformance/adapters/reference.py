"""The reference model as a system under test (the first adapter).

The profile picks the model: a v1 profile the v1 scheduler
(:class:`schedconf.spec.v1.scheduler.Scheduler`), a v0 profile (``vllm-0.10``) the v0 one
(``spec/v0/``, through ``schedconf.spec.schedulers.make_scheduler``).
"""

from __future__ import annotations

from typing import Any

from schedconf.conformance.sut import InProcessSut, SutInputError, refused_as_input_error
from schedconf.spec.output import ModelRunnerOutput, SchedulerOutput
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.scheduler import Scheduler


class ReferenceSut(InProcessSut):
    """Wraps the reference scheduler of the trace's profile in the SchedulerUnderTest interface."""

    name = "reference"
    in_flight = True
    scheduler: Any
    pending: SchedulerOutput | None

    def start(self, config: dict[str, Any], profile: str) -> None:
        from schedconf.conformance.workloads.workload import is_v0_profile

        with refused_as_input_error():
            if is_v0_profile(profile):
                from schedconf.spec.schedulers import make_scheduler

                self.scheduler = make_scheduler(config, profile)
            else:
                self.scheduler = Scheduler(SchedulerConfig.from_dict(config), profile)
        self.pending = None

    def is_v0(self) -> bool:
        """True while the scheduler is a v0 one."""
        return self.scheduler is not None and not isinstance(self.scheduler, Scheduler)

    def update_from_output(
        self, sampled_token_ids: dict[str, list[int]], draft_token_ids: dict[str, list[int]], step: int | None = None
    ) -> list[dict[str, Any]]:
        """Apply the output of ``step`` (None: the oldest step in flight)."""
        output = ModelRunnerOutput(
            sampled_token_ids={k: tuple(v) for k, v in sampled_token_ids.items()},
            draft_token_ids={k: tuple(v) for k, v in draft_token_ids.items()},
        )
        sched = self._sched()
        if self.is_v0():
            if self.pending is None:
                raise SutInputError("unexpected_model_output", "model output without a pending step")
            with refused_as_input_error():
                outputs = sched.update_from_output(self.pending, output)
            self.pending = None
            return [o.to_canonical() for o in outputs]
        with refused_as_input_error():
            outputs = sched.update_from_output(sched.get_output_to_apply(step), output)
        self.pending = sched.pending_output
        return [o.to_canonical() for o in outputs]

    def get_scheduler_stats(self) -> dict[str, Any] | None:
        """The stats the last update reported (vLLM's ``SchedulerStats``, 0.32+ profiles; else None)."""
        return None if self.scheduler is None or self.is_v0() else self.scheduler.last_scheduler_stats

    def reset_prefix_cache(self, reset_running_requests: bool) -> bool:
        """``Scheduler.reset_prefix_cache`` (v1 schedulers only)."""
        if self.is_v0():
            from schedconf.conformance.sut import SutUnsupported

            raise SutUnsupported("the v0 scheduler has no reset_prefix_cache in the trace format")
        with refused_as_input_error():
            return bool(self._sched().reset_prefix_cache(reset_running_requests))

    def observe(self) -> dict[str, Any] | None:
        """The free queue, its length, and each request's block table (``block_tables``, for ``--comparison safety``).

        v0: the v0 observation (free GPU and CPU blocks, GPU and CPU block tables).
        """
        sched = self._sched()
        if self.is_v0():
            return sched.observe()
        pool = sched.block_pool
        return {
            "free_block_queue": [b.block_id for b in pool.free_block_queue],
            "num_free_blocks": pool.get_num_free_blocks(),
            "block_tables": {
                rid: [b.block_id for b in blocks]
                for rid, blocks in sorted(sched.kv_cache_manager.req_to_blocks.items())
                if blocks
            },
        }
