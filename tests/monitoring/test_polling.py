"""monitoring.polling.Poller: the dashboard's slow sources asked on a thread, the last good answer kept."""

from __future__ import annotations

import threading
from pathlib import Path

from monitoring.polling import Poller
from ops.harness import wait_until
from router_config import load

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "local.toml"


class Answers(Poller):
    """Answers [{"n": 1}], [{"n": 2}], ... and fails on the calls `failing` names."""

    thread_name = "test-poller"

    def __init__(self, failing: set[int], wanted: bool = True) -> None:
        super().__init__(load(EXAMPLE), interval=0.01)
        self.calls, self.failing, self._wanted = 0, failing, wanted

    def wanted(self) -> bool:
        return self._wanted

    def look(self) -> list[dict]:
        self.calls += 1
        if self.calls in self.failing:
            raise RuntimeError(f"call {self.calls} fails")
        return [{"n": self.calls}]


def test_a_failed_look_keeps_the_last_good_answer_and_the_poller_goes_on(caplog) -> None:
    poller = Answers(failing={2, 3, 4, 5, 6, 7, 8, 9, 10}).start()
    try:
        wait_until(lambda: poller.calls >= 5, 10, "five looks")
        assert poller.snapshot() == [{"n": 1}]  # calls 2.. failed: the answer of call 1 stays
        wait_until(lambda: poller.snapshot()[0]["n"] >= 11, 10, "a good answer after the failures")
    finally:
        poller.stop()
    assert "polling failed" in caplog.text and "call 2 fails" in caplog.text


def test_a_poller_with_nothing_to_ask_starts_no_thread() -> None:
    poller = Answers(failing=set(), wanted=False).start()
    assert poller.calls == 0 and poller.snapshot() == []
    assert poller.thread is None


def test_stop_ends_the_thread() -> None:
    """(Before `stop` waited, the thread of one poller outlived it and a check by thread name in the next test
    found it: a flaky test under load.)"""
    poller = Answers(failing=set()).start()
    wait_until(lambda: poller.calls >= 1, 10, "a look")
    assert poller.thread is not None and poller.thread.is_alive()
    poller.stop()
    assert not poller.thread.is_alive()
    assert not any(t.name == "test-poller" for t in threading.enumerate())
