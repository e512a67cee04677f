"""Systems under test, by name.

``reference`` is the spec itself. ``stdio:CMD`` runs any scheduler that speaks
the JSON-lines protocol (PROTOCOL.md) as a subprocess. ``module:PKG.MOD:FACTORY``
runs a Python factory returning a SchedulerUnderTest in a child process behind
the same protocol, looking in the current folder first (as pytest does);
``inprocess:PKG.MOD:FACTORY`` calls it in the harness's process
(``conformance/adapters/module.py``). The other adapters are listed in two tables:
``ADAPTERS`` (exact names: ``reference``, ``impl``, ``impl-engine``) and
``ADAPTER_PREFIXES`` (``mutant:NAME``, ``vllm-v1@VERSION``).

A table entry is a factory or the path of one, ``"package.module:factory"``.
The registry imports an adapter's module only when its SUT is asked for, so
importing this package imports no adapter (no torch, no mutants, no vLLM
environment), and adapters may import :class:`UnknownSut` from here without an
import cycle: the arrows point from the adapters to the registry, never back.
"""

from __future__ import annotations

import importlib
import os
import shutil
from collections.abc import Callable

from schedconf.conformance.sut import SchedulerUnderTest


class UnknownSut(Exception):
    """The --sut name matches no adapter."""


AdapterEntry = Callable[[], SchedulerUnderTest] | str
PrefixEntry = Callable[[str], SchedulerUnderTest] | str

ADAPTERS: dict[str, AdapterEntry] = {
    "reference": "schedconf.conformance.adapters.reference:ReferenceSut",
    "impl": "schedconf.conformance.adapters.impl:make_scheduler_sut",  # torch is imported only by impl-engine, on start
    "impl-engine": "schedconf.conformance.adapters.impl:make_engine_sut",
}
"""Exact SUT name -> factory() (or its ``"module:attr"`` path)."""

ADAPTER_PREFIXES: dict[str, PrefixEntry] = {
    "module:": "schedconf.conformance.adapters.module:make_module_sut",  # a Python scheduler in a child process
    "inprocess:": "schedconf.conformance.adapters.module:make_inprocess_sut",  # the same in this process
    "mutant:": "schedconf.conformance.checking.mutants:make_mutant_sut",
    "vllm-v1@": "schedconf.conformance.adapters.vllm_v1:make_vllm_sut",  # never imports vLLM itself
    "vllm-v0@": "schedconf.conformance.adapters.vllm_v0:make_vllm_v0_sut",  # vLLM 0.10.2's legacy scheduler; never imports vLLM
    "nano-vllm@": "schedconf.conformance.adapters.nanovllm:make_nanovllm_sut",  # never imports nano-vllm itself
    "aphrodite@": "schedconf.conformance.adapters.aphrodite:make_aphrodite_sut",  # never imports Aphrodite itself
    "lmdeploy@": "schedconf.conformance.adapters.lmdeploy:make_lmdeploy_sut",  # never imports LMDeploy itself
    "sglang@": "schedconf.conformance.adapters.sglang:make_sglang_sut",  # never imports SGLang itself
}
"""SUT name prefix -> factory(name) (or its ``"module:attr"`` path)."""


def get_factory(entry: AdapterEntry | PrefixEntry) -> Callable[..., SchedulerUnderTest]:
    """The factory of a table entry, importing its module if the entry is a ``"module:attr"`` path."""
    if callable(entry):
        return entry
    module_name, _, attr = entry.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def describe_suts() -> str:
    """A help text line per way of naming a SUT."""
    return (
        "reference (the spec itself); impl (our fast scheduler); impl-engine (our torch engine, teacher-forced); "
        "stdio:'CMD ARGS' (a subprocess speaking PROTOCOL.md); "
        "module:pkg.mod:factory (a Python factory returning a SchedulerUnderTest, run in a child process; the "
        "current folder is searched first); inprocess:pkg.mod:factory (the same in the harness's process: faster, "
        "but a hang in native code or os._exit is not contained); "
        "mutant:NAME (the reference with one rule broken, see conformance/checking/mutants.py); "
        + "vllm-v1@VERSION (the real vLLM scheduler; build it with `schedconf env vllm VERSION`); "
        + "vllm-v1@PATH (your own vLLM build: a virtual environment or its Python, e.g. vllm-v1@~/vllm/.venv); "
        + "vllm-v0@0.10.2 (vLLM's legacy v0 scheduler, with --profile vllm-0.10)"
    )


def make_stdio_sut(name: str) -> SchedulerUnderTest:
    """``stdio:CMD``: check the command can start (quoting, a program on PATH) before any trace; UnknownSut if not."""
    import shlex

    from schedconf.conformance.adapters.stdio import StdioSut

    command = name.removeprefix("stdio:")
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise UnknownSut(
            f"--sut {name!r}: the command does not parse as shell words ({exc}); "
            "quote it as one argument: --sut stdio:'./my-scheduler --serve'"
        ) from None
    if not argv:
        raise UnknownSut(f"--sut {name!r}: expected stdio:'COMMAND ARGS', the command that starts your scheduler")
    program = argv[0]
    if os.sep in program:
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise UnknownSut(f"--sut {name!r}: cannot start {program!r}: not an executable file")
        path = program
    else:
        found = shutil.which(program)
        if found is None:
            raise UnknownSut(f"--sut {name!r}: cannot start {program!r}: no such program on PATH")
        path = found
    problem = get_interpreter_problem(path)
    if problem:
        raise UnknownSut(f"--sut {name!r}: cannot start {program!r}: {problem}")
    return StdioSut(command)


def get_interpreter_problem(path: str) -> str | None:
    """Why the ``#!`` line of the script at ``path`` cannot start it, or None (also for a binary).

    The kernel reports a missing interpreter only when the script is executed, as an exit the
    harness could not tell from the scheduler's own; checked here, it is a set-up error.
    """
    try:
        with open(path, "rb") as script:
            first = script.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    if not words:
        return "its #! line names no interpreter"
    interpreter = words[0]
    if not (os.path.isfile(interpreter) and os.access(interpreter, os.X_OK)):
        return f"its #! interpreter {interpreter!r} is not an executable file"
    if os.path.basename(interpreter) == "env":
        named = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        if named and shutil.which(named[0]) is None:
            return f"its #! line runs {named[0]!r} through env, and there is no such program on PATH"
    return None


def make_sut(name: str) -> SchedulerUnderTest:
    """Build the SUT called ``name`` (see :func:`describe_suts`)."""
    if name in ADAPTERS:
        return get_factory(ADAPTERS[name])()
    if name.startswith("stdio:"):
        return make_stdio_sut(name)
    for prefix, entry in ADAPTER_PREFIXES.items():
        if name.startswith(prefix):
            return get_factory(entry)(name)
    raise UnknownSut(f"unknown --sut {name!r}; known: {describe_suts()}")
