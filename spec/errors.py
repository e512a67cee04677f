"""The exception hierarchy of the reference model.

Three families, each with a stable snake_case ``code`` that traces, reports and
the JSON-lines protocol use verbatim (the table lives in
``conformance/FORMAT.md``):

* :class:`InvalidConfig`: a scheduler configuration that makes no sense
  (``block_size`` of 0, a pool that cannot hold one ``max_model_len`` sequence).
* :class:`InvalidEvent`: the caller broke a precondition of an input event
  (duplicate request id, empty prompt, abort of an id never seen). The model's
  state is unchanged when one is raised.
* :class:`InvariantViolation`: a safety rule of the model failed after a step.
  This means the model (or a mutant of it) is wrong, never the input.

Divergences between two schedulers are *values*, not exceptions; they live in
``conformance/``.
"""

from __future__ import annotations


class SpecError(Exception):
    """Base class of every error the reference model raises on purpose."""

    code: str = "spec_error"

    def __init__(self, code: str, message: str, **context: object) -> None:
        self.code = code
        self.message = message
        self.context = dict(context)
        super().__init__(self.render())

    def render(self) -> str:
        """Return ``code: message (key=value, ...)`` for humans and logs."""
        ctx = ", ".join(f"{k}={v!r}" for k, v in sorted(self.context.items()))
        return f"{self.code}: {self.message}" + (f" ({ctx})" if ctx else "")


class InvalidConfig(SpecError):
    """A ``SchedulerConfig`` field is out of range or inconsistent."""


class InvalidEvent(SpecError):
    """An input event (add_request, abort, model_output) breaks a precondition."""


class IllegalTransition(SpecError):
    """A request status change that ``LEGAL_TRANSITIONS`` does not allow.

    Only a wrong model (or a mutant) can raise this: every transition the
    scheduler makes is checked against the table in ``spec/request.py``.
    """


class InvariantViolation(SpecError):
    """A named invariant failed; ``invariant``, ``step`` and ``subject`` say where."""

    def __init__(self, invariant: str, step: int, subject: str, message: str) -> None:
        self.invariant = invariant
        self.step = step
        self.subject = subject
        super().__init__(
            f"invariant_violation:{invariant}",
            message,
            invariant=invariant,
            step=step,
            subject=subject,
        )


def require(condition: bool, error: type[SpecError], code: str, message: str, **context: object) -> None:
    """Raise ``error(code, message, **context)`` unless ``condition`` holds.

    Used instead of ``assert`` for caller preconditions: ``python -O`` strips
    asserts, and a precondition must never be silently skipped.
    """
    if not condition:
        raise error(code, message, **context)
