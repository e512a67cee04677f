"""A deliberately broken scheduler adapter, kept to prove the harness catches it.

It is the reference model except that, under FCFS, it preempts the *head* of
the running list instead of the tail (the classic victim-order bug).
"""

from schedconf.conformance.adapters.reference import ReferenceSut
from schedconf.spec.v1.request import Request
from schedconf.spec.v1.scheduler import Scheduler


class _HeadVictimScheduler(Scheduler):
    def select_victim(self) -> Request:
        return self.running[0] if self.policy == "fcfs" else super().select_victim()


class BrokenSut(ReferenceSut):
    name = "broken-head-victim"

    def start(self, config, profile):
        super().start(config, profile)
        self.scheduler = _HeadVictimScheduler(self.scheduler.config, profile)


class RaisingSut(ReferenceSut):
    """Raises on its 3rd schedule() call of every trace: a crash the campaign must record and survive."""

    name = "raising"

    def start(self, config, profile):
        super().start(config, profile)
        self.calls = 0

    def schedule(self):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("boom in schedule()")
        return super().schedule()


class HangingSut(ReferenceSut):
    """Never answers its 2nd schedule() call."""

    name = "hanging"

    def start(self, config, profile):
        super().start(config, profile)
        self.calls = 0

    def schedule(self):
        import time

        self.calls += 1
        if self.calls == 2:
            time.sleep(60)
        return super().schedule()


class OneStepAtATimeSut(ReferenceSut):
    """The reference, declaring no support for steps in flight (as a scheduler written before them would)."""

    name = "one-step-at-a-time"
    in_flight = False
