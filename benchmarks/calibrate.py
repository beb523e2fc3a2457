"""Calibration of the quality metrics: ladders of settings that degrade by construction, and which metrics
follow them.

    vidtune calibrate model=ltx2-mini [--out results/calibration/ltx2-mini]

Each ladder is a technique whose knob makes the output worse step by step: skip more denoising steps,
route attention through fewer key blocks (Sol's beta up), let a cache reuse more (TeaCache's threshold up),
quantise the linears (FP8 off, then all). Every rung is one generation against the stored baseline
of the same request and seed. The control is a harmless change, another exact attention backend (the
neutral setting of ``kernel_choice.sdpa_backend`` on the device), compared with the noise floor (the
baseline's own, ``noise_floor_setting``).

A metric passes its calibration when, on every ladder where it moves (more than its tolerance between the
mildest and the harshest rung), no rung is better than the one before by more than the tolerance and the
harshest is worse than the mildest; when it moves on at least one ladder; and when the control is no worse
than the noise floor by more than the tolerance. A metric that fails is not used in a gate: the tiers in
conf/tiers/calibrated.yaml were written from the committed verdicts (nothing reads them at run time).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vidtune.search.defaults import FLIP_FRAMES

if TYPE_CHECKING:
    from vidtune.techniques.setting import KnobValues

__all__ = ["LADDERS", "METRICS", "check_metric", "run_calibration", "markdown"]

# rungs from mild to harsh; each a setting (values per technique)
LADDERS: dict[str, list[tuple[str, KnobValues]]] = {
    "step_skip": [(f"every {k}", {"caching.step_skip": {"every": k, "stage": "both"}}) for k in (4, 3, 2, 1)],
    "sol_beta": [(f"beta {b}", {"sparse_attention.sol": {"beta": b, "stages": "both"}}) for b in (0.0, 0.5, 1.0, 2.0, 3.0)],
    "teacache": [(f"threshold {t}", {"caching.teacache": {"threshold": t}}) for t in (0.05, 0.1, 0.3, 0.6, 1.2)],
    # (FP8 on or off only: quantising the attention projections alone scored below quantising every linear
    # on ltx2-mini, 42.8 against 45.0 dB, so "more linears" is no degradation by construction)
    "fp8": [("off", {}), ("all", {"kernel_choice.fp8_linear": {"layers": "all"}})],
}

# metric -> (direction: +1 higher is better, -1 lower is better; tolerance in its units)
METRICS: dict[str, tuple[int, float]] = {
    "psnr_db": (1, 0.5), "psnr_db_worst": (1, 0.5), "ssim": (1, 0.005), "ssim_worst": (1, 0.005),
    "temporal_psnr_db": (1, 0.5), "temporal_psnr_db_worst": (1, 0.5), "flip": (-1, 0.005), "flip_worst": (-1, 0.005),
    "audio_snr_db": (1, 0.5), "audio_spectral_db": (-1, 0.01),
    "audio_spectral_snr_db": (1, 0.5), "av_offset_ms": (-1, 1.0),
}


def check_metric(name: str, ladders: dict[str, list[float]], control: float | None, floor: float | None) -> dict[str, Any]:
    """The calibration verdict of one metric from its values along each ladder (mild to harsh), the
    control's value and the noise floor's."""
    from vidtune.search.campaign import Gate

    sign, tol = METRICS[name]
    if name in Gate.ABSOLUTE:  # (its size is the error)
        ladders = {k: [None if x is None else abs(x) for x in v] for k, v in ladders.items()}
        control, floor = (None if x is None else abs(x) for x in (control, floor))
    if all(x is None for v in ladders.values() for x in v) and control is None:
        # (not measured at all: FLIP with eval.flip_frames=0, audio metrics of a model without audio)
        return {"ladders": {k: "unmeasured" for k in ladders}, "control_at_floor": None, "passed": None,
                "reason": "not measured"}
    per = {}
    for ladder, values in ladders.items():
        v = [sign * x for x in values if x is not None]  # (higher is better after the sign)
        if len(v) < 2:
            per[ladder] = "unmeasured"
        elif v[0] - v[-1] <= tol:
            per[ladder] = "flat" if abs(v[0] - v[-1]) <= tol else "inverted"
        elif any(b > a + tol for a, b in zip(v, v[1:])):
            per[ladder] = "not monotone"
        else:
            per[ladder] = "monotone"
    moves = [k for k, s in per.items() if s == "monotone"]
    wrong = [k for k, s in per.items() if s in ("not monotone", "inverted")]
    control_ok = control is None or floor is None or sign * control >= sign * floor - tol
    reasons = []
    if wrong:
        reasons.append("does not follow the degradation on " + ", ".join(f"{k} ({per[k]})" for k in wrong))
    if not moves:
        reasons.append("moves on no ladder")
    if not control_ok:
        reasons.append(f"the harmless control ({control:.4g}) is worse than the noise floor ({floor:.4g}) beyond {tol}")
    return {"ladders": per, "control_at_floor": control_ok, "passed": not reasons, "reason": "; ".join(reasons) or None}


def run_calibration(pipeline: Any, request: Any, source: Any, baseline_dir: Path, flip_frames: int = FLIP_FRAMES,
                    ladders: dict[str, list[tuple[str, dict]]] | None = None, say: Any = print) -> dict[str, Any]:
    """Every rung of ``ladders`` (default ``LADDERS``) and the control, one generation each, against the
    baseline in ``baseline_dir`` (run and stored there if none matches); returns the values and verdicts."""
    from vidtune.search.evaluator import ensure_baseline, evaluate
    from vidtune.techniques import get

    ladders = LADDERS if ladders is None else ladders
    base, _ = ensure_baseline(pipeline, request, source, baseline_dir, repeats=1, warmup=0, mp4=False,
                              flip_frames=flip_frames, say=say)
    floor = (base.meta.get("noise_floor") or {}).get("quality") or {}

    def measure(knobs: dict) -> dict[str, Any]:
        ev = evaluate(pipeline, request, knobs, baseline=base, repeats=1, warmup=0, flip_frames=flip_frames)
        return {"quality": ev.quality.to_dict(), "total_ms": ev.total_ms}

    t0 = time.time()
    total, done = sum(len(steps) for steps in ladders.values()) + 1, 0  # (+ the control)

    def progress(what: str, got: dict[str, Any]) -> None:
        """One line per measured rung: which of how many, its headline metrics, elapsed and the rest's ETA
        (the rungs' mean time so far, every rung being one generation and its metrics)."""
        nonlocal done
        done += 1
        q, elapsed = got["quality"], time.time() - t0
        flip = "-" if q.get("flip") is None else f"{q['flip']:.4f}"
        say(f"calibrate: {done}/{total} {what}: PSNR {q['psnr_db']:.2f} dB, FLIP {flip}, audio spectral SNR "
            f"{q.get('audio_spectral_snr_db', float('nan')):.1f} dB | elapsed {elapsed:.0f} s, "
            f"ETA {elapsed / done * (total - done):.0f} s")

    rungs: dict[str, list[dict[str, Any]]] = {}
    for ladder, steps in ladders.items():
        rungs[ladder] = []
        for label, knobs in steps:
            got = measure(knobs)
            rungs[ladder].append({"rung": label, "knobs": knobs, **got})
            progress(f"{ladder} {label}", got)
    neutral = get("kernel_choice.sdpa_backend").neutral(request, pipeline.device) or {
        "video_self": "flash", "audio_self": "flash"}
    control = {"knobs": {"kernel_choice.sdpa_backend": neutral}, **measure({"kernel_choice.sdpa_backend": neutral})}
    progress("control", control)
    verdicts = {m: check_metric(m, {k: [r["quality"].get(m) for r in v] for k, v in rungs.items()},
                                control["quality"].get(m), floor.get(m)) for m in METRICS}
    return {"model": source.identity(), "request": request.to_dict(), "device": str(pipeline.device),
            "noise_floor": base.meta.get("noise_floor"), "control": control, "ladders": rungs,
            "metrics": verdicts, "seconds": round(time.time() - t0, 1),
            "rule": ("passed: monotone (within the tolerance) on every ladder where it moves, moving on at least one, "
                     "and the control no worse than the noise floor beyond the tolerance"),
            "tolerances": {m: t for m, (_, t) in METRICS.items()}}


def markdown(result: dict[str, Any]) -> str:
    """The calibration as a table: one row per rung, one column per metric, then the verdicts."""
    cols = list(METRICS)

    def fmt(x: Any) -> str:
        return "-" if x is None else f"{x:.4f}" if abs(x) < 10 else f"{x:.2f}"

    lines = [f"Model {result['model'].get('preset') or result['model']}, request "
             f"{result['request']['height']}x{result['request']['width']}x{result['request']['frames']} seed "
             f"{result['request']['seed']}, on {result['device']}; one generation per rung against the stored baseline.",
             "", "| ladder | rung | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    floor = (result.get("noise_floor") or {}).get("quality") or {}
    lines.append("| noise floor | " + json.dumps((result.get("noise_floor") or {}).get("setting")).replace("|", "/")
                 + " | " + " | ".join(fmt(floor.get(c)) for c in cols) + " |")
    lines.append("| control | " + json.dumps(result["control"]["knobs"]).replace("|", "/") + " | "
                 + " | ".join(fmt(result["control"]["quality"].get(c)) for c in cols) + " |")
    for ladder, rungs in result["ladders"].items():
        for r in rungs:
            lines.append(f"| {ladder} | {r['rung']} | " + " | ".join(fmt(r["quality"].get(c)) for c in cols) + " |")
    lines += ["", "| metric | passed | per ladder | reason |", "|---|---|---|---|"]
    for m, v in result["metrics"].items():
        per = ", ".join(f"{k}: {s}" for k, s in v["ladders"].items())
        passed = "-" if v["passed"] is None else "yes" if v["passed"] else "no"
        lines.append(f"| {m} | {passed} | {per} | {v['reason'] or ''} |")
    return "\n".join(lines) + "\n"


def write(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.json").write_text(json.dumps(result, indent=2, default=str))
    (out / "calibration.md").write_text(markdown(result))
