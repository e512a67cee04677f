"""The README and the manual cannot rot: the manual builds in strict mode, the generated reference
pages match the code, every command marked runnable runs with the exit code it promises, and no
page speaks of internal work steps.

Runnable commands: a fenced ``sh`` block right after a line ``<!-- runnable: ... -->`` in the
README or any page of the manual (included pages too). The comment may give ``exit=N`` (default 0)
and ``timeout=S`` (default 300). Each command runs with ``bash -e`` in a copy of the repository's
tracked files (so a command that installs or writes reports touches nothing here), with this
environment's ``schedconf`` on the PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from standalone_files import copy_checkout

from schedconf.conformance import docs_reference

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = re.compile(r"^<!--\s*runnable(?::(?P<options>[^>]*))?\s*-->\s*$")
INTERNAL_STEP = re.compile(r"\b(stop|issue)s? \d+\b(?!\.\d)", re.IGNORECASE)  # "a stop 0.33 ..." is a version


def get_manual_sources() -> list[Path]:
    """The README, every page under docs/, and the documents the manual includes from elsewhere."""
    sys.path.insert(0, str(ROOT / "docs" / "_hooks"))
    try:
        import includes  # the manual's own list of included documents
    finally:
        sys.path.pop(0)
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return pages + [ROOT / source for source in includes.INCLUDED]


@dataclass(frozen=True)
class Runnable:
    path: Path
    line: int
    command: str
    exit_code: int
    timeout_s: float

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path}:{self.line}"


def get_runnables(path: Path) -> list[Runnable]:
    """The commands marked runnable in one Markdown file, with what they promise."""
    lines = path.read_text(encoding="utf-8").split("\n")
    found = []
    for number, line in enumerate(lines, 1):
        match = RUNNABLE.match(line.strip())
        if not match:
            continue
        options = dict(item.split("=", 1) for item in (match.group("options") or "").split() if "=" in item)
        fence = lines[number] if number < len(lines) else ""
        assert fence.strip() in ("```sh", "```bash"), (
            f"{path}:{number + 1}: a runnable marker must precede a ```sh block"
        )
        end = next(i for i in range(number + 1, len(lines)) if lines[i].strip() == "```")
        found.append(
            Runnable(
                path,
                number + 2,
                "\n".join(lines[number + 1 : end]),
                int(options.get("exit", 0)),
                float(options.get("timeout", 300)),
            )
        )
    return found


@pytest.fixture(scope="session")
def repo_copy(tmp_path_factory) -> Path:
    """The repository's tracked files (and the untracked ones git does not ignore), copied."""
    return copy_checkout(tmp_path_factory.mktemp("repo"))


def run_runnable(runnable: Runnable, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run(
        ["bash", "-e", "-c", runnable.command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=runnable.timeout_s,
    )


ALL_RUNNABLES = [r for source in get_manual_sources() for r in get_runnables(source)]


def test_there_are_runnable_commands_in_the_readme():
    # The README's first command and its tour are the promises a newcomer tries first.
    readme = [r for r in ALL_RUNNABLES if r.path == ROOT / "README.md"]
    assert any("schedconf demo" in r.command for r in readme)
    assert any(r.exit_code == 1 for r in readme), "the tour shows a failing run"


@pytest.mark.parametrize("runnable", ALL_RUNNABLES, ids=str)
def test_runnable_command(runnable: Runnable, repo_copy: Path):
    done = run_runnable(runnable, repo_copy)
    assert done.returncode == runnable.exit_code, (
        f"{runnable}: `{runnable.command}` exited {done.returncode}, the page promises {runnable.exit_code}\n"
        f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    )


def test_a_broken_command_fails_its_check(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text(
        "Intro.\n\n<!-- runnable: timeout=30 -->\n```sh\nschedconf run --examples 0\n```\n\n"
        "<!-- runnable: exit=1 -->\n```sh\ntrue\n```\n"
    )
    first, second = get_runnables(page)
    assert (first.line, first.exit_code, second.exit_code) == (5, 0, 1)  # line 5: the command itself
    # --examples 0 is refused (exit 2), and `true` does not exit 1: both break their promise.
    assert run_runnable(first, tmp_path).returncode != first.exit_code
    assert run_runnable(second, tmp_path).returncode != second.exit_code


def test_a_marker_without_a_command_is_an_error(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("<!-- runnable -->\nschedconf demo\n")
    with pytest.raises(AssertionError, match="must precede"):
        get_runnables(page)


def test_generated_reference_pages_are_current():
    assert docs_reference.get_stale_pages() == [], "regenerate: python -m schedconf.conformance.docs_reference --write"


def test_a_stale_reference_page_is_caught(tmp_path: Path, monkeypatch, capsys):
    for name in docs_reference.PAGES:
        shutil.copy(docs_reference.REFERENCE_DIR / name, tmp_path / name)
    assert docs_reference.main(["--check", "--dir", str(tmp_path)]) == 0
    # A code change the page does not know of: a new error code.
    import schedconf.spec.errors

    monkeypatch.setitem(schedconf.spec.errors.ERROR_CODES, "a_code_added_today", "what it means")
    assert docs_reference.main(["--check", "--dir", str(tmp_path)]) == 1
    assert "error-codes.md: out of date" in capsys.readouterr().err
    monkeypatch.undo()
    # A hand edit of a generated page.
    page = tmp_path / "profiles.md"
    page.write_text(page.read_text().replace("| `vllm-0.33` |", "| `vllm-0.34` |", 1))
    assert docs_reference.get_stale_pages(tmp_path) == ["profiles.md"]


def build_manual(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_manual_builds_in_strict_mode(tmp_path: Path):
    done = build_manual(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "format" / "index.html").is_file()
    assert (tmp_path / "site" / "findings" / "index.html").is_file()


def test_a_broken_link_or_anchor_fails_the_build(repo_copy: Path, tmp_path: Path):
    page = repo_copy / "docs" / "guide" / "verdicts.md"
    original = page.read_text()
    try:
        page.write_text(original + "\nSee [nowhere](no-such-page.md).\n")
        done = build_manual(repo_copy, tmp_path / "a")
        assert done.returncode != 0 and "no-such-page.md" in done.stdout + done.stderr
        page.write_text(original + "\nSee [the kinds](#no-such-anchor).\n")
        done = build_manual(repo_copy, tmp_path / "b")
        assert done.returncode != 0 and "no-such-anchor" in done.stdout + done.stderr
    finally:
        page.write_text(original)


def test_no_page_speaks_of_internal_work_steps():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in get_manual_sources()
        for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1)
        if INTERNAL_STEP.search(line)
    ]
    assert found == [], "\n".join(found)


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().split("\n")
    assert len(lines) <= 250
    text = "\n".join(lines)
    # The two commands, as .ci/run runs the second.
    assert "pip install -e . && schedconf demo" in text
    assert "pip install -e '.[test,impl]' && CI=1 python -m pytest -n 2 -q" in text
    assert "pip install -q -e '.[test,impl]' && CI=1 python -m pytest -n 2 -q" in (ROOT / ".ci" / "run").read_text()


def test_every_rule_names_a_function_of_the_models():
    import importlib

    from schedconf.spec.sources import RULES

    missing = []
    for rule in RULES:
        module, qualname = rule.model.split(":")
        target = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part, None)
        if target is None:
            missing.append(rule.model)
    assert missing == []
