"""The supervisor every scheduler process runs under: nothing the scheduler starts outlives it.

``python -I -S supervisor.py HARNESS_PID -- COMMAND ARGS...`` starts the
command as its only child, with the supervisor's stdin, stdout and stderr
(the protocol's pipes), and then:

* makes itself a *child subreaper* (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``):
  a daemon the scheduler detaches (a double fork, ``setsid``) is reparented
  to the supervisor instead of to init, so it stays a descendant;
* when the command exits, kills every remaining descendant and exits with
  the command's exit code, or dies of the command's signal, so the harness
  reads ``exit code 3`` or ``killed by SIGABRT`` as if it had started the
  command itself;
* on SIGTERM (the harness closing the scheduler), kills the command and every
  descendant, then exits;
* when the harness dies (its parent is no longer ``HARNESS_PID``: even a
  SIGKILLed harness), does the same within ``POLL_S`` seconds.

It runs with ``-I -S`` (standard library only, no site) so that it starts in
a few milliseconds and cannot import anything of the scheduler's. Where the
operating system has no subreaper (not Linux), daemons that detach escape it;
everything else holds (PROTOCOL.md, "Processes").
"""

from __future__ import annotations

import os
import signal
import sys

POLL_S = 0.2
"""How often the supervisor checks that the harness is alive."""

PR_SET_CHILD_SUBREAPER = 36


def set_child_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def get_descendants(root: int) -> list[int]:
    """Every live descendant of ``root`` (from /proc; empty where there is no /proc)."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[-1].split()
        if len(fields) > 2 and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    out: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


def kill_descendants() -> None:
    """SIGKILL every descendant until none is left (a process may fork while it is being killed), then reap."""
    me = os.getpid()
    for _ in range(50):
        pids = get_descendants(me)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reap_all()
    reap_all()


def reap_all() -> list[tuple[int, int]]:
    """Reap every exited child without waiting; the ``(pid, status)`` of each."""
    out: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return out
        if pid == 0:
            return out
        out.append((pid, status))


def exit_as(status: int) -> None:
    """Exit as the command did: its exit code, or death by its signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal that does not end a process (never for SIGKILL, SIGABRT, SIGSEGV, ...)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


RESTORED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, name))
"""The signals Python ignores at start: the command gets their default action back, as ``subprocess`` gives it."""


def start_command(argv: list[str], mask: set[int | signal.Signals]) -> int:
    """Fork and exec ``argv`` with the supervisor's stdio, the signal mask it was started with, and
    :data:`RESTORED_SIGNALS` at their default action, as a command the harness started directly would have."""
    pid = os.fork()
    if pid == 0:
        try:
            for sig in RESTORED_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(2, f"cannot start {argv[0]!r}: {exc.strerror or exc}\n".encode())
        os._exit(127)
    return pid


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        os.write(2, b"usage: supervisor.py HARNESS_PID -- COMMAND ARGS...\n")
        os._exit(2)
    harness = int(argv[0])
    command = argv[2:]
    watched = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    set_child_subreaper()
    child = start_command(command, old_mask)
    # The command has the protocol's pipes; the supervisor keeps none of them open, so the
    # harness sees the end of the command's stdout when the command goes.
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    while True:
        info = signal.sigtimedwait(watched, POLL_S)
        if info is not None and info.si_signo != signal.SIGCHLD:
            kill_descendants()  # told to stop: the command and everything it started
            os._exit(128 + info.si_signo)
        for pid, status in reap_all():
            if pid == child:
                kill_descendants()
                exit_as(status)
        if os.getppid() != harness:  # the harness is gone, however it died
            kill_descendants()
            os._exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
