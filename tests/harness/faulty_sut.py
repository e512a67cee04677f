"""A stdio scheduler that misbehaves on purpose (the fault-injection suite's SUT).

It is the reference model behind the JSON-lines protocol, except that from
its ``--at``-th message (counted over the process's life, 1 = the first
``init``) it does what ``--mode`` says:

==============  ============================================================
hang            stops answering for good (and ignores SIGTERM)
hang_once       answers that one message ``--delay`` seconds late, then goes on
slow            answers every message ``--delay`` seconds late
stray           writes one non-protocol line on stdout before the answer
crash           dies of SIGABRT (a crash, no answer)
exit            writes to stderr and exits with code 3 (no answer)
garbage         answers with a line that is not JSON
wrong_id        answers with an id nobody asked for
wrong_request   answers with the previous request's id
huge            answers with a 40 MB line
float           answers ``schedule`` with 7.0-style floats for token counts
bad_code        refuses ``add_request`` with an error code that does not exist
grandchild      like hang, after starting a ``sleep`` grandchild at ``init``
daemon          at ``init``, detaches a ``sleep`` daemon (double fork and
                ``setsid``: outside the process group), then behaves
late_unsupported  answers ``schedule`` with the error ``unsupported``
none            behaves (a control)
==============  ============================================================

It takes a ``batch`` of calls (PROTOCOL.md) as the protocol server does, each call counting as one
message, so a fault strikes the same call either way; ``--no-batch`` leaves the capability out of
its ``init`` reply (one request at a time). In a batch, ``wrong_request`` answers with the previous
call's ``index``.

With ``--once-file F`` the fault strikes once over all processes (the file
marks it as done), so a test can check that the next trace runs clean.
Every process it starts (itself, a grandchild) is recorded in the folder
``$FAULTY_SUT_PIDS`` (one file per pid), so tests can check none survives.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TextIO

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from schedconf.conformance.adapters.reference import ReferenceSut  # noqa: E402
from schedconf.conformance.protocol_server import ProtocolSession, write_reply  # noqa: E402


def get_start_time(pid: int) -> str:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat), "" when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def record_pid(pid: int) -> None:
    """One file per process, named by pid, holding its start time (so a reused pid is not taken for it)."""
    folder = os.environ.get("FAULTY_SUT_PIDS")
    if folder:
        Path(folder, str(pid)).write_text(get_start_time(pid))


def start_daemon() -> None:
    """Detach a ``sleep 300`` as daemons do: fork, ``setsid`` (a session and group of its own), fork, exit."""
    if os.fork() == 0:
        os.setsid()
        pid = os.fork()
        if pid == 0:
            os.execvp("sleep", ["sleep", "300"])
        record_pid(pid)
        os._exit(0)
    os.wait()


def floats_in(result: object) -> object:
    """The schedule result with its token counts as floats (7 -> 7.0)."""
    if isinstance(result, dict) and isinstance(result.get("num_scheduled_tokens"), dict):
        result = dict(result)
        result["num_scheduled_tokens"] = {k: float(v) for k, v in result["num_scheduled_tokens"].items()}
        result["total_num_scheduled_tokens"] = float(result["total_num_scheduled_tokens"])
    return result


class Faults:
    """The faults of one process: ``answer`` writes the reply to one call (a message, or a call of a batch)."""

    def __init__(self, args: argparse.Namespace, session: ProtocolSession, out: TextIO) -> None:
        self.args = args
        self.session = session
        self.out = out
        self.count = 0
        self.previous_id: object = None

    def answer(self, msg: dict, index: int | None = None) -> dict | None:
        """Answer one call (``index``: its place in a batch) with this process's fault; the reply, or None."""
        args, out = self.args, self.out
        self.count += 1
        count = self.count
        reply = self.session.process_message(msg)
        if msg.get("method") == "init" and args.no_batch and "result" in reply:
            reply["result"]["capabilities"].pop("batch", None)
        if index is not None:
            reply["index"] = index
        due = count >= args.at
        if due and args.once_file:
            due = count == args.at and not os.path.exists(args.once_file)
            if due:
                Path(args.once_file).write_text("")
        mode = args.mode if due else "none"
        if args.mode == "grandchild" and msg.get("method") == "init" and count == 1:
            child = subprocess.Popen(["sleep", "300"])
            record_pid(child.pid)
        if args.mode == "daemon" and msg.get("method") == "init" and count == 1:
            start_daemon()
        if mode == "late_unsupported" and msg.get("method") == "schedule":
            reply = {**reply, "error": {"code": "unsupported", "message": "this step looks hard"}}
            reply.pop("result", None)
        if mode in ("hang", "grandchild"):
            while True:
                time.sleep(60)
        if mode == "slow" or (mode == "hang_once" and count == args.at):
            time.sleep(args.delay)
        if mode == "stray" and count == args.at:
            out.write("debug: scheduling a step\n")
        if mode == "crash":
            os.kill(os.getpid(), signal.SIGABRT)
        if mode == "exit":
            print("faulty_sut: giving up", file=sys.stderr, flush=True)
            os._exit(3)
        if mode == "garbage":
            out.write("{this is not json\n")
            out.flush()
            self.previous_id = msg.get("id")
            return reply
        if mode == "wrong_id":
            reply["id"] = 10_000 + count
        if mode == "wrong_request" and index:
            reply["index"] = index - 1  # the previous call's reply again
        elif mode == "wrong_request" and self.previous_id is not None:
            reply["id"] = self.previous_id
        if mode == "huge":
            reply = {"id": reply["id"], "result": {"padding": "x" * 40_000_000}}
        if mode == "float" and msg.get("method") == "schedule" and "result" in reply:
            reply["result"] = floats_in(reply["result"])
        if mode == "bad_code" and msg.get("method") == "add_request":
            reply = {"id": reply["id"], "error": {"code": "not_a_code", "message": "refused for no reason"}}
            if index is not None:
                reply["index"] = index
        write_reply(out, reply)
        self.previous_id = msg.get("id")
        return reply


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="none")
    parser.add_argument(
        "--at", type=int, default=1, help="the call the fault strikes at (a batch's calls count one each)"
    )
    parser.add_argument("--delay", type=float, default=3.0)
    parser.add_argument("--no-batch", action="store_true", help="do not list the batch capability at init")
    parser.add_argument(
        "--once-file",
        default=None,
        help="strike only once over all processes: not if this file exists (it is made on striking)",
    )
    args = parser.parse_args()
    record_pid(os.getpid())
    if args.mode in ("hang", "grandchild"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    session = ProtocolSession(ReferenceSut)
    faults = Faults(args, session, sys.stdout)
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        if msg.get("method") == "batch":
            run = 0
            for index, call in enumerate(msg["params"]["calls"]):
                reply = faults.answer({"id": msg["id"], **call}, index)
                run += 1
                if reply is not None and reply.get("error", {}).get("code") in ("internal", "unsupported"):
                    break
            write_reply(sys.stdout, {"id": msg["id"], "result": {"calls_run": run}})
            continue
        faults.answer(msg)
        if session.shut_down:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
