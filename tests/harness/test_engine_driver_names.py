"""Every name the vLLM driver reads off vLLM, an engine built on it provides too (no engine environment needed).

The Aphrodite driver reuses the vLLM driver with Aphrodite's classes under
vLLM's names (``_Aphrodite(_Vllm)``). When the vLLM driver learned to read
four more names for async scheduling, ``_Aphrodite`` was not told and its
self-check died with ``AttributeError: '_Aphrodite' object has no attribute
'AsyncScheduler'``; only a build of its environment could show it. This test
reads both classes' source: every attribute ``_Vllm`` sets must be set by
``_Aphrodite`` as well (by its own ``__init__`` or by the shared
``read_scheduler_api``), in the time of a unit test.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

from schedconf.conformance.engines import aphrodite_driver, vllm_driver


def get_assigned_attributes(cls: type, methods: tuple[str, ...]) -> set[str]:
    """The ``self.NAME`` a class's listed methods assign (and those of the methods they call on ``self``)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    funcs = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    names: set[str] = set()
    todo, seen = list(methods), set()
    while todo:
        name = todo.pop()
        if name in seen or name not in funcs:
            continue
        seen.add(name)
        for node in ast.walk(funcs[name]):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                if isinstance(node.ctx, ast.Store):
                    names.add(node.attr)
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "self"
            ):
                todo.append(node.func.attr)
    return names


def test_aphrodite_provides_every_name_the_vllm_driver_reads():
    vllm_names = get_assigned_attributes(vllm_driver._Vllm, ("__init__",))
    shared = get_assigned_attributes(vllm_driver._Vllm, ("read_scheduler_api",))
    aphrodite_names = get_assigned_attributes(aphrodite_driver._Aphrodite, ("__init__",))
    calls_shared = "read_scheduler_api" in inspect.getsource(aphrodite_driver._Aphrodite.__init__)
    provided = aphrodite_names | (shared if calls_shared else set())
    assert {"AsyncScheduler", "has_stale_output", "scheduler_attrs", "reset_prefix_cache_params"} <= vllm_names
    assert vllm_names - provided == set()


def test_the_check_sees_a_missing_name():
    """The check fails for a subclass that sets its own names and forgets one (as the broken driver did)."""

    class _Forgetful(vllm_driver._Vllm):
        def __init__(self) -> None:  # noqa: D107
            self.torch = None
            self.version = "0"

    assert "AsyncScheduler" not in get_assigned_attributes(_Forgetful, ("__init__",))
