"""A long warm-up says what it is doing while it runs (search/progress.py Heartbeat), in the bench's output."""

from __future__ import annotations

import io
import os
import time

import pytest

from vidtune.search.progress import Heartbeat


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_heartbeat_line_says_the_stage_its_time_and_what_the_rest_is():
    clock = _Clock()
    beat = Heartbeat(lambda line: None, "bench: warming up", 30.0, {"stage2": 6_700.0}, compiling=True, clock=clock)
    clock.now += 5
    assert beat.line() == "bench: warming up: 5 s so far"
    beat.stage("stage2")
    clock.now += 3
    assert beat.line() == "bench: warming up: 8 s so far; stage2 running for 3 s (~6.7 s once warm)"
    clock.now += 37
    assert beat.line() == ("bench: warming up: 45 s so far; stage2 running for 40 s (~6.7 s once warm; the rest is "
                           "the first run's compile)")
    beat.what("bench: warming up fast")
    beat.stage("decode_video")  # (no floor known for it)
    clock.now += 2
    assert beat.line() == "bench: warming up fast: 47 s so far; decode_video running for 2 s"
    uncompiled = Heartbeat(lambda line: None, "w", 30.0, {"stage1": 1_000.0}, compiling=False, clock=clock)
    uncompiled.stage("stage1")
    clock.now += 4
    assert uncompiled.line().endswith("(~1.0 s once warm; the rest is the first run's setup: autotune, allocator)")
    with pytest.raises(ValueError, match="every_s"):
        Heartbeat(print, "w", 0)


def test_a_heartbeat_speaks_while_its_step_runs_and_stops_after():
    lines: list[str] = []
    with Heartbeat(lines.append, "step", every_s=0.01) as beat:
        beat.stage("stage1")
        deadline = time.time() + 5
        while len(lines) < 2 and time.time() < deadline:
            time.sleep(0.01)
    assert len(lines) >= 2 and all(line.startswith("step: ") for line in lines)
    assert "stage1 running for" in lines[-1]
    said = len(lines)
    time.sleep(0.05)
    assert len(lines) == said  # (nothing after the step)
    quiet: list[str] = []
    with Heartbeat(quiet.append, "short", every_s=30.0):
        pass
    assert quiet == []  # (a step shorter than the interval says nothing)


def test_the_bench_warm_up_says_which_stage_runs(tmp_path, capsys, monkeypatch):
    """vidtune bench: while the setting warms up, lines name the setting and the stage running (each stage in
    order, the tiny model's first run); before, the warm-up printed nothing until it ended."""
    from vidtune.cli import main
    from vidtune.search import progress

    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.01)
    assert main(["bench", "model=tiny", "request.height=128", "request.width=192", "request.frames=9",
                 f"results_dir={tmp_path}", "eval.warmup=1", "--reference", "run", "--no-rewarm", "--repeats", "1",
                 "--knobs", "caching.step_skip.every=2", "caching.step_skip.first_kept=1"]) == 0
    err = capsys.readouterr().err
    beats = [line for line in err.splitlines() if line.startswith("bench: warming up the setting: ")]
    assert beats, err
    seen = [s for s in ("stage1", "upsample", "stage2", "decode_video", "decode_audio")
            if any(f"; {s} running for" in line for line in beats)]
    assert "stage1" in seen and "stage2" in seen
    # in order: stage 1's first line before stage 2's (a stage shorter than the 0.01 s interval, the upsample, may
    # be seen first in a later run of the warm-up: the order of every stage was flaky, 2 runs in 9)
    first = {s: next(i for i, line in enumerate(beats) if f"; {s} running for" in line) for s in seen}
    assert first["stage1"] < first["stage2"]
    assert err.index("bench: warming up the setting") < err.index("warmed up in")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_campaign_status_is_a_bar_on_a_terminal_and_plain_lines_in_a_log(monkeypatch):
    from vidtune.search.progress import TerminalLog

    monkeypatch.setattr("shutil.get_terminal_size", lambda fallback=None: os.terminal_size((40, 24)))
    screen = _Terminal()
    out = TerminalLog(screen)
    out("baseline: computed")
    out.status("caching 1/6 (no feasible yet) | ETA 90 s", 0.25)
    out("[caching] trial 0 not timed")
    out.status("caching 2/6 | ETA 60 s", 0.5)
    out.close()
    text = screen.getvalue()
    # the status redrawn in place at the bottom (cut to the width), the other lines printed above it
    assert text == ("\r\x1b[Kbaseline: computed\n"
                    "\r\x1b[K[#####---------------]  25% caching 1/6\r\x1b[K[caching] trial 0 not timed\n"
                    "[#####---------------]  25% caching 1/6\r\x1b[K[##########----------]  50% caching 2/6\n")
    log = io.StringIO()  # not a terminal: every status is a line of its own, no control characters
    plain = TerminalLog(log)
    plain.status("caching 1/6 | ETA 90 s", 0.25)
    plain("done")
    plain.close()
    assert log.getvalue() == "caching 1/6 | ETA 90 s\ndone\n"
