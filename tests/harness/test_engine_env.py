"""The generalized engine-environment builder (conformance/engines/engine_env.py), without building any engine."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from schedconf.conformance.engines import engine_env, vllm_env
from schedconf.conformance.engines.engine_env import FAMILIES, EngineEnvError, EngineFamily


def _family(tmp_path: Path, text: str = "pkg==1.0\n") -> EngineFamily:
    envs = tmp_path / "envs"
    envs.mkdir(exist_ok=True)
    (envs / "toy-1.0.txt").write_text(text)
    (envs / "toy-0.9.txt").write_text(text)
    return EngineFamily(
        name="toy",
        label="Toy",
        driver_module="toy_driver",
        env_vars=lambda home: {"TOY_HOME": str(home)},
        envs_dir=envs,
    )


@pytest.fixture
def fake_run(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace the build commands: 'create venv' makes bin/python, the self-check answers ok."""
    steps: list[str] = []

    def run(step, argv, env=None, timeout=None, family=None):  # noqa: ANN001, ANN202
        steps.append(step)
        if step == "create venv":
            python = Path(argv[-1]) / "bin" / "python"
            python.parent.mkdir(parents=True)
            python.write_text("")
        if step.startswith("self-check"):
            assert argv[1:] == ["-m", "toy_driver", "--self-check", "--expect-version", "1.0"]
            assert env is not None and env["TOY_HOME"].endswith("toy-1.0")
            return "noise\nself-check ok: toy 1.0\n"
        return ""

    monkeypatch.setattr(engine_env, "_run", run)
    return steps


def test_families_and_versions_do_not_mix() -> None:
    assert {"vllm", "nano-vllm"} <= set(FAMILIES)
    assert "20260210" in engine_env.supported_versions("nano-vllm")
    assert "20260210" not in engine_env.supported_versions("vllm")
    assert vllm_env.supported_versions() == engine_env.supported_versions("vllm")
    assert vllm_env.venv_dir("0.33.0") == engine_env.venv_dir("vllm", "0.33.0")
    assert vllm_env.driver_env("0.33.0")["VLLM_TARGET_DEVICE"] == "cpu"
    assert vllm_env.VllmEnvError is EngineEnvError
    assert engine_env.venv_dir("nano-vllm", "20260210").name == "nano-vllm-20260210"
    assert "schedconf env nano-vllm 20260210" in engine_env.not_ready_message("nano-vllm", "20260210")
    with pytest.raises(EngineEnvError, match="unknown engine family"):
        engine_env.supported_versions("nope")
    with pytest.raises(EngineEnvError, match="known releases: 20260210"):
        engine_env.requirements_file("nano-vllm", "1.0")


def test_build_is_idempotent_and_rebuilds_on_a_changed_list(tmp_path: Path, fake_run: list[str]) -> None:
    fam = _family(tmp_path)
    assert engine_env.supported_versions(fam) == ["0.9", "1.0"]
    assert not engine_env.is_env_ready(fam, "1.0", tmp_path)
    python = engine_env.build_env(fam, "1.0", tmp_path)
    assert python == tmp_path / ".venvs" / "toy-1.0" / "bin" / "python"
    assert fake_run == [
        "create venv",
        "upgrade pip",
        "pip install --no-deps",
        "self-check (import the engine, build one scheduler)",
    ]
    assert engine_env.is_env_ready(fam, "1.0", tmp_path)
    fake_run.clear()
    assert engine_env.ensure_env(fam, "1.0", tmp_path) == python and fake_run == []
    (fam.envs_dir / "toy-1.0.txt").write_text("pkg==2.0\n")
    assert not engine_env.is_env_ready(fam, "1.0", tmp_path)
    engine_env.ensure_env(fam, "1.0", tmp_path)
    assert fake_run[0] == "create venv" and engine_env.is_env_ready(fam, "1.0", tmp_path)


def test_a_failed_build_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_run: list[str]) -> None:
    fam = _family(tmp_path)
    real = engine_env._run

    def failing(step, argv, env=None, timeout=None, family=None):  # noqa: ANN001, ANN202
        if step == "pip install --no-deps":
            raise EngineEnvError("pip install --no-deps failed (exit 1)")
        return real(step, argv, env, timeout, family)

    monkeypatch.setattr(engine_env, "_run", failing)
    with pytest.raises(EngineEnvError, match="pip install"):
        engine_env.build_env(fam, "1.0", tmp_path)
    assert not (tmp_path / ".venvs" / "toy-1.0").exists()


def test_cli_check_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from schedconf.conformance.cli import build_parser

    args = build_parser().parse_args(["env", "nano-vllm", "20260210", "--check", "--root", str(tmp_path)])
    assert args.engine_family == "nano-vllm"
    assert args.func(args) == 1
    assert "nano-vllm 20260210: not built" in capsys.readouterr().out
    args = build_parser().parse_args(["env", "vllm", "0.33.0", "--check", "--root", str(tmp_path)])
    assert args.func(args) == 1 and "vLLM 0.33.0: not built" in capsys.readouterr().out
    bad = argparse.Namespace(version="9.9", check=False, root=tmp_path, force=False, engine_family="nano-vllm")
    assert engine_env.run_env(bad) == 2
    assert "no pinned environment for nano-vllm '9.9'" in capsys.readouterr().err


def test_registry_names_the_adapter_without_importing_it() -> None:
    from schedconf.conformance.adapters import ADAPTER_PREFIXES, UnknownSut, make_sut

    assert ADAPTER_PREFIXES["nano-vllm@"] == "schedconf.conformance.adapters.nanovllm:make_nanovllm_sut"
    with pytest.raises(UnknownSut, match="pinned releases: 20260210"):
        make_sut("nano-vllm@1.0")


def test_a_release_can_have_its_own_driver(tmp_path: Path, fake_run: list[str]) -> None:
    assert engine_env.get_driver_module("vllm", "0.10.2") == "schedconf.conformance.engines.vllm_v0_driver"
    assert engine_env.get_driver_module("vllm", "0.33.0") == "schedconf.conformance.engines.vllm_driver"
    fam = EngineFamily(
        name="toy",
        label="Toy",
        driver_module="other_driver",
        env_vars=lambda home: {"TOY_HOME": str(home)},
        envs_dir=_family(tmp_path).envs_dir,
        release_drivers={"1.0": "toy_driver"},
    )
    engine_env.build_env(fam, "1.0", tmp_path)  # fake_run asserts the self-check runs toy_driver for 1.0
    assert engine_env.is_env_ready(fam, "1.0", tmp_path)
