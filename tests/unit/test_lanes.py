"""The lock `make test`'s two lanes share (tests/conftest.py): tests hold it together, a test that
needs the machine alone waits for the other lane's test to end and holds off its next one."""

from __future__ import annotations

import threading
import time

from tests.conftest import Lanes


def _hold(lanes: Lanes, alone: bool, events: list[str], name: str, release: threading.Event) -> threading.Thread:
    def body():
        with lanes.held(alone=alone):
            events.append(f"{name} in")
            release.wait(10)
            events.append(f"{name} out")  # before the lock is let go: the next holder's "in" comes after

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def _settle() -> None:
    time.sleep(0.3)  # long enough for a thread that could take the lock to have taken it


def test_shared_holders_overlap_and_one_alone_waits_for_them_and_holds_off_later_ones():
    # Each Lanes opens the files itself, as each lane's process does: flock sees separate holders.
    run = f"test-{time.monotonic_ns()}"
    lanes = [Lanes(run) for _ in range(4)]
    events: list[str] = []
    ends = {name: threading.Event() for name in ("first", "second", "alone", "later")}
    try:
        threads = [_hold(lanes[0], False, events, "first", ends["first"]),
                   _hold(lanes[1], False, events, "second", ends["second"])]
        _settle()
        assert sorted(events) == ["first in", "second in"]  # shared: both at once

        threads.append(_hold(lanes[2], True, events, "alone", ends["alone"]))
        _settle()
        threads.append(_hold(lanes[3], False, events, "later", ends["later"]))
        _settle()
        assert "alone in" not in events and "later in" not in events  # alone waits; later waits behind it

        ends["first"].set()
        ends["second"].set()
        _settle()
        assert events[-1] == "alone in" and "later in" not in events

        ends["alone"].set()
        _settle()
        assert events[-2:] == ["alone out", "later in"]
        ends["later"].set()
        for t in threads:
            t.join(5)
        assert events[-1] == "later out"
    finally:
        for ev in ends.values():
            ev.set()
        for lane in lanes:
            lane.close()
