"""Systems under test, by name.

``reference`` is the spec itself. ``stdio:CMD`` runs any scheduler that speaks
the JSON-lines protocol (PROTOCOL.md) as a subprocess. ``module:PKG.MOD:FACTORY``
imports a Python factory returning a SchedulerUnderTest. More adapters
(``vllm-v1@VERSION``, ``impl``) register themselves in ``ADAPTERS``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from conformance.sut import SchedulerUnderTest


class UnknownSut(Exception):
    """The --sut name matches no adapter."""


def _reference() -> SchedulerUnderTest:
    from conformance.adapters.reference import ReferenceSut

    return ReferenceSut()


def _impl() -> SchedulerUnderTest:
    from impl.adapter import ImplSchedulerSut  # torch is imported only here, on demand

    return ImplSchedulerSut()


def _impl_engine() -> SchedulerUnderTest:
    from impl.adapter import ImplEngineSut

    return ImplEngineSut()


ADAPTERS: dict[str, Callable[[], SchedulerUnderTest]] = {
    "reference": _reference,
    "impl": _impl,
    "impl-engine": _impl_engine,
}


def describe_suts() -> str:
    """A help text line per way of naming a SUT."""
    return (
        "reference (the spec itself); impl (our fast scheduler); impl-engine (our torch engine, teacher-forced); "
        "stdio:'CMD ARGS' (a subprocess speaking PROTOCOL.md); "
        "module:pkg.mod:factory (a Python factory returning a SchedulerUnderTest); "
        "mutant:NAME (the reference with one rule broken, see conformance/mutants.py); "
        + "vllm-v1@VERSION (the real vLLM scheduler; build it with `schedconf env vllm VERSION`)"
    )


def make_sut(name: str) -> SchedulerUnderTest:
    """Build the SUT called ``name`` (see :func:`describe_suts`)."""
    if name in ADAPTERS:
        return ADAPTERS[name]()
    if name.startswith("stdio:"):
        from conformance.adapters.stdio import StdioSut

        return StdioSut(name.removeprefix("stdio:"))
    if name.startswith("module:"):
        target = name.removeprefix("module:")
        module_name, _, attr = target.partition(":")
        if not attr:
            raise UnknownSut(f"--sut {name!r}: expected module:package.module:factory")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise UnknownSut(f"--sut {name!r}: cannot import {target}: {exc}") from None
        return factory()
    for prefix, factory in ADAPTER_PREFIXES.items():
        if name.startswith(prefix):
            return factory(name)
    raise UnknownSut(f"unknown --sut {name!r}; known: {describe_suts()}")


def _mutant(name: str) -> SchedulerUnderTest:
    from conformance.mutants import make_mutant_sut

    return make_mutant_sut(name)


# name prefix -> factory(name); e.g. "vllm-v1@" -> the vLLM adapter.
ADAPTER_PREFIXES: dict[str, Callable[[str], SchedulerUnderTest]] = {"mutant:": _mutant}


# Importing the vLLM adapter registers the "vllm-v1@" prefix (it never imports vLLM).
from conformance.adapters import vllm_v1 as _vllm_v1  # noqa: E402,F401
