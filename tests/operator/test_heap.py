"""What the operator keeps out of the garbage collector's walks, and what it gives back."""

from __future__ import annotations

import gc
import logging
import weakref
from collections.abc import Iterator

import pytest
from agentrun_operator import heap


class Circle:
    """An object in a circle with itself: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_what_lived_through_a_period_leaves_the_collectors_sight() -> None:
    kept = [Circle() for _ in range(100)]
    heap.Settler().settle()
    assert gc.get_freeze_count() >= len(kept)
    assert not any(obj is kept[0] for obj in gc.get_objects())  # frozen: not walked


def test_young_garbage_is_collected_before_it_could_be_frozen() -> None:
    gone = Circle()
    ref = weakref.ref(gone)
    del gone
    heap.Settler().settle()
    assert ref() is None


def test_a_frozen_circle_that_became_garbage_is_freed_by_the_hourly_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    settler = heap.Settler()
    holder = [Circle()]
    ref = weakref.ref(holder[0])
    settler.settle()  # frozen while alive
    holder.clear()
    gc.collect()
    assert ref() is not None  # frozen: the collector does not see it
    settler.settle()  # not an hour yet: still kept
    assert ref() is not None
    # An hour and a second later: (t + 3600) - t is below 3600 for about one t in 25 in
    # floating point, so the hour exactly would be a flaky "not yet".
    monkeypatch.setattr(heap.time, "monotonic",
                        lambda: settler._whole_at + heap.WHOLE_EVERY + 1.0)
    settler.settle()
    assert ref() is None


def test_a_full_collection_is_logged_with_how_long_it_took(
        caplog: pytest.LogCaptureFixture) -> None:
    callback = heap.watch()
    try:
        with caplog.at_level(logging.INFO, logger="agentrun.operator"):
            gc.collect(0)
            gc.collect(2)
    finally:
        gc.callbacks.remove(callback)
    lines = [r.getMessage() for r in caplog.records if "event=gc" in r.getMessage()]
    assert any("generation=2 seconds=" in line for line in lines), lines
