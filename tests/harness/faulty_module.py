"""Python schedulers that misbehave on purpose (the fault-injection suite's ``module:`` and ``inprocess:`` SUTs).

Each class is the reference model except that its ``STRIKE``-th ``schedule()``
call (counted over the object's life, so after ``init`` and a step or two)
does what its name says:

================  ==========================================================
Hang              loops in Python for good
NativeHang        sums a range of 10^12 in C (no bytecode runs: no signal
                  handler, no alarm, can interrupt it in-process)
ExitZero          ``sys.exit(0)``
ExitThree         ``sys.exit(3)``
OsExit            ``os._exit(3)``
Boom              raises a ``BaseException`` subclass
Raises            raises ``RuntimeError``
Floats            answers token counts as floats (``7.0``)
UnknownField      answers with a field the format does not have
NotJson           answers a set where a list is due
LateUnsupported   raises ``SutUnsupported`` mid-trace
BadCode           refuses the step with an error code the table does not have
CodedRefusal      raises an exception of its own with a valid error ``code``
                  (read as a refusal with that code, as the protocol reads it)
Slow              answers every call 10 ms late (within any timeout: passes)
ClosesBadly       raises in ``close`` (ignored, as a process's ``shutdown``)
NoReset           has no ``reset_prefix_cache`` (a trace with a reset: unknown)
================  ==========================================================

In a child process (``module:``), the process records its pid in
``$FAULTY_SUT_PIDS`` as ``faulty_sut.py`` does, so tests can check none survives.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from schedconf.conformance.adapters.reference import ReferenceSut  # noqa: E402
from schedconf.conformance.sut import SutInputError, SutUnsupported  # noqa: E402
from tests.harness.faulty_sut import floats_in, record_pid  # noqa: E402

STRIKE = 3


def is_module_host() -> bool:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec is not None and spec.name == "schedconf.conformance.adapters.module_host"


if is_module_host():
    record_pid(os.getpid())


class Boom(BaseException):
    """Not an Exception: what a scheduler must never be able to take the harness down with."""


class _Faulty(ReferenceSut):
    name = "faulty"

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def schedule(self):  # noqa: ANN201
        self.calls += 1
        result = super().schedule()
        return self.strike(result) if self.calls >= STRIKE else result

    def strike(self, result):  # noqa: ANN001, ANN201
        return result


class Hang(_Faulty):
    def strike(self, result):  # noqa: ANN001, ANN201
        while True:
            pass


class NativeHang(_Faulty):
    def strike(self, result):  # noqa: ANN001, ANN201
        return sum(range(10**12))


class ExitZero(_Faulty):
    def strike(self, result):  # noqa: ANN001, ANN201
        sys.exit(0)


class ExitThree(_Faulty):
    def strike(self, result):  # noqa: ANN001, ANN201
        sys.exit(3)


class OsExit(_Faulty):
    def strike(self, result):  # noqa: ANN001, ANN201
        os._exit(3)


class Bomb(_Faulty):
    def strike(self, result):  # noqa: ANN001, ANN201
        raise Boom("a BaseException from the scheduler")


class Raises(_Faulty):
    def strike(self, result):  # noqa: ANN001, ANN201
        raise RuntimeError("the scheduler's own bug")


class Floats(_Faulty):
    def strike(self, result):  # noqa: ANN001, ANN201
        return floats_in(result)


class UnknownField(_Faulty):
    def strike(self, result):  # noqa: ANN001, ANN201
        return {**result, "my_debug_field": 1}


class NotJson(_Faulty):
    def strike(self, result):  # noqa: ANN001, ANN201
        return {**result, "finished_req_ids": set(result["finished_req_ids"])}


class LateUnsupported(_Faulty):
    def strike(self, result):  # noqa: ANN001, ANN201
        raise SutUnsupported("this step looks hard")


class BadCode(_Faulty):
    def strike(self, result):  # noqa: ANN001, ANN201
        raise SutInputError("not_a_code", "refused for no reason")


class CodedError(Exception):
    """A scheduler's own exception type that carries a stable error code, as the spec's errors do."""

    code = "unknown_request_id"


class CodedRefusal(_Faulty):
    def strike(self, result):  # noqa: ANN001, ANN201
        raise CodedError("no such request")


class Slow(_Faulty):
    def schedule(self):  # noqa: ANN201
        time.sleep(0.01)
        return super().schedule()


class ClosesBadly(_Faulty):
    def close(self) -> None:
        raise RuntimeError("close failed")


class NoReset:
    """The reference without the optional ``reset_prefix_cache``."""

    name = "no-reset"

    def __init__(self) -> None:
        self._inner = ReferenceSut()

    def __getattr__(self, attr: str):  # noqa: ANN204
        if attr == "reset_prefix_cache" or attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(self._inner, attr)


class PrintsToStdout(_Faulty):
    """Prints on stdout, where the protocol's lines go: the host sends it to stderr (passes)."""

    def schedule(self):  # noqa: ANN201
        print("debug: scheduling a step")
        return super().schedule()
