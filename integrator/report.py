"""The campaign report: one self-contained HTML file for a person to review and sign off.

Contents: the latency/PSNR scatter and Pareto front per family and for the integrator with the gate
drawn, a table of every trial (failures with their reason), per-frame PSNR of the tuned video, baseline
and tuned frames side by side with a difference heat map, the audio waveforms, the measured speed-up and
the sign-off. plotly.js is embedded (no network needed to open the file); images are inline PNGs.
"""

from __future__ import annotations

import base64
import html
import io
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from vidtune._io import atomic_write_text, load_user_yaml
from vidtune.search.records import RecordLog, Status

__all__ = ["build_report"]


def _png(array: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


DISPLAY_WIDTH = 960  # frames wider than this are shown downscaled (a 4K PNG is ~25 MB), plus a full-size crop
CROP = 256


def _blocks(frame: np.ndarray, factor: int) -> np.ndarray:
    """``frame`` [H, W, C] as [H/f, f, W/f, f, C] blocks (a remainder under one block is dropped)."""
    h, w = (frame.shape[0] // factor) * factor, (frame.shape[1] // factor) * factor
    return frame[:h, :w].reshape(h // factor, factor, w // factor, factor, -1)


def _shrink(frame: np.ndarray, factor: int) -> np.ndarray:
    """Downscale by an integer ``factor``: box average for pictures."""
    return _blocks(frame, factor).astype(np.float32).mean(axis=(1, 3)).round().astype(np.uint8)


def _shrink_max(diff: np.ndarray, factor: int) -> np.ndarray:
    """Downscale a difference map keeping each block's largest difference (a one-pixel error stays seen)."""
    return _blocks(diff, factor).max(axis=(1, 3))


def frame_views(b: np.ndarray, t: np.ndarray) -> dict[str, Any]:
    """What the report shows of one frame pair: baseline, tuned and difference at display size (shrunk by
    an integer factor when wider than ``DISPLAY_WIDTH``), and, when shrunk, full-resolution crops of
    ``CROP`` pixels around the largest difference (the frame centre when they are equal)."""
    diff = np.abs(b.astype(np.int16) - t.astype(np.int16)).astype(np.uint8)
    factor = max(1, -(-b.shape[1] // DISPLAY_WIDTH))
    views: dict[str, Any] = {"factor": factor}
    if factor == 1:
        views.update(baseline=b, tuned=t, diff=diff)
        return views
    views.update(baseline=_shrink(b, factor), tuned=_shrink(t, factor), diff=_shrink_max(diff, factor))
    score = diff.max(axis=-1)
    y, x = np.unravel_index(int(score.argmax()), score.shape) if score.any() else (b.shape[0] // 2, b.shape[1] // 2)
    y0 = int(min(max(0, y - CROP // 2), max(0, b.shape[0] - CROP)))
    x0 = int(min(max(0, x - CROP // 2), max(0, b.shape[1] - CROP)))
    window = (slice(y0, y0 + CROP), slice(x0, x0 + CROP))
    views["crop"] = {"y": y0, "x": x0, "baseline": b[window], "tuned": t[window], "diff": diff[window]}
    return views


def _heat(diff: np.ndarray) -> np.ndarray:
    """|baseline - tuned| per pixel (max over RGB), scaled so 64 levels saturate, as a colour map."""
    d = np.clip(diff.max(axis=-1).astype(np.float32) / 64.0, 0, 1)
    return (np.stack([d, d**0.5 * 0.6, 1 - d], axis=-1) * 255).astype(np.uint8)


def _rejection(rejected: dict[str, Any]) -> str:
    """Why the candidate was not exported (configs written before the significance test lack ``reason``)."""
    return rejected.get("reason") or (
        f"slower than the baseline when re-measured interleaved (x{rejected['speedup']:.3f})")


def _paired_text(paired: dict[str, Any] | None) -> str:
    if paired and paired.get("pruned") and paired.get("ratio") is not None:  # (one pair or none: no interval)
        return (f"{paired['ratio']:.3f} ({'estimated' if paired.get('repeats') == 0 else 'one pair'}): pruned, "
                f"{paired['pruned']}")
    if not paired or paired.get("ratio") is None or None in (paired.get("interval") or [None]):
        return ""  # (an unmeasured ratio: null in standard JSON)
    lo, hi = paired["interval"]
    verdict = "faster" if paired.get("faster") else "slower" if paired.get("slower") else "within the noise"
    est = f"; estimated {paired['estimate']['ratio']:.3f}" if paired.get("estimate") else ""
    return f"{paired['ratio']:.3f} ({lo:.3f}-{hi:.3f}, {paired['repeats']}{est}): {verdict}"


def _estimates_text(records: list[dict[str, Any]]) -> str:
    from vidtune.search.latency_model import estimate_errors

    e = estimate_errors(records)
    return "" if e is None else (
        f"<p id='estimates'>Latency model (eval.estimate): {e['estimated']} trial(s) estimated, {e['stopped']} stopped by "
        f"their estimate" + (f", {e['trusted']} recorded at it" if e.get("trusted") else "")
        + (f"; against the {e['measured']} measured in full (2 pairs or more), median error "
           f"{100 * e['median']:.1f}%, worst {100 * e['worst']:.1f}%" if e["measured"] else "") + ".</p>")


def _quality_from_text(q: dict[str, Any] | None) -> str:
    if not q:
        return ""
    if "request" in q:
        r = q["request"]
        mapping = "; ".join(q.get("mapping") or []) or "no knob needed mapping"
        return (f"<p id='quality-from'><b>Quality numbers come from {html.escape(json.dumps(q['model']))}</b> at "
                f"{r['height']}x{r['width']}x{r['frames']} (seed {r['seed']}), the setting mapped to it "
                f"({html.escape(mapping)}); latency is the tuned model's own. The tuned model's own quality "
                f"numbers: {html.escape(json.dumps(q.get('latency_model_quality')))}.</p>")
    warn = " <b>Random weights: these quality numbers are not a quality figure.</b>" if q.get("random_weights") else ""
    return f"<p id='quality-from'>Quality numbers come from the tuned model itself.{warn}</p>"


def _overhead_text(o: dict[str, Any] | None) -> str:
    if not o:
        return ""
    return (f"<p id='overhead'>Per-trial framework overhead over {o['evaluations']} evaluations: median "
            f"{100 * o['framework_fraction_median']:.1f}%, worst {100 * o['framework_fraction_max']:.1f}% of each "
            f"evaluation's wall time outside its generations (applying the setting, metrics "
            f"{o['quality_s_median']:.2f} s median); the warm-up generations took "
            f"{100 * o['warmup_fraction_median']:.1f}% (median).</p>")


def _pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    front = [p for p in points if not any(q[0] <= p[0] and q[1] >= p[1] and q != p for q in points)]
    return sorted(front)


def _scatter(title: str, records: list[dict[str, Any]], gate_psnr: float, baseline_ms: float | None) -> Any:
    import plotly.graph_objects as go

    ok = [r for r in records if r.get("status") == Status.OK and r.get("quality")]
    pts = [(r["total_ms"], r["quality"]["psnr_db"]) for r in ok]
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[p[0] for p in pts], y=[p[1] for p in pts], mode="markers", name="trials",
        text=[json.dumps(r.get("knobs"), default=str)[:300] for r in ok], hovertemplate="%{x:.1f} ms, %{y:.2f} dB<br>%{text}",
    ))
    feasible = [p for p, r in zip(pts, ok) if p[1] >= gate_psnr]
    front = _pareto(feasible)
    if front:
        fig.add_trace(go.Scatter(x=[p[0] for p in front], y=[p[1] for p in front], mode="lines+markers",
                                 name="feasible Pareto front"))
    fig.add_hline(y=gate_psnr, line_dash="dash", annotation_text=f"gate {gate_psnr} dB")
    if baseline_ms:
        fig.add_vline(x=baseline_ms, line_dash="dot", annotation_text="baseline latency")
    fig.update_layout(title=title, xaxis_title="latency (ms, total of stage medians)", yaxis_title="PSNR (dB)",
                      height=380, margin=dict(l=40, r=20, t=50, b=40))
    return fig


REPORT_VIDEO_BYTES = 24 << 20  # the two MP4s are embedded up to this size together; above, linked beside the report


def _players(d: Path, tuned_dir: Path) -> str:
    """Baseline and tuned videos side by side, kept in step (play, pause, seek and rate follow whichever
    the viewer moves). Embedded as data URIs while both MP4s together stay under ``REPORT_VIDEO_BYTES``, so
    the report stays one self-contained file; linked by relative path above that (the report states it)."""
    files = [d / "baseline" / "video.mp4", tuned_dir / "video.mp4"]
    if not all(f.is_file() for f in files):
        return ""
    total = sum(f.stat().st_size for f in files)
    embed = total <= REPORT_VIDEO_BYTES
    srcs = ["data:video/mp4;base64," + base64.b64encode(f.read_bytes()).decode() if embed
            else html.escape(str(f.relative_to(d))) for f in files]
    how = (f"embedded ({total / 1e6:.1f} MB)" if embed else
           f"linked, not embedded: {total / 1e6:.0f} MB is over the report's {REPORT_VIDEO_BYTES >> 20} MiB limit")
    return (f"<h2>Videos: baseline and tuned, in step ({how})</h2><div id='players'>"
            + "".join(f"<figure style='display:inline-block;margin:4px'><video class='vt-sync' controls muted "
                      f"preload='auto' src='{src}' style='max-width:600px'></video><figcaption>{name}</figcaption></figure>"
                      for src, name in zip(srcs, ("baseline", "tuned")))
            + "</div><script>(function(){var v=document.querySelectorAll('video.vt-sync'),busy=false;"
            "function follow(src){if(busy)return;busy=true;v.forEach(function(o){if(o===src)return;"
            "if(Math.abs(o.currentTime-src.currentTime)>0.05)o.currentTime=src.currentTime;o.playbackRate=src.playbackRate;"
            "if(src.paused&&!o.paused)o.pause();if(!src.paused&&o.paused)o.play();});busy=false;}"
            "v.forEach(function(x){['play','pause','seeked','ratechange'].forEach(function(e){"
            "x.addEventListener(e,function(){follow(x);});});});})();</script>")


def _stage_bars(final: dict[str, Any] | None) -> Any:
    """Per-stage latency of the final bench, baseline against tuned, medians with the repeats' range."""
    import plotly.graph_objects as go

    stages = (final or {}).get("stages") or {}
    if not stages:
        return None
    names = list(stages)
    fig = go.Figure()
    for which, label in (("baseline", "baseline"), ("tuned", "tuned")):
        med = [stages[s][f"{which}_ms"] for s in names]
        rng = [stages[s].get(f"{which}_range_ms") or [m, m] for s, m in zip(names, med)]
        fig.add_trace(go.Bar(x=names, y=med, name=label, error_y=dict(
            type="data", symmetric=False, array=[r[1] - m for r, m in zip(rng, med)],
            arrayminus=[m - r[0] for r, m in zip(rng, med)])))
    fig.update_layout(title="final bench: latency per stage (median, bars: the repeats' range)", barmode="group",
                      yaxis_title="ms", height=320)
    return fig


def _failures(records: list[dict[str, Any]]) -> str:
    failed = [r for r in records if r.get("status") not in (Status.OK, None)]
    if not failed:
        return "<p id='failed'>No trial or combination failed.</p>"
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
        r["family"], r.get("trial", ""), r.get("reason") or "", (r.get("message") or "")[:300],
        json.dumps(r.get("knobs"), default=str))) + "</tr>" for r in failed)
    return (f"<h2>Failed trials and combinations ({len(failed)})</h2><table id='failed'><tr><th>family</th><th>trial</th>"
            f"<th>reason</th><th>message</th><th>knobs</th></tr>{rows}</table>")


def _num(x: Any, digits: int) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def _tiers_table(tiers: dict[str, Any] | None) -> str:
    """The quality tiers' ladder: per tier its gate, the exported setting, its speed-up and metrics."""
    if not tiers:
        return ""
    rows = []
    for name, t in tiers.items():
        f, q = t["final"], t["final"]["quality"]
        gate = {k: v for k, v in t["gate"].items() if v is not None}
        cells = [name, json.dumps(gate), json.dumps(t["chosen"] or "baseline (no techniques)", default=str),
                 f"x{f['speedup']:.3f}", _num(f.get("p_value"), 3), _num(q.get("psnr_db_worst"), 2),
                 _num(q.get("temporal_psnr_db_worst"), 2), _num(q.get("flip_worst"), 4),
                 _num(q.get("audio_spectral_snr_db"), 2), _num(q.get("av_offset_ms"), 1), Path(t["tuned_config"]).name]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return ("<h2>Quality tiers</h2><table id='tiers'><tr><th>tier</th><th>gate</th><th>exported setting</th>"
            "<th>speed-up</th><th>p</th><th>worst PSNR dB</th><th>worst temporal PSNR dB</th><th>worst FLIP</th>"
            "<th>audio spectral SNR dB</th><th>A/V offset ms</th><th>config</th></tr>" + "".join(rows) + "</table>")


def _in_words(knobs: dict[str, Any] | None) -> str:
    """A setting as a person reads it: "caching.step_skip: every 2, first kept 1; tiling.vae_tiles: ..."."""
    if not knobs:
        return "the baseline (no technique)"
    return "; ".join(f"{t}: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in (values or {}).items())
                     for t, values in knobs.items())


def _pairs_table(table_id: str, values: dict[str, Any] | None) -> str:
    """A mapping as a two-column table (the request, the gate, the noise floor), not as JSON."""
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                   for k, v in (values or {}).items() if v is not None)
    return f"<table id='{table_id}'>{rows}</table>"


def _found(summary: dict[str, Any], tuned_doc: dict[str, Any]) -> str:
    """The first screen: what the campaign found, per tier (or for its one gate): the speed-up with its spread over
    the final bench's repeats and its p-value, the quality and the model it comes from, the setting in words. A
    tier where nothing beat the baseline says so and shows no speed-up."""
    tiers = summary.get("tiers") or {}
    items = list(tiers.items()) or [(tuned_doc.get("tier") or "the gate",
                                     {"chosen": summary.get("chosen"), "final": summary.get("final") or {},
                                      "verdict": summary.get("verdict")})]
    model = (tuned_doc.get("quality_from") or {}).get("model") or tuned_doc.get("model")
    rows = []
    for name, t in items:
        chosen, f = t.get("chosen") or {}, t.get("final") or {}
        verdict = t.get("verdict") or {}
        if not chosen:
            tried = [d for d in verdict.get("did_not_hold") or () if not d.get("skipped")]
            held = (f"{len(tried)} setting(s) passed on the campaign's clip but not on every clip of the verdict "
                    f"(other seeds and prompts)" if tried else
                    "no setting was faster than the baseline beyond the noise inside this gate")
            rows.append(f"<tr><td>{html.escape(name)}</td><td colspan='3'>nothing found: {held}; its config is the "
                        f"baseline (no speed-up)</td></tr>")
            continue
        spread = ""
        if f.get("baseline_total_ms") and f.get("tuned_total_ms"):
            middle = statistics.median(f["baseline_total_ms"])
            ratios = sorted(middle / x for x in f["tuned_total_ms"])
            spread = f" (x{ratios[0]:.2f} to x{ratios[-1]:.2f} over {len(ratios)} repeats"
            spread += f", p = {f['p_value']:.3g})" if f.get("p_value") is not None else ")"
        q = f.get("quality") or {}
        cells = [html.escape(name), f"<b>x{f.get('speedup', float('nan')):.2f}</b>{spread}",
                 f"PSNR {_num(q.get('psnr_db'), 1)} dB (worst frame {_num(q.get('psnr_db_worst'), 1)})" + (
                     f"; worst over {verdict['clips']} clips (seeds, prompts): PSNR {_num(verdict['worst'].get('psnr_db'), 1)}"
                     f" dB (worst frame {_num(verdict['worst'].get('psnr_db_worst'), 1)})" if verdict.get("clips") else ""),
                 html.escape(_in_words(chosen))]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    lead = "" if any(t.get("chosen") for _, t in items) else (
        "<p id='nothing-found'><b>Nothing found</b>: no setting was significantly faster than the baseline within "
        "the gate; the exported config is the baseline itself.</p>")
    return ("<h2>Found</h2>" + lead + f"<p>Quality on {html.escape(json.dumps(model))}.</p><table id='found'><tr>"
            "<th>tier</th><th>speed-up (whole generation)</th><th>quality</th><th>setting</th></tr>" + "".join(rows)
            + "</table>")


def _stage_peaks(peaks: dict[str, float] | None) -> str:
    """A trial's peak memory per stage it ran (bytes -> "stage1 39.46, stage2 42.79, ..." in GiB); a stage-scoped
    trial lists only the stages it re-ran."""
    if not isinstance(peaks, dict):
        return ""
    return ", ".join(f"{stage} {value / 2**30:.2f}" for stage, value in peaks.items() if isinstance(value, (int, float)))


def build_report(campaign_dir: str | Path) -> Path:
    """Write ``<campaign_dir>/report.html`` and return its path."""
    import plotly.graph_objects as go
    import plotly.offline

    from vidtune.model.media import read_raw
    from vidtune.search.metrics import audio_snr_db, psnr_db, temporal_psnr_db

    d = Path(campaign_dir)
    summary = json.loads((d / "campaign.json").read_text())
    tuned_doc = load_user_yaml(d / "tuned.yaml", "tuned config")
    if not isinstance(tuned_doc, dict):
        raise ValueError(f"{d / 'tuned.yaml'}: not a tuned config (a mapping)")
    # (the final bench's records are the driver's, for a resume; the report shows that bench from the summary)
    # (a torn last line of trials.jsonl, a crash's doing, is skipped)
    records = [r for r in RecordLog(d / "trials.jsonl").read() if r.get("phase") not in ("final", "verdict")]
    gate = tuned_doc.get("gate", {})
    gate_psnr = float(gate.get("psnr_db") or 0)  # (a tier's gate may leave PSNR ungated)
    baseline_ms = summary.get("baseline", {}).get("total_ms")
    families = sorted({r["family"] for r in records if r["family"] != "integrator"})

    parts: list[str] = []
    for family in families:
        fig = _scatter(f"family: {family}", [r for r in records if r["family"] == family], gate_psnr, baseline_ms)
        parts.append(fig.to_html(full_html=False, include_plotlyjs=False))
    integ = [r for r in records if r["family"] == "integrator"]
    if integ:
        parts.append(_scatter("integrator: combinations", integ, gate_psnr, baseline_ms)
                     .to_html(full_html=False, include_plotlyjs=False))

    media_html = ""
    tuned_dir = d / (f"tuned-{tuned_doc['tier']}" if tuned_doc.get("tier") else "tuned")
    base_raw, tuned_raw = d / "baseline" / "output.safetensors", tuned_dir / "output.safetensors"
    if base_raw.is_file() and tuned_raw.is_file():
        bf, ba, sr, _ = read_raw(base_raw)
        tf, ta, _, _ = read_raw(tuned_raw)
        per_frame = psnr_db(bf, tf)
        worst = int(np.argmin(per_frame))
        fig = go.Figure(go.Scatter(y=per_frame, mode="lines+markers", name="PSNR"))
        fig.add_trace(go.Scatter(x=np.arange(1, len(bf)), y=temporal_psnr_db(bf, tf), mode="lines+markers",
                                 name="temporal PSNR (frame t vs t-1)"))
        if gate_psnr:
            fig.add_hline(y=gate_psnr, line_dash="dash", annotation_text="gate")
        fig.add_vline(x=worst, line_dash="dot", annotation_text=f"worst frame {worst}")
        fig.update_layout(title="tuned video: PSNR and temporal PSNR per frame (raw uint8 frames vs the baseline)",
                          xaxis_title="frame", yaxis_title="dB", height=320)
        rows = []
        for i in sorted({0, len(bf) // 2, len(bf) - 1, worst}):
            v = frame_views(bf[i].numpy(), tf[i].numpy())
            scale = f"<br>shown 1/{v['factor']} size" if v["factor"] > 1 else ""
            tag = "<br><b>the worst frame</b>" if i == worst else ""
            rows.append(f"<tr><td>frame {i}{tag}<br>{per_frame[i]:.2f} dB{scale}</td><td><img src='{_png(v['baseline'])}'></td>"
                        f"<td><img src='{_png(v['tuned'])}'></td><td><img src='{_png(_heat(v['diff']))}'></td></tr>")
            if "crop" in v:
                c = v["crop"]
                rows.append(f"<tr class='crop'><td>frame {i}, full size at y={c['y']}, x={c['x']}<br>(largest "
                            f"difference)</td><td><img src='{_png(c['baseline'])}'></td><td><img src='{_png(c['tuned'])}'>"
                            f"</td><td><img src='{_png(_heat(c['diff']))}'></td></tr>")
        step = max(1, ba.shape[-1] // 4000)
        afig = go.Figure()
        afig.add_trace(go.Scatter(y=ba[0, ::step].numpy(), name="baseline", mode="lines"))
        afig.add_trace(go.Scatter(y=ta[0, ::step].numpy(), name="tuned", mode="lines", opacity=0.7))
        afig.update_layout(title=f"audio, channel 0 (SNR {audio_snr_db(ba, ta):.2f} dB, {sr} Hz)", height=300)
        media_html = (
            _players(d, tuned_dir)
            + fig.to_html(full_html=False, include_plotlyjs=False)
            + "<h2>Frames: baseline, tuned, difference (|b - t|, 64 levels saturate; a frame wider than "
            + f"{DISPLAY_WIDTH} px is shown shrunk, its difference keeping each block's largest, and a "
            + "full-size crop follows it)</h2>"
            + "<table class='frames'><tr><th></th><th>baseline</th><th>tuned</th><th>difference</th></tr>"
            + "".join(rows) + "</table>" + afig.to_html(full_html=False, include_plotlyjs=False)
        )

    trial_rows = []
    for r in records:
        q = r.get("quality") or {}
        trial = f"{r.get('trial', '')}" + (f" ({r['queued_from']})" if r.get("queued_from") else "")
        cells = [r["family"], trial, r.get("status", ""), r.get("reason") or "",
                 f"{r['total_ms']:.1f}" if r.get("total_ms") is not None else "",
                 _num(None if r.get("peak_memory_bytes") is None else r["peak_memory_bytes"] / 2**30, 2),
                 _stage_peaks((r.get("stats") or {}).get("peak_memory_bytes")),
                 f"{q['psnr_db']:.2f}" if q else "", f"{q['ssim']:.4f}" if q else "",
                 f"{q['audio_snr_db']:.2f}" if q else "", _num(q.get("temporal_psnr_db_worst"), 2),
                 _num(q.get("flip_worst"), 4), _num(q.get("audio_spectral_snr_db"), 2), _num(q.get("av_offset_ms"), 1),
                 _paired_text(r.get("paired")) or (f"not timed: {r['screened'].get('reason')}" if r.get("screened") else ""),
                 f"{100 * r['timing']['framework_fraction']:.1f}%" if (r.get("timing") or {}).get("wall_s") else "",
                 json.dumps(r.get("knobs"), default=str)]
        trial_rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")

    stage_fig = _stage_bars(summary.get("final"))
    bars = stage_fig.to_html(full_html=False, include_plotlyjs=False) if stage_fig is not None else ""
    measured = tuned_doc.get("measured", {})
    signoff = tuned_doc.get("signoff", {})
    head = (
        f"<h1>vidtune campaign report: {html.escape(str(tuned_doc.get('campaign')))}</h1>"
        + _found(summary, tuned_doc)
        + f"<p>model {html.escape(json.dumps(tuned_doc.get('model')))}, device "
        f"{html.escape(str((tuned_doc.get('environment') or {}).get('device')))}</p><h2>Request</h2>"
        + _pairs_table("request", tuned_doc.get("request"))
        + _quality_from_text(tuned_doc.get("quality_from"))
        + f"<h2>Tuned config</h2><pre id='tuned-knobs'>{html.escape(yaml.safe_dump(tuned_doc.get('knobs') or {}))}</pre>"
        + ((f"<p id='measured'>speed-up <b>x{measured.get('speedup', float('nan')):.3f}</b> "
            f"({html.escape(str(measured.get('method')))}"
            + (f"; one-sided Mann-Whitney p = {measured['p_value']:.3g}" if measured.get("p_value") is not None else "")
            + "); ") if tuned_doc.get("knobs") else
           (f"<p id='measured'>no speed-up: the tuned config is the baseline (measured against itself x"
            f"{measured.get('speedup', float('nan')):.3f}: the machine's noise, not a result); "))
        + f"PSNR {measured.get('psnr_db', float('nan')):.2f} dB (worst frame {measured.get('psnr_db_worst', float('nan')):.2f}), "
        f"SSIM {measured.get('ssim', float('nan')):.4f}, audio SNR {measured.get('audio_snr_db', float('nan')):.2f} dB</p>"
        + "<h2>Gate</h2>" + _pairs_table("gate", gate)
        + "<h2>Noise floor</h2>" + _pairs_table("noise-floor", measured.get("noise_floor"))
        + (f"<p id='rejected'>Not exported: the fastest gated combination "
           f"{html.escape(json.dumps(tuned_doc['rejected_candidate']['knobs'], default=str))} was "
           f"{html.escape(_rejection(tuned_doc['rejected_candidate']))}, so the tuned "
           f"config is the baseline.</p>" if tuned_doc.get("rejected_candidate") else "")
        + _tiers_table(summary.get("tiers"))
        + _overhead_text(summary.get("overhead")) + _estimates_text(records)
        + f"<h2>Sign-off</h2><p id='signoff'>"
        + (f"{html.escape(str(signoff.get('verdict')))} by {html.escape(str(signoff.get('by')))} at "
           f"{html.escape(str(signoff.get('at')))}: {html.escape(str(signoff.get('note') or ''))}"
           if signoff.get("verdict") else "not signed off yet (vidtune signoff)")
        + "</p>"
    )
    page = f"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>vidtune report</title>
<style>body{{font-family:sans-serif;margin:24px}} table{{border-collapse:collapse;font-size:12px}}
td,th{{border:1px solid #ccc;padding:3px 6px;vertical-align:top}} .frames img{{max-width:360px}}</style>
<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script></head><body>
{head}
<h2>Latency vs PSNR per family and for the integrator</h2>
{''.join(parts)}
{media_html}
{bars}
{_failures(records)}
<h2>Trials</h2>
<table id="trials"><tr><th>family</th><th>trial</th><th>status</th><th>reason</th><th>latency ms</th><th>peak memory GiB</th><th>peak per stage GiB</th><th>PSNR dB</th>
<th>SSIM</th><th>audio SNR dB</th><th>worst temporal PSNR dB</th><th>worst FLIP</th><th>audio spectral SNR dB</th><th>A/V offset ms</th>
<th>latency ratio (95% interval, pairs)</th><th>overhead</th><th>knobs</th></tr>
{''.join(trial_rows)}</table>
</body></html>"""
    out = d / "report.html"
    atomic_write_text(out, page)
    return out
