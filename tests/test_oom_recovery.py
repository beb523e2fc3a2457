"""benchmarks/oom_recovery.py's own check on a CPU: the campaign's worker after an out-of-memory run that leaves
memory held (injected, as a CUDA graph's pool outliving its failed capture did on an H100) says so, and its next
setting still runs."""

from __future__ import annotations

import json

import pytest


def test_the_probe_records_the_failure_what_stayed_held_and_the_next_setting(tmp_path, monkeypatch):
    from vidtune.benchmarks.oom_recovery import main
    from vidtune.search.gpu_memory import HELD_BY_FAULT

    monkeypatch.setenv("VIDTUNE_FAULT_INJECT", f"oom-stuck-once:{tmp_path / 'marker'}")
    out = tmp_path / "oom.json"
    try:
        assert main(["--preset", "tiny", "--size", "128x192x9", "--device", "cpu", "--settings", "step_skip",
                     "vae_tiles_768", "--baseline-dir", str(tmp_path / "baseline"), "--out", str(out)]) == 0
    finally:
        HELD_BY_FAULT.clear()
    result = json.loads(out.read_text())
    first, second = result["settings"]
    assert (first["status"], first["reason"]) == ("fail", "oom") and "injected" in first["message"]
    assert first["memory"] == {"cap_gib": None, "held_before_gib": 0.0}
    assert "GiB stayed held after the failure" in first["replace_worker"]
    assert first["allocated_after_gib"] == pytest.approx(2.0)  # (the injected fault's tensors, counted as held)
    assert second["status"] == "ok" and second["total_ms"] > 0 and second["replace_worker"] is None
    with pytest.raises(SystemExit, match="unknown"):
        main(["--settings", "nope", "--out", str(out)])
    with pytest.raises(SystemExit, match="--size must be HEIGHTxWIDTHxFRAMES"):
        main(["--size", "1024x1536", "--settings", "step_skip", "--out", str(out)])
