"""The set-up a check's in-process DCP ranks share: made by the first rank in, undone by the last out."""

from __future__ import annotations

import contextlib
import threading

import pytest

from pytest_mla.engines.common.shared_scope import SharedScope


def test_the_first_rank_makes_it_the_last_undoes_it_and_all_see_one_value():
    events = []

    @contextlib.contextmanager
    def make():
        events.append("made")
        yield object()
        events.append("undone")

    shared = SharedScope("test")
    seen = []
    inside = threading.Barrier(3)

    def rank():
        with shared.enter("k", make) as value:
            seen.append(value)
            inside.wait(timeout=10)  # all three inside at once

    threads = [threading.Thread(target=rank) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert events == ["made", "undone"] and len(seen) == 3 and len({id(v) for v in seen}) == 1
    with shared.enter("other", make):  # once left, a new set-up for another key
        pass
    assert events == ["made", "undone", "made", "undone"]


def test_another_key_while_entered_is_refused_and_a_failed_set_up_leaves_nothing_entered():
    shared = SharedScope("test")
    with shared.enter("a", contextlib.nullcontext):
        with pytest.raises(RuntimeError, match="test: concurrent checks want 'b' and 'a'"):
            with shared.enter("b", contextlib.nullcontext):
                pass

    @contextlib.contextmanager
    def broken():
        raise ValueError("set-up failed")
        yield

    with pytest.raises(ValueError, match="set-up failed"):
        with shared.enter("a", broken):
            pass
    assert shared.count == 0
    with shared.enter("c", contextlib.nullcontext):  # usable again
        assert shared.count == 1
