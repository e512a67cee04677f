"""The start every GPU check shares: pick the device, or say why nothing was checked."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import torch


def get_check_device(
    device_name: str, allow_cpu: bool, report_path: Path, check: str
) -> tuple[torch.device, bool] | int:
    """``(device, dry_run)`` for a check to run on, or the exit code when it must not run.

    Without CUDA the check writes a ``skipped`` report (it needs a GPU) and
    exits 0; a CPU device without ``--allow-cpu`` exits 2. A CPU dry run uses
    one thread (the tiny model gains nothing from more; CI shares two cores).
    """
    device = torch.device(device_name)
    if device.type == "cuda" and not torch.cuda.is_available():
        message = f"no CUDA device on this machine: {check} checked nothing (it needs a GPU)"
        print(message)
        report_path.write_text(json.dumps({"verdict": "skipped", "reason": message, "ran": False}, indent=1) + "\n")
        return 0
    if device.type != "cuda" and not allow_cpu:
        print(f"device {device} is not a GPU; pass --allow-cpu for a dry run")
        return 2
    dry_run = device.type != "cuda"
    if dry_run:
        torch.set_num_threads(1)
    return device, dry_run


def get_device_info(device: torch.device, dry_run: bool) -> dict[str, Any]:
    """What a check's report says about the machine: versions, the device, and the GPU's name and memory."""
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "dry_run_on_cpu": dry_run,
    }
    if not dry_run:
        props = torch.cuda.get_device_properties(device)
        info.update(
            {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1), "cuda": torch.version.cuda}
        )
    return info
