"""``schedconf live``: record a real vLLM OpenAI server under a bounded load and check the recording.

Steps (each one prints a progress line to stderr):

1. the environment ``.venvs/live-vllm-VERSION`` (:mod:`schedconf.conformance.live.env`;
   built on first use, ~2 min and 3.5 GB);
2. a tiny Llama generated from ``--seed`` into ``RUN/model``
   (:mod:`schedconf.conformance.live.model`);
3. ``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1 with the
   recorder attached (``PYTHONPATH`` = ``conformance/live/boot`` + this
   checkout, ``SCHEDCONF_RECORD=RUN/recording``, the free queue observed), in
   its own session, a small KV pool (``--num-gpu-blocks-override``) so that
   the burst preempts; ready when ``/health`` answers;
4. the load (:func:`run_load`): concurrent completions, streaming and not,
   clients that disconnect mid-stream, ``n``/``max_tokens``/stop variations,
   a shared prompt prefix, then a burst of long requests;
5. shutdown: SIGINT to the server, then SIGKILL to its whole session after a
   grace period; every process of the session must be gone (no survivors);
6. ``schedconf check`` on each recording.

Everything lands in the run folder (``--out``, default
``reports/live-<time>``): the model, ``server.log``, ``recording/``,
``load.json`` and ``summary.json``.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedconf.conformance.engines.engine_env import IMPORT_ROOT

BOOT_DIR = Path(__file__).resolve().parent / "boot"
SERVED_MODEL_NAME = "schedconf-tiny"


class LiveError(Exception):
    """The live run could not be carried out (the CLI's exit 2); the message says what failed."""


def _log(message: str) -> None:
    print(f"[schedconf live] {message}", file=sys.stderr, flush=True)


def get_free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_recorder_env(record_dir: str | Path, observe: bool = True) -> dict[str, str]:
    """The variables that attach the recorder to every Python process started with them."""
    path = os.pathsep.join([str(BOOT_DIR), str(IMPORT_ROOT)])
    return {
        "PYTHONPATH": path,
        "SCHEDCONF_RECORD": str(record_dir),
        "SCHEDCONF_RECORD_OBSERVE": "1" if observe else "0",
    }


# ------------------------------------------------------------------ server


@dataclass
class Server:
    """A started OpenAI server: its process (session leader), port and log."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    started_s: float = 0.0

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def start_server(
    python: Path, model_dir: Path, run_dir: Path, env: dict[str, str], server_args: list[str], timeout_s: float = 240.0
) -> Server:
    """Start vLLM's OpenAI server in its own session and wait until ``/health`` answers 200."""
    port = get_free_port()
    log_path = run_dir / "server.log"
    argv = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *server_args,
    ]
    (run_dir / "server.cmd").write_text(" ".join(argv) + "\n")
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=str(run_dir)
        )
    server = Server(proc, port, log_path)
    while time.monotonic() - started < timeout_s:
        if proc.poll() is not None:
            raise LiveError(f"the server exited with {proc.returncode} before answering:\n{server.tail()}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                server.started_s = time.monotonic() - started
                return server
        except OSError:
            pass
        time.sleep(0.5)
    stop_server(server)
    raise LiveError(f"the server did not answer /health within {timeout_s:.0f} s:\n{server.tail()}")


def get_session_pids(sid: int) -> list[int]:
    """The live processes of session ``sid`` (read from /proc)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[3]) == sid:  # state, ppid, pgrp, session
            pids.append(int(entry))
    return pids


def stop_server(server: Server, grace_s: float = 30.0) -> list[int]:
    """SIGINT the server, SIGKILL its session after ``grace_s``; return the pids still alive after that (none)."""
    sid = server.proc.pid
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and get_session_pids(sid):
        server.proc.poll()
        time.sleep(0.2)
    for pid in get_session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        server.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    time.sleep(0.5)
    return get_session_pids(sid)


# -------------------------------------------------------------------- load


@dataclass
class LoadResult:
    """What the load did: requests by kind and outcome, and how long it took."""

    sent: int = 0
    completed: int = 0
    disconnected: int = 0
    failed: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, kind: str, outcome: str, error: str = "") -> None:
        with self.lock:
            self.sent += 1
            self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
            setattr(self, outcome, getattr(self, outcome) + 1)
            if error and len(self.errors) < 10:
                self.errors.append(error)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "completed": self.completed,
            "disconnected": self.disconnected,
            "failed": self.failed,
            "by_kind": dict(sorted(self.by_kind.items())),
            "errors": self.errors,
            "seconds": round(self.seconds, 2),
        }


def make_prompt(rng: random.Random, shared_prefix: list[str], length: int) -> str:
    words = list(shared_prefix) if rng.random() < 0.5 else []
    words += [f"w{rng.randrange(500)}" for _ in range(max(1, length - len(words)))]
    return " ".join(words)


def plan_load(num_requests: int, seed: int, max_model_len: int = 256) -> list[tuple[str, dict[str, Any]]]:
    """The requests of the load, in order: (kind, request body). The last quarter is the burst."""
    rng = random.Random(seed)
    prefix = [f"w{rng.randrange(500)}" for _ in range(64)]
    burst = max(4, num_requests // 4)
    plan: list[tuple[str, dict[str, Any]]] = []
    kinds = ["plain", "n2", "stop_string", "stop_token", "min_tokens", "stream", "stream_disconnect"]
    for i in range(max(0, num_requests - burst)):
        kind = kinds[i % len(kinds)]
        body: dict[str, Any] = {
            "prompt": make_prompt(rng, prefix, rng.randrange(8, 120)),
            "max_tokens": rng.randrange(4, 48),
            "temperature": 1.0,
            "seed": rng.randrange(1 << 30),
        }
        if kind == "n2":
            body["n"] = 2
        elif kind == "stop_string":
            body["stop"] = [f"w{rng.randrange(20)}"]  # detokenizer stop: the front end aborts the request
        elif kind == "stop_token":
            body["stop_token_ids"] = [3 + rng.randrange(40)]
        elif kind == "min_tokens":
            body.update(min_tokens=min(8, body["max_tokens"]), ignore_eos=True)
        elif kind.startswith("stream"):
            body["stream"] = True
            body["max_tokens"] = rng.randrange(16, 64)
        plan.append((kind, body))
    for _ in range(burst):
        prompt_len = rng.randrange(90, 150)
        plan.append(
            (
                "burst",
                {
                    "prompt": make_prompt(rng, prefix, prompt_len),
                    "temperature": 1.0,
                    "max_tokens": min(rng.randrange(48, 100), max_model_len - prompt_len - 1),
                    "ignore_eos": True,
                    "seed": rng.randrange(1 << 30),
                },
            )
        )
    return plan


def send_one(port: int, kind: str, body: dict[str, Any], result: LoadResult, timeout_s: float = 120.0) -> None:
    """Send one completion request; a ``stream_disconnect`` client hangs up after three chunks."""
    payload = json.dumps({"model": SERVED_MODEL_NAME, **body}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("POST", "/v1/completions", body=payload, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            result.count(kind, "failed", f"{kind}: HTTP {response.status}: {response.read()[:200]!r}")
            return
        if body.get("stream"):
            chunks = 0
            while True:
                line = response.readline()
                if not line:
                    break
                if line.startswith(b"data:"):
                    chunks += 1
                    if kind == "stream_disconnect" and chunks >= 3:
                        conn.sock.shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]
                        result.count(kind, "disconnected")
                        return
                    if line.strip() == b"data: [DONE]":
                        break
        else:
            json.loads(response.read())
        result.count(kind, "completed")
    except (OSError, ValueError, http.client.HTTPException) as exc:
        result.count(kind, "failed", f"{kind}: {type(exc).__name__}: {exc}")
    finally:
        conn.close()


def run_load(port: int, num_requests: int, seed: int, concurrency: int = 6, max_model_len: int = 256) -> LoadResult:
    """The mixed phase with ``concurrency`` clients, then the burst all at once."""
    plan = plan_load(num_requests, seed, max_model_len)
    burst = [p for p in plan if p[0] == "burst"]
    mixed = [p for p in plan if p[0] != "burst"]
    result = LoadResult()
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for future in [pool.submit(send_one, port, kind, body, result) for kind, body in mixed]:
            future.result()
    with ThreadPoolExecutor(max_workers=max(1, len(burst))) as pool:
        for future in [pool.submit(send_one, port, kind, body, result) for kind, body in burst]:
            future.result()
    result.seconds = time.monotonic() - started
    return result


# --------------------------------------------------------------------- run


def run_live(args: Any) -> int:
    """Carry out parsed ``schedconf live`` arguments; return the exit status (the check's, 2 on a failed run)."""
    from schedconf.conformance.engines import engine_env
    from schedconf.conformance.live.check import check_recording, render_outcome
    from schedconf.conformance.live.env import LIVE_FAMILY

    run_dir = Path(args.out or Path("reports") / f"live-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "release": args.release,
        "requests": args.requests,
        "seed": args.seed,
        "run_dir": str(run_dir),
    }
    try:
        t0 = time.monotonic()
        python = engine_env.ensure_env(LIVE_FAMILY, args.release)
        summary["env_seconds"] = round(time.monotonic() - t0, 1)
        env = {
            **os.environ,
            **engine_env.driver_env(LIVE_FAMILY, args.release),
            **get_recorder_env(run_dir / "recording", observe=not args.no_observe),
        }
        if args.async_scheduling:
            env["SCHEDCONF_CPU_ASYNC_SCHEDULING"] = "1"
        model_dir = run_dir / "model"
        _log(f"writing the tiny model (seed {args.seed}) to {model_dir}")
        subprocess.run(
            [str(python), "-m", "schedconf.conformance.live.model", str(model_dir), "--seed", str(args.seed)],
            env={**env, "SCHEDCONF_RECORD": ""},
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=300,
        )
        server_args = [
            "--dtype",
            "float32",
            "--enforce-eager",
            "--max-model-len",
            str(args.max_model_len),
            "--max-num-seqs",
            str(args.max_num_seqs),
            "--block-size",
            str(args.block_size),
            "--num-gpu-blocks-override",
            str(args.num_gpu_blocks),
            "--seed",
            str(args.seed),
            *(["--async-scheduling"] if args.async_scheduling else []),
            *args.server_arg,
        ]
        _log(f"starting vLLM's OpenAI server ({' '.join(server_args)})")
        server = start_server(python, model_dir, run_dir, env, server_args, timeout_s=args.start_timeout)
        summary["server_start_seconds"] = round(server.started_s, 1)
        _log(f"server ready on port {server.port} after {server.started_s:.1f} s; sending {args.requests} requests")
        try:
            load = run_load(server.port, args.requests, args.seed, args.concurrency, args.max_model_len)
        finally:
            survivors = stop_server(server)
        summary["load"] = load.to_dict()
        summary["survivors"] = survivors
        _log(
            f"load done in {load.seconds:.1f} s: {load.completed} completed, {load.disconnected} disconnected "
            f"mid-stream, {load.failed} failed; server stopped ({'no survivors' if not survivors else survivors})"
        )
        if survivors:
            raise LiveError(f"processes of the server's session survived SIGKILL: {survivors}")
        if load.failed:
            _log("failed requests: " + "; ".join(load.errors[:3]))
    except (LiveError, engine_env.EngineEnvError, subprocess.SubprocessError) as exc:
        summary["error"] = str(exc)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        print(f"error: {exc}", file=sys.stderr)
        return 2
    recordings = sorted((run_dir / "recording").glob("engine-*.jsonl"))
    recordings = [p for p in recordings if not p.name.endswith(".trace.jsonl")]
    if not recordings:
        print(
            f"error: no recording in {run_dir / 'recording'}: the recorder did not attach (see {server.log_path})",
            file=sys.stderr,
        )
        return 2
    worst = 0
    summary["checks"] = []
    for path in recordings:
        outcome = check_recording(path)
        print(render_outcome(outcome, str(path)))
        summary["checks"].append(
            {
                "recording": str(path),
                "verdict": outcome.result.verdict,
                "comparison": outcome.comparison,
                "steps": outcome.result.steps_run,
                "scope_problems": outcome.scope_problems,
                "trace": str(outcome.trace_path),
            }
        )
        worst = 1 if 1 in (worst, outcome.exit_code) else max(worst, outcome.exit_code)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    print(f"run folder: {run_dir}")
    return worst


def run_record(args: Any) -> int:
    """``schedconf record --out DIR -- COMMAND ...``: run COMMAND with the recorder attached; or print the env."""
    env_vars = get_recorder_env(Path(args.out).resolve(), observe=args.observe)
    if args.print_env or not args.command:
        for key, value in env_vars.items():
            shown = f"{value}{os.pathsep}${{PYTHONPATH}}" if key == "PYTHONPATH" else value
            print(f"export {key}='{shown}'")
        return 0
    command = args.command[1:] if args.command[0] == "--" else args.command
    env = dict(os.environ)
    for key, value in env_vars.items():
        env[key] = f"{value}{os.pathsep}{env[key]}" if key == "PYTHONPATH" and env.get(key) else value
    proc = subprocess.Popen(command, env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        return proc.wait()
