"""The shape of the house: import arrows point from the harness to the engine, never back, and never round.

* no module under ``impl/`` imports ``conformance`` (or ``gpu_checks``, which
  imports it): the engine does not know it is being checked;
* the modules of ``conformance/`` import each other without a cycle (imports
  inside functions count: they are arrows too, only later);
* importing ``schedconf.conformance.adapters`` (the SUT registry) imports no adapter, so
  neither torch nor the mutants come with it;
* every name of the registry still builds its SUT;
* everything imports the project by one name, ``schedconf``: no module uses the
  bare top-level names (``spec``, ``conformance``, ``impl``, ``gpu_checks``) a user's
  own package may have;
* the models (``spec/``, its Z3 encodings aside) import nothing of ours outside
  ``spec/``, and the engine drivers
  (which run in the engines' environments) import nothing of ``spec/``;
* the two models stand side by side: ``spec/v1/`` imports nothing of ``spec/v0/`` and back,
  and ``impl/`` takes from ``spec/`` only the vocabulary (errors, configs, profiles), no model;
* no import cycle anywhere in the project;
* every package opens with a docstring, is listed for the wheel, and ``conformance/`` keeps at
  most a dozen modules at its root; a module past 800 lines says why (a ``# Size:`` comment).

The import graph is read from the source with ``ast``; nothing is imported to
draw it.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def get_module_name(path: Path) -> str:
    """``conformance/adapters/__init__.py`` -> ``schedconf.conformance.adapters``."""
    if not path.is_relative_to(ROOT):
        return path.stem
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["schedconf", *parts])


def get_imported_names(path: Path) -> set[str]:
    """Every dotted name an ``import`` or ``from ... import`` of ``path`` may load, at any depth of the code.

    ``from a.b import c`` yields ``a.b`` and ``a.b.c`` (``c`` may be a module);
    relative imports are resolved against the module's package.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    name = get_module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def compute_import_graph(*packages: str) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports, with the parent packages an import runs."""
    modules = {get_module_name(p): p for package in packages for p in sorted((ROOT / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for imported in get_imported_names(path):
            parts = imported.split(".")
            for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ first
                prefix = ".".join(parts[:i])
                if prefix in modules and prefix != name:
                    targets.add(prefix)
        graph[name] = targets
    return graph


def find_import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_cycle_finder_finds_a_two_module_cycle_and_nothing_in_a_chain():
    assert find_import_cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert find_import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_import_graph_sees_function_level_imports_and_parent_packages():
    graph = compute_import_graph("conformance")
    # mutants imports the reference adapter at module level, which runs the registry's __init__ first
    assert {"schedconf.conformance.adapters", "schedconf.conformance.adapters.reference"} <= graph[
        "schedconf.conformance.checking.mutants"
    ]
    # the registry imports the stdio adapter inside make_sut
    assert "schedconf.conformance.adapters.stdio" in graph["schedconf.conformance.adapters"]


def test_conformance_modules_import_each_other_without_a_cycle():
    cycles = find_import_cycles(compute_import_graph("conformance"))
    assert cycles == [], f"import cycles among conformance modules: {cycles}"


@pytest.mark.parametrize("path", sorted((ROOT / "impl").rglob("*.py")), ids=lambda p: p.name)
def test_impl_module_does_not_import_the_harness(path):
    harness = sorted(
        n
        for n in get_imported_names(path)
        if n.startswith(("schedconf.conformance", "schedconf.gpu_checks", "conformance", "gpu_checks"))
    )
    assert harness == [], f"{path.relative_to(ROOT)} imports the harness: {harness}"


def test_impl_has_modules_to_check():
    # the parametrized test above must not pass on an empty folder
    names = {p.name for p in (ROOT / "impl").rglob("*.py")}
    assert {"scheduler.py", "engine.py", "runner.py"} <= names


def test_importing_the_registry_imports_no_adapter_and_no_torch():
    code = (
        "import sys, schedconf.conformance, schedconf.conformance.adapters\n"
        "loaded = sorted(m for m in ('torch', 'schedconf.impl', 'schedconf.conformance.checking.mutants',\n"
        "                            'schedconf.conformance.adapters.impl',\n"
        "                            'schedconf.conformance.adapters.vllm_v1') if m in sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_every_registry_entry_resolves_to_a_factory():
    from schedconf.conformance.adapters import ADAPTER_PREFIXES, ADAPTERS, get_factory

    assert {"reference", "impl", "impl-engine"} <= set(ADAPTERS)
    assert {"mutant:", "vllm-v1@"} <= set(ADAPTER_PREFIXES)
    for entry in [*ADAPTERS.values(), *ADAPTER_PREFIXES.values()]:
        assert callable(get_factory(entry)), entry


def test_make_sut_builds_every_kind_of_name():
    from schedconf.conformance.adapters import UnknownSut, make_sut
    from schedconf.conformance.adapters.impl import ImplEngineSut, ImplSchedulerSut
    from schedconf.conformance.adapters.vllm_v1 import VllmEnvNotReady, VllmV1Sut
    from schedconf.conformance.checking.mutants import MutantSut

    assert type(make_sut("impl")) is ImplSchedulerSut
    assert type(make_sut("impl-engine")) is ImplEngineSut
    mutant = make_sut("mutant:fcfs_victim_head")
    assert isinstance(mutant, MutantSut) and mutant.name == "mutant:fcfs_victim_head"
    with pytest.raises(UnknownSut, match="unknown mutant 'no_such_mutant'"):
        make_sut("mutant:no_such_mutant")
    try:
        vllm = make_sut("vllm-v1@0.33.0")
    except VllmEnvNotReady as exc:  # the usual case: the release's environment is not built here
        assert "schedconf env vllm 0.33.0" in str(exc)
    else:
        assert isinstance(vllm, VllmV1Sut) and vllm.version == "0.33.0"
    with pytest.raises(UnknownSut, match="no pinned environment"):
        make_sut("vllm-v1@9.9.9")
    with pytest.raises(UnknownSut, match="unknown --sut 'no-such-sut'"):
        make_sut("no-such-sut")


OURS = ("spec", "conformance", "impl", "gpu_checks")
CODE = sorted(p for top in (*OURS, "bench", "tests", "schedconf") for p in (ROOT / top).rglob("*.py"))


@pytest.mark.parametrize("path", CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_project_is_imported_by_one_name(path):
    bare = sorted(n for n in get_imported_names(path) if n.split(".")[0] in OURS)
    assert bare == [], f"{path.relative_to(ROOT)} imports {bare}: use schedconf.{bare[0]}"


MODELS = sorted(p for p in (ROOT / "spec").rglob("*.py") if "symbolic" not in p.relative_to(ROOT).parts)


@pytest.mark.parametrize("path", MODELS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_models_import_nothing_of_ours_outside_spec(path):
    """The executable models stand alone. (``spec/symbolic/`` may write the traces that realise its
    witnesses with the trace format's own reader and writer.)"""
    outside = sorted(
        n for n in get_imported_names(path) if n.startswith("schedconf.") and not n.startswith("schedconf.spec")
    )
    assert outside == [], f"{path.relative_to(ROOT)} imports {outside}"


@pytest.mark.parametrize("path", sorted((ROOT / "conformance" / "engines").glob("*.py")), ids=lambda p: p.name)
def test_an_engine_driver_imports_no_model(path):
    model = sorted(n for n in get_imported_names(path) if n.startswith("schedconf.spec"))
    assert model == [], f"{path.relative_to(ROOT)} imports {model}: drivers run in the engines' environments"


def test_the_layer_checks_see_a_bare_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from spec.scheduler import Scheduler\n")
    assert "spec.scheduler" in get_imported_names(module)


def test_the_v1_and_v0_models_do_not_import_each_other():
    crossings = []
    for mine, other in (("v1", "v0"), ("v0", "v1")):
        for path in sorted((ROOT / "spec" / mine).rglob("*.py")):
            crossings += [
                f"{path.relative_to(ROOT)} -> {n}"
                for n in get_imported_names(path)
                if n.startswith(f"schedconf.spec.{other}")
            ]
    assert crossings == [], crossings


IMPL_MAY_USE = {
    "schedconf.spec",
    "schedconf.spec.errors",
    "schedconf.spec.hashing",
    "schedconf.spec.tokens",
    "schedconf.spec.v1",
    "schedconf.spec.v1.config",
    "schedconf.spec.v1.profiles",
    "schedconf.spec.v0",
    "schedconf.spec.v0.config",
    "schedconf.spec.v0.profiles",
}


def get_spec_module(name: str) -> str:
    """``schedconf.spec.v1.config.SchedulerConfig`` -> ``schedconf.spec.v1.config`` (the longest prefix that is a
    module or package of ``spec/``)."""
    parts = name.split(".")
    for i in range(len(parts), 1, -1):
        rel = Path(*parts[2:i]) if i > 2 else Path()
        if (ROOT / "spec" / rel).with_suffix(".py").is_file() or (ROOT / "spec" / rel / "__init__.py").is_file():
            return ".".join(parts[:i])
    return name


@pytest.mark.parametrize("path", sorted((ROOT / "impl").rglob("*.py")), ids=lambda p: p.name)
def test_impl_takes_only_the_vocabulary_of_the_models(path):
    used = sorted(
        {get_spec_module(n) for n in get_imported_names(path) if n.startswith("schedconf.spec")} - IMPL_MAY_USE
    )
    assert used == [], f"{path.relative_to(ROOT)} imports {used}: impl is checked against the models, not built on them"


def test_get_spec_module_finds_the_module_of_an_imported_name():
    assert get_spec_module("schedconf.spec.v1.config.SchedulerConfig") == "schedconf.spec.v1.config"
    assert get_spec_module("schedconf.spec.v1.scheduler") == "schedconf.spec.v1.scheduler"
    assert get_spec_module("schedconf.spec.errors") == "schedconf.spec.errors"


def test_no_import_cycle_anywhere():
    cycles = find_import_cycles(compute_import_graph(*OURS))
    assert cycles == [], f"import cycles: {cycles}"


PACKAGES = sorted(p.parent for top in OURS for p in (ROOT / top).rglob("__init__.py"))


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_package_opens_with_a_docstring(package):
    tree = ast.parse((package / "__init__.py").read_text(encoding="utf-8"))
    doc = ast.get_docstring(tree)
    assert doc and len(doc.split()) >= 8, f"{package.relative_to(ROOT)}/__init__.py: say what the package holds"


def test_every_package_is_listed_for_the_wheel():
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {get_module_name(p / "__init__.py") for p in PACKAGES}
    assert found - listed == set(), f"packages missing from [tool.setuptools] packages: {sorted(found - listed)}"
    assert listed - found - {"schedconf"} == set(), f"listed but not found: {sorted(listed - found)}"


def test_conformance_keeps_at_most_a_dozen_modules_at_its_root():
    modules = sorted(p.name for p in (ROOT / "conformance").glob("*.py"))
    assert len(modules) <= 12, f"{len(modules)} modules at conformance/'s root: {modules}"


PACKAGE_CODE = sorted(p for top in OURS for p in (ROOT / top).rglob("*.py"))


@pytest.mark.parametrize("path", PACKAGE_CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_long_module_says_why(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    if len(lines) > 800:
        assert any(line.startswith("# Size:") for line in lines), (
            f"{path.relative_to(ROOT)}: {len(lines)} lines; split it where a reader wants two rooms, or say why "
            "it is one (a '# Size:' comment)"
        )
