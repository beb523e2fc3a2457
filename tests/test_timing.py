"""The one interleaved order (search/timing.py) that the evaluator, the bench, the latency model and the
benchmarks time in."""

from __future__ import annotations

import pytest

from vidtune.search.timing import Interleaved, alternating, interleaved


def test_rounds_alternate_their_order():
    assert list(alternating(["A", "B"], 3)) == [["A", "B"], ["B", "A"], ["A", "B"]]
    assert list(alternating(["A", "B", "C"], 2)) == [["A", "B", "C"], ["C", "B", "A"]]
    assert list(alternating(["A"], 0)) == []


def _recorder():
    log: list[str] = []

    def apply(side):
        if side == "A":
            return None
        log.append(f"+{side}")
        return lambda: log.append(f"-{side}")

    def run(side):
        log.append(side)
        return f"{side}{sum(1 for x in log if x == side)}"

    return log, apply, run


def test_interleaved_keeps_a_side_applied_across_a_round_boundary_and_leaves_out_the_untimed_round():
    log, apply, run = _recorder()
    kept = interleaved(("A", "B"), 3, apply, run, untimed=1)
    # untimed A B | timed B A, A B, B A: B's runs in a row share one application
    assert log == ["A", "+B", "B", "B", "-B", "A", "A", "+B", "B", "B", "-B", "A"]
    assert kept == {"A": ["A2", "A3", "A4"], "B": ["B2", "B3", "B4"]}


def test_an_error_undoes_the_side_applied():
    log, apply, _ = _recorder()
    with pytest.raises(RuntimeError):
        with Interleaved(apply) as sides:
            sides.run("B", lambda: None)
            sides.run("B", lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert log == ["+B", "-B"]
    # release() undoes once; a second release and a baseline run apply nothing
    log.clear()
    sides = Interleaved(apply)
    sides.run("C", lambda: None)
    sides.release()
    sides.release()
    sides.run("A", lambda: None)
    assert log == ["+C", "-C"]
