"""Helpers the tests share for files that must stand alone: reproductions written for an engine's maintainers,
and copies of this checkout.

(``tests/`` is on ``sys.path`` in every test session: its ``conftest.py`` puts it there.)
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DYNAMIC_IMPORTS = ("import_module", "__import__")


def get_imported_top_names(text: str) -> set[str]:
    """The top-level name of every module ``text`` imports.

    ``import a.b`` and ``from a.b import c`` give ``a``; a relative import gives ``.``; a call of
    ``importlib.import_module`` or ``__import__`` gives the call's name and, for a literal argument, its top name too,
    so a dynamic import is never invisible.
    """
    names: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("." if node.level else (node.module or "").split(".")[0])
        elif isinstance(node, ast.Call):
            called = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if called in DYNAMIC_IMPORTS:
                names.add(called)
                if node.args and isinstance(node.args[0], ast.Constant):
                    names.add(str(node.args[0].value).split(".")[0])
    return names


def run_standalone(
    python: str | os.PathLike[str], source: Path, folder: Path, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """Run ``python FILE`` on a copy of ``source`` in ``folder`` (outside the checkout), without ``PYTHONPATH``:
    nothing of this project can be imported. Standard output and error together."""
    copy = folder / source.name
    shutil.copy(source, copy)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(python), copy.name],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def copy_checkout(target: Path) -> Path:
    """The checkout's tracked files and the untracked ones git does not ignore, copied into ``target``."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO_ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = REPO_ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target
