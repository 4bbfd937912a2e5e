"""A matrix session keeps the cyclic garbage collector off its collected objects, and gives them back."""

from __future__ import annotations

import gc

from .helpers import matrix

pytest_plugins = ["pytester"]

PROBE = '''
import gc

def pytest_runtestloop(session):
    session.config._mla_probe = (gc.isenabled(), gc.get_freeze_count())

def pytest_sessionfinish(session):
    print("during the run: enabled=%s frozen=%s" % session.config._mla_probe)
'''


def test_the_collected_session_is_frozen_during_the_run_and_given_back_after(liar):
    liar.makeconftest(liar.path.joinpath("conftest.py").read_text() + PROBE)
    liar.makefile(".toml", m=matrix(["a", "b"]))
    assert gc.isenabled() and gc.get_freeze_count() == 0
    result = liar.runpytest("--mla-matrix=m.toml", "-s")
    result.assert_outcomes(passed=4)
    line = "during the run:" + result.stdout.str().split("during the run:", 1)[1].split("\n", 1)[0]
    assert line.startswith("during the run: enabled=True frozen=") and int(line.rsplit("=", 1)[1]) > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0  # this process goes on: nothing kept frozen


def test_a_collector_someone_else_froze_or_disabled_is_left_as_it_was(liar):
    liar.makeconftest(liar.path.joinpath("conftest.py").read_text() + PROBE)
    liar.makefile(".toml", m=matrix(["a", "b"]))
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        result = liar.runpytest("--mla-matrix=m.toml", "-s")
        result.assert_outcomes(passed=4)
        during = int(result.stdout.str().split("during the run: enabled=True frozen=", 1)[1].split("\n", 1)[0])
        assert during <= before  # not one more frozen (frozen objects that died left the count)
        assert 0 < gc.get_freeze_count() <= before  # theirs, still frozen
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        liar.runpytest("--mla-matrix=m.toml", "-s").assert_outcomes(passed=4)
        assert not gc.isenabled()  # the session paused it only where it had been running
    finally:
        gc.enable()
