"""The event clock both discrete-event models run on (astraflow/sim/events.py): time order,
first in first out at equal times, one settle per instant, and how a run ends."""

from __future__ import annotations

from astraflow.sim.events import Events


def test_events_fire_in_time_order_and_in_scheduling_order_at_equal_times() -> None:
    clock, fired = Events(), []

    def note(name: str) -> None:
        fired.append((clock.now, name))

    clock.at(2.0, note, "c")
    clock.at(1.0, note, "a")
    clock.at(2.0, note, "d")
    clock.after(1.0, note, "b")  # from now (0.0): the same time as "a", scheduled after it
    assert len(clock) == 4
    assert clock.run(stop=lambda: False) is False  # ran out of events
    assert fired == [(1.0, "a"), (1.0, "b"), (2.0, "c"), (2.0, "d")]
    assert clock.now == 2.0 and len(clock) == 0


def test_settle_runs_once_per_instant_after_the_events_scheduled_for_it() -> None:
    clock, log = Events(), []

    def first() -> None:
        log.append("first")
        clock.after(0.0, lambda: log.append("same instant"))  # joins the instant firing now
        clock.after(1.0, lambda: log.append("later"))

    clock.at(1.0, first)
    clock.at(1.0, lambda: log.append("second"))
    clock.run(stop=lambda: False, settle=lambda: log.append(f"settle@{clock.now}"))
    assert log == ["first", "second", "same instant", "settle@1.0", "later", "settle@2.0"]


def test_stop_ends_the_run_right_after_the_event_that_satisfied_it() -> None:
    clock, seen = Events(), []
    for t in (1.0, 2.0, 3.0):
        clock.at(t, seen.append, t)
    assert clock.run(stop=lambda: 2.0 in seen) is True
    assert seen == [1.0, 2.0] and clock.now == 2.0 and len(clock) == 1
    # the rest is still there: a second run picks it up
    assert clock.run(stop=lambda: False) is False and seen == [1.0, 2.0, 3.0]
