"""The quality metrics' calibration (benchmarks/calibrate.py): the verdict rule, and a small ladder run end to end."""

from __future__ import annotations

import json

from vidtune.benchmarks.calibrate import check_metric


def test_verdicts_follow_the_rule():
    # higher is better (PSNR): monotone down passes; a rung better than the one before beyond 0.5 dB fails
    assert check_metric("psnr_db", {"a": [40, 35, 30]}, 60.0, 60.0)["passed"]
    bad = check_metric("psnr_db", {"a": [40, 35, 38], "b": [40, 30]}, None, None)
    assert not bad["passed"] and bad["ladders"] == {"a": "not monotone", "b": "monotone"}
    # a metric flat on one ladder and monotone on another passes; flat everywhere does not
    assert check_metric("psnr_db", {"a": [40, 40.2], "b": [40, 30]}, None, None)["passed"]
    assert "moves on no ladder" in check_metric("psnr_db", {"a": [40, 40.2]}, None, None)["reason"]
    # lower is better (FLIP): rising passes, falling is inverted
    assert check_metric("flip", {"a": [0.01, 0.05, 0.2]}, 0.0, 0.0)["passed"]
    assert check_metric("flip", {"a": [0.2, 0.01]}, None, None)["ladders"]["a"] == "inverted"
    # a signed offset is judged by its size: growing either way is monotone, 0 throughout moves on no ladder
    assert check_metric("av_offset_ms", {"a": [0.0, -20.0, -41.7]}, 0.0, 0.0)["passed"]
    assert "moves on no ladder" in check_metric("av_offset_ms", {"a": [0.0, 0.0, 0.0]}, 0.0, 0.0)["reason"]
    # the control must sit at the noise floor
    far = check_metric("psnr_db", {"a": [40, 30]}, 45.0, 60.0)
    assert not far["passed"] and not far["control_at_floor"]


def test_cli_calibrate_runs_a_ladder_on_tiny(tmp_path, monkeypatch, capsys):
    """``vidtune calibrate``: every rung measured against the stored baseline, the control beside the noise
    floor, a verdict per metric, JSON and Markdown written."""
    import vidtune.benchmarks.calibrate as calibrate
    from vidtune.cli import main

    monkeypatch.setattr(calibrate, "LADDERS", {
        "step_skip": [(f"every {k}", {"caching.step_skip": {"every": k, "stage": "both"}}) for k in (3, 1)]})
    out = tmp_path / "cal"
    assert main(["calibrate", "model=tiny", f"results_dir={tmp_path}", "name=c", "eval.flip_frames=2",
                 "--out", str(out)]) == 0
    result = json.loads((out / "calibration.json").read_text())
    assert [r["rung"] for r in result["ladders"]["step_skip"]] == ["every 3", "every 1"]
    harsh, mild = result["ladders"]["step_skip"][1]["quality"], result["ladders"]["step_skip"][0]["quality"]
    assert harsh["psnr_db"] < mild["psnr_db"] and len(mild["flip_frames"]) == 2
    assert set(result["metrics"]) >= {"psnr_db", "flip", "temporal_psnr_db", "audio_spectral_db"}
    assert result["control"]["quality"]["psnr_db"] > mild["psnr_db"]
    assert (tmp_path / "c" / "baseline" / "meta.json").is_file()
    printed = capsys.readouterr()
    assert "| step_skip | every 1 |" in (out / "calibration.md").read_text() and "| metric | passed |" in printed.out
    # progress: one line per rung and the control, counted, with the elapsed time and an ETA
    lines = [line for line in (printed.out + printed.err).splitlines() if line.startswith("calibrate: ")]
    assert [line.split(":")[1].split()[0] for line in lines] == ["1/3", "2/3", "3/3"], lines
    assert "step_skip every 1" in lines[1] and "control" in lines[2] and lines[-1].endswith("ETA 0 s")


def test_a_metric_left_out_is_not_measured_rather_than_failed():
    """eval.flip_frames=0 leaves FLIP out: ``vidtune calibrate`` reports it as not measured (it used to turn
    the 0 into 4 frames), and the Markdown shows '-' for its verdict."""
    from vidtune.benchmarks.calibrate import markdown

    left_out = check_metric("flip", {"a": [None, None], "b": [None]}, None, None)
    assert left_out["passed"] is None and left_out["reason"] == "not measured"
    # (one value measured is still judged: unmeasured on that ladder, so it moves on none)
    assert check_metric("flip", {"a": [None, 0.1]}, None, None)["passed"] is False
    q = {"psnr_db": 40.0}
    result = {"model": {"preset": "tiny"}, "request": {"height": 64, "width": 64, "frames": 9, "seed": 0},
              "device": "cpu", "noise_floor": None, "control": {"knobs": {}, "quality": q},
              "ladders": {"a": [{"rung": "r", "quality": q}]},
              "metrics": {"flip": left_out, "psnr_db": check_metric("psnr_db", {"a": [40, 30]}, None, None)}}
    md = markdown(result)
    assert "| flip | - | a: unmeasured, b: unmeasured | not measured |" in md and "| psnr_db | yes |" in md
