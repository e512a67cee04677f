"""MkDocs hook: the manual includes documents that live beside their code, and keeps links honest.

Some pages are written next to what they describe (the trace format next to its schema, the
protocol next to its server, the v0 model's notes in ``spec/v0/``, the findings in ``reports/``),
and they read well on a code host as they are. This hook adds each of them to the manual under
the page name in ``INCLUDED``, and rewrites every relative link of every page, native or
included, written as a path in the repository:

* a link to a document the manual includes becomes a link to its page (anchor kept);
* a link to a page under ``docs/`` stays a link to that page;
* a link to any other file of the repository (source code, a trace, a sample report) becomes
  the file's path in code font: the manual does not serve the repository's files, and a dead
  link would fail the strict build.

A link to a path that does not exist in the repository is left as it is, so the strict build
reports it. Nothing here reads the network.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]

# repository path -> page of the manual
INCLUDED: dict[str, str] = {
    "conformance/FORMAT.md": "reference/format.md",
    "conformance/PROTOCOL.md": "reference/protocol.md",
    "conformance/CHECKS.md": "reference/safety-properties.md",
    "reports/findings.md": "findings.md",
    "spec/v0/README.md": "models/v0.md",
    "spec/symbolic/UNBOUNDED.md": "proofs/unbounded.md",
    "spec/symbolic/LIVENESS.md": "proofs/liveness.md",
    "spec/symbolic/IN_FLIGHT.md": "proofs/in-flight.md",
    "impl/README.md": "engine-internals.md",
    "examples/js-scheduler/README.md": "guide/js-example.md",
    "CHANGELOG.md": "changelog.md",
}
PAGE_TO_SOURCE = {page: source for source, page in INCLUDED.items()}

# [text](target) not preceded by "!" (images are left alone); the target has no spaces.
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def on_files(files: Files, config) -> Files:
    for source, page in INCLUDED.items():
        text = (ROOT / source).read_text(encoding="utf-8")
        files.append(File.generated(config, page, content=text))
    return files


def get_repo_path(page_src_uri: str) -> str:
    """Where a page's text lives in the repository (its links are relative to that)."""
    return PAGE_TO_SOURCE.get(page_src_uri, f"docs/{page_src_uri}")


def compute_link(target: str, repo_path: str, page_src_uri: str) -> str | None:
    """The target a link should have in the manual, or None when it should become plain text."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return target
    path, _, anchor = target.partition("#")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(repo_path), path))
    if resolved.startswith("../") or not (ROOT / resolved).exists():
        return target  # outside the repository or missing: the strict build reports it
    if resolved in INCLUDED:
        page = INCLUDED[resolved]
    elif resolved.startswith("docs/") and resolved.endswith(".md"):
        page = resolved[len("docs/") :]
    else:
        return None
    relative = posixpath.relpath(page, posixpath.dirname(page_src_uri) or ".")
    return relative + (f"#{anchor}" if anchor else "")


def render_links(markdown: str, repo_path: str, page_src_uri: str) -> str:
    out: list[str] = []
    in_fence = False
    for line in markdown.split("\n"):
        if FENCE.match(line.lstrip()):
            in_fence = not in_fence
        if in_fence:
            out.append(line)
            continue

        def replace(match: re.Match[str]) -> str:
            text, target = match.group("text"), match.group("target")
            new = compute_link(target, repo_path, page_src_uri)
            if new is not None:
                return f"[{text}]({new})"
            plain = target.split("#")[0]
            if text.strip("`") == plain or text.strip("`").rstrip("/") == plain.rstrip("/"):
                return f"`{plain}`"
            return f"{text} (`{plain}`)"

        out.append(LINK.sub(replace, line))
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    src_uri = page.file.src_uri
    return render_links(markdown, get_repo_path(src_uri), src_uri)
