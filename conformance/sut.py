"""The one interface every scheduler under test implements.

A system under test (SUT) receives the trace's input events and returns its
outputs in the trace's canonical form (``conformance/traces/trace.schema.json``):

=====================  ======================================================
``start(config, profile)``   build a scheduler for this config and release profile
``add_request(event)``       the ``add_request`` event's fields
``abort(request_id)``        abort one request
``schedule()``               the canonical SchedulerOutput of one step; optionally
                             ``schedule(throttle_prefills=False)``: a scheduler whose
                             ``schedule`` takes that parameter runs traces whose steps
                             set it (vLLM 0.32+ data-parallel prefill throttle);
                             for the others such a trace is *unknown*
``update_from_output(sampled, drafts)``  apply the model output of the last step;
                             return the canonical request outputs
``observe()``                optional: ``{"free_block_queue", "num_free_blocks"}``
                             after ``schedule()``, or None if not supported
``close()``                  release resources
=====================  ======================================================

Invalid input must be refused with :class:`SutInputError` carrying the
error code, and must leave the scheduler unchanged. A SUT that cannot run a
trace's configuration at all (for example no priority policy) raises
:class:`SutUnsupported`: the verdict is then *unknown*, not *fail*.

A scheduler of your own needs only these methods; see the README ("Check
your own scheduler") for a ten-line adapter. An optional class attribute
``forced_config`` (a dict of config fields) makes campaigns generate only
traces with those values, for settings the scheduler cannot express at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol, runtime_checkable

from schedconf.conformance.protocol_server import accepts_throttle_prefills
from schedconf.spec.errors import InvalidConfig, InvalidEvent


class SutInputError(Exception):
    """The SUT refused an input event; ``code`` is the stable error code."""

    def __init__(self, code: str, message: str = "") -> None:
        self.code = code
        super().__init__(f"{code}: {message}" if message else code)


class SutUnsupported(Exception):
    """The SUT cannot run this configuration or feature (verdict: unknown)."""


@runtime_checkable
class SchedulerUnderTest(Protocol):
    """What the harness calls; see the module docstring."""

    name: str

    def start(self, config: dict[str, Any], profile: str) -> None: ...

    def add_request(self, event: dict[str, Any]) -> None: ...

    def abort(self, request_id: str) -> None: ...

    def schedule(self) -> dict[str, Any]: ...

    def update_from_output(
        self, sampled_token_ids: dict[str, list[int]], draft_token_ids: dict[str, list[int]]
    ) -> list[dict[str, Any]]: ...

    def observe(self) -> dict[str, Any] | None: ...

    def close(self) -> None: ...


ADD_REQUEST_FIELDS = (
    "request_id",
    "prompt_token_ids",
    "max_tokens",
    "priority",
    "arrival_time",
    "eos_token_id",
    "ignore_eos",
    "stop_token_ids",
    "min_tokens",
)


def call_schedule(sut: Any, throttle_prefills: bool = False) -> Any:
    """``sut.schedule()``, or ``sut.schedule(throttle_prefills=True)`` for a throttled step.

    A scheduler whose ``schedule`` has no such parameter cannot run the step: SutUnsupported.
    """
    if not throttle_prefills:
        return sut.schedule()
    if not accepts_throttle_prefills(sut):
        raise SutUnsupported(
            "the trace throttles prefill (schedule(throttle_prefills=True), vLLM 0.32+ data-parallel "
            "balancing) and this scheduler's schedule() takes no throttle_prefills"
        )
    return sut.schedule(throttle_prefills=True)


def add_request_kwargs(event: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``add_request`` (spec and impl schedulers) from a trace event."""
    return {name: event[name] for name in ADD_REQUEST_FIELDS}


@contextmanager
def refused_as_input_error() -> Iterator[None]:
    """Turn the spec's typed input errors (``InvalidEvent``, ``InvalidConfig``) into :class:`SutInputError`."""
    try:
        yield
    except (InvalidEvent, InvalidConfig) as exc:
        raise SutInputError(exc.code, exc.message) from None


class InProcessSut:
    """Base of the adapters for Python schedulers with the spec's method names (reference, impl, mutants).

    A subclass builds ``self.scheduler`` in ``start`` and implements
    ``update_from_output`` and ``observe``; the scheduler's ``schedule()``
    returns an output with ``to_canonical()``, kept in ``self.pending``.
    """

    name = "in-process"

    def __init__(self) -> None:
        self.scheduler: Any = None
        self.pending: Any = None

    def _sched(self) -> Any:
        assert self.scheduler is not None, "start() first"
        return self.scheduler

    def add_request(self, event: dict[str, Any]) -> None:
        with refused_as_input_error():
            self._sched().add_request(**add_request_kwargs(event))

    def abort(self, request_id: str) -> None:
        with refused_as_input_error():
            self._sched().abort(request_id)

    def schedule(self, throttle_prefills: bool = False) -> dict[str, Any]:
        sched = self._sched()
        if throttle_prefills and not accepts_throttle_prefills(sched):
            raise SutUnsupported(f"{self.name}: this scheduler's schedule() takes no throttle_prefills")
        with refused_as_input_error():
            self.pending = sched.schedule(throttle_prefills=True) if throttle_prefills else sched.schedule()
        return self.pending.to_canonical()

    def close(self) -> None:
        self.scheduler = None
        self.pending = None
