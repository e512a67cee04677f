"""A pytest plugin: conformance tests in a scheduler's own test suite.

Installed with schedconf (entry point ``pytest11``); it does nothing unless
``--schedconf-sut`` is given::

    pytest --schedconf-sut="stdio:./my-scheduler --serve" --schedconf-examples=200
    pytest --schedconf-sut=module:mypkg.adapter:make_sut -n 4          # local cores (pytest-xdist)
    pytest --schedconf-sut=... -d --tx ssh=user@hostA//python=python3 --tx ssh=user@hostB//python=python3 \\
           --rsyncdir mypkg                                           # several machines (xdist remote hosts)

It adds one test item per trace of the golden corpus for the chosen profile
and one item per generated trace, ``schedconf-campaign[s<seed>-<index>]``:
trace ``index`` is drawn from ``--schedconf-seed`` when the item runs (not at
collection, which stays cheap), so every xdist worker and every host collects
the same items, and every failing trace is its own failed item. A failing
item reports the first divergence, the path of the saved failing trace and of
its shrunk version, in a folder of the session's own under ``--schedconf-out``
(``session-<time>-<pid>/``, shared by the session's xdist workers), so two
sessions never overwrite each other's traces. ``--schedconf-shard-size`` is deprecated and ignored.
``--schedconf-profile vllm-0.10`` checks a v0 scheduler (vLLM's legacy one):
the v0 corpus and v0 workloads.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from _pytest._code.code import TerminalRepr  # what pytest's Item.repr_failure returns (not re-exported)

from schedconf.conformance.cli import int_at_least


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("schedconf", "scheduler conformance (schedconf)")
    group.addoption(
        "--schedconf-sut",
        default=None,
        metavar="SUT",
        help="run conformance items against this scheduler (same names as `schedconf run --sut`)",
    )
    group.addoption("--schedconf-profile", default="vllm-0.33", help="release profile (default vllm-0.33)")
    group.addoption("--schedconf-comparison", default="strict", choices=["strict", "observable", "safety"])
    group.addoption(
        "--schedconf-examples", type=int_at_least(0), default=100, help="generated traces (default 100; 0: corpus only)"
    )
    group.addoption("--schedconf-seed", type=int, default=0)
    group.addoption(
        "--schedconf-shard-size",
        type=int,
        default=None,
        help="deprecated, ignored: there is one item per generated trace now, so every failure shows",
    )
    group.addoption("--schedconf-no-corpus", action="store_true", help="skip the golden corpus items")
    group.addoption(
        "--schedconf-corpus-filter",
        default=None,
        metavar="K=V,...",
        help="only corpus traces whose manifest entry matches, e.g. prefix_caching=false",
    )
    group.addoption(
        "--schedconf-out",
        default="reports/pytest",
        help="where failing traces are saved: each session in a folder of its own under it, "
        "session-<time>-<pid>/ (default reports/pytest)",
    )


def _matches(entry: dict[str, Any], spec: str | None) -> bool:
    if not spec:
        return True
    for cond in spec.split(","):
        key, _, value = cond.partition("=")
        if str(entry.get(key.strip())).lower() != value.strip().lower():
            return False
    return True


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    sut = config.getoption("--schedconf-sut")
    if not sut:
        return
    from schedconf.conformance.traces.vectors import iter_corpus

    profile = config.getoption("--schedconf-profile")
    if not config.getoption("--schedconf-no-corpus"):
        for prof, path, entry in iter_corpus(profile):
            if _matches(entry, config.getoption("--schedconf-corpus-filter")):
                items.append(CorpusItem.from_parent(session, name=f"schedconf-corpus[{prof}/{path.stem}]", path_=path))
    seed = config.getoption("--schedconf-seed")
    for index in range(config.getoption("--schedconf-examples")):
        items.append(CampaignItem.from_parent(session, name=get_campaign_item_name(seed, index), index=index))


def get_campaign_item_name(seed: int, index: int) -> str:
    """The stable name of generated trace ``index`` of ``seed``'s campaign."""
    return f"schedconf-campaign[s{seed}-{index:05d}]"


def make_session_dir_name() -> str:
    """A folder name no other session on this machine takes: the start time and the controller's pid."""
    import os
    import time

    return f"session-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def get_session_dir(config: pytest.Config) -> Path:
    """This session's folder for failing traces, under ``--schedconf-out``; the xdist workers share the controller's."""
    worker_input = getattr(config, "workerinput", None)
    name = worker_input.get("schedconf_session_dir") if worker_input else None
    return Path(config.getoption("--schedconf-out")) / (name or config.stash[SESSION_DIR_KEY])


SESSION_DIR_KEY = pytest.StashKey[str]()


class _XdistSessionDir:
    """Hands the controller's session folder name to each xdist worker (local or remote)."""

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["schedconf_session_dir"] = node.config.stash[SESSION_DIR_KEY]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:  # noqa: ARG001
    if not config.getoption("--schedconf-sut", None) or getattr(config, "workerinput", None):
        return
    folder = get_session_dir(config)
    if folder.is_dir():
        terminalreporter.write_line(f"schedconf: this session's failing traces are in {folder}/")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[SESSION_DIR_KEY] = make_session_dir_name()
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistSessionDir(), "schedconf-xdist-session-dir")
    if config.getoption("--schedconf-shard-size", None) is not None:
        config.issue_config_time_warning(
            pytest.PytestWarning(
                "--schedconf-shard-size is deprecated and ignored: schedconf adds one item per generated trace"
            ),
            stacklevel=2,
        )


class _SchedconfItem(pytest.Item):
    """Shared: the SUT (one per worker process) and failure handling."""

    _suts: dict[str, Any] = {}

    def sut(self) -> Any:
        from schedconf.conformance.adapters import make_sut

        name = self.config.getoption("--schedconf-sut")
        if name not in self._suts:
            self._suts[name] = make_sut(name)
        return self._suts[name]

    def check(self, trace: Any, label: str) -> None:
        from schedconf.conformance.checking.replay import FAIL, UNKNOWN, render_divergence, replay
        from schedconf.conformance.checking.shrink import shrink_trace
        from schedconf.conformance.traces.trace import write_trace

        comparison = self.config.getoption("--schedconf-comparison")
        result = replay(trace, self.sut(), comparison)
        if result.verdict == UNKNOWN:
            pytest.skip(f"verdict unknown: {result.detail}")
        if result.verdict != FAIL:
            return
        out = get_session_dir(self.config)
        saved = out / f"{label}.jsonl"
        write_trace(saved, trace)
        message = render_divergence(trace, result)
        try:
            shrunk = shrink_trace(trace, self.sut(), comparison, time_budget_s=30)
            minimal = out / f"{label}.min.jsonl"
            write_trace(minimal, shrunk.trace)
            message += f"\n\nminimal trace ({shrunk.num_events} events): {minimal}"
        except ValueError:
            pass
        raise SchedconfFailure(f"failing trace: {saved}\n{message}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str | TerminalRepr:
        if isinstance(excinfo.value, SchedconfFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, self.name


class SchedconfFailure(Exception):
    """A conformance failure: the message is the divergence report."""


class CorpusItem(_SchedconfItem):
    def __init__(self, *, path_: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.trace_path = path_

    def runtest(self) -> None:
        from schedconf.conformance.traces.trace import read_trace

        self.check(read_trace(self.trace_path), f"corpus-{self.trace_path.parent.name}-{self.trace_path.stem}")


class CampaignItem(_SchedconfItem):
    """One generated trace: drawn from the seed by index when the item runs."""

    def __init__(self, *, index: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.index = index

    _specs: dict[str, Any] = {}

    def campaign_spec(self) -> Any:
        """The campaign these items are drawn from, fitted to the SUT as ``schedconf run`` fits it (per worker)."""
        from schedconf.conformance.runs.campaign import CampaignSpec, fit_spec_to_sut

        name = self.config.getoption("--schedconf-sut")
        if name not in self._specs:
            spec = CampaignSpec(
                sut=name,
                profile=self.config.getoption("--schedconf-profile"),
                examples=max(1, self.config.getoption("--schedconf-examples")),
                seed=self.config.getoption("--schedconf-seed"),
                comparison=self.config.getoption("--schedconf-comparison"),
            )
            self._specs[name] = fit_spec_to_sut(spec, self.sut())[0]
        return self._specs[name]

    def runtest(self) -> None:
        from schedconf.conformance.runs.campaign import generate_workload
        from schedconf.conformance.workloads.workload import WorkloadError, run_workload

        seed = self.config.getoption("--schedconf-seed")
        # As a campaign draws them (the SUT's forced config and pool headroom applied):
        # a share are configs one step past a limit.
        workload = generate_workload(self.campaign_spec(), self.index)
        try:
            trace = run_workload(workload)
        except WorkloadError as exc:
            pytest.skip(f"discarded: the reference did not finish this workload ({exc})")
        trace.path = f"campaign-s{seed}-{self.index:05d}"
        self.check(trace, trace.path)
