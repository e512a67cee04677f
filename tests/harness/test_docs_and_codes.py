"""Docs generated from their single sources stay current; every error code is documented."""

import ast
from pathlib import Path

from schedconf.conformance.traces.format_doc import render_format_md
from schedconf.spec.errors import ERROR_CODES

ROOT = Path(__file__).parents[2]


def _codes_raised_in(folder: Path) -> set[str]:
    codes = set()
    for path in folder.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                args = node.args
                # spec's require(cond, ErrorClass, code, message); the drivers' require(cond, code, message)
                if name in ("require", "_require") and len(args) >= 3:
                    code = args[1] if isinstance(args[1], ast.Constant) else args[2]
                    if isinstance(code, ast.Constant):
                        codes.add(code.value)
                if name in ("InvalidEvent", "InvalidConfig") and args and isinstance(args[0], ast.Constant):
                    codes.add(args[0].value)
    return codes


def test_every_raised_code_is_in_the_table():
    raised = _codes_raised_in(ROOT / "spec") | _codes_raised_in(ROOT / "conformance")
    assert raised, "the scan found no codes"
    assert raised <= set(ERROR_CODES), sorted(raised - set(ERROR_CODES))


def test_format_md_is_generated_from_the_schema():
    assert (ROOT / "conformance" / "FORMAT.md").read_text() == render_format_md(), (
        "regenerate: python -m schedconf.conformance.traces.format_doc > conformance/FORMAT.md"
    )


def test_protocol_md_lists_the_input_codes():
    text = (ROOT / "conformance" / "PROTOCOL.md").read_text()
    for code in (
        "duplicate_request_id",
        "empty_prompt",
        "prompt_too_long",
        "unknown_request_id",
        "bad_num_sampled_tokens",
        "unsupported",
        "internal",
    ):
        assert f"`{code}`" in text, code
