"""The rules page cites vLLM's own lines (``spec/sources.py``): each cited line of the pinned release
must still hold the code the table quotes, so a citation cannot drift from its source."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from schedconf.conformance.engines.vllm_env import ensure_vllm_env
from schedconf.spec.sources import RULES

FIND_PACKAGE = "import importlib.util; print(importlib.util.find_spec('vllm').submodule_search_locations[0])"


def get_package_parent(version: str) -> Path:
    """The folder holding the release's ``vllm`` package, found without importing vLLM."""
    python = ensure_vllm_env(version)
    done = subprocess.run([str(python), "-c", FIND_PACKAGE], capture_output=True, text=True, check=True)
    return Path(done.stdout.strip()).parent


@pytest.mark.parametrize("release", sorted({r.release for r in RULES}))
def test_each_cited_line_holds_the_quoted_code(release: str):
    parent = get_package_parent(release)
    wrong = []
    for rule in (r for r in RULES if r.release == release):
        lines = (parent / rule.path).read_text(encoding="utf-8").split("\n")
        if rule.line > len(lines) or rule.fragment not in lines[rule.line - 1]:
            found = [n for n, text in enumerate(lines, 1) if rule.fragment in text]
            wrong.append(f"{rule.path}:{rule.line} does not hold {rule.fragment!r} (found at {found}): {rule.rule}")
    assert wrong == [], "\n".join(wrong)
