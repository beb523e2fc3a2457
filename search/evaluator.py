"""Evaluate a knob setting: per-stage latency (warm-up excluded), peak memory, output, and quality.

``evaluate`` applies the setting with ``compose`` (conflicts rejected before any work), re-runs only the
stages the active techniques touch, starting from the baseline's stored output of the stage before
(stage-scoped evaluation), and always decodes to the final video so quality is measured on what a user
gets. ``ensure_baseline`` runs or reuses the all-off baseline of a request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from vidtune.model.loading import ModelSource
from vidtune.model.pipeline import STAGES, GenerationOutput, ReferencePipeline
from vidtune.model.request import GenerationRequest
from vidtune.search.baseline import Baseline, baseline_key, load_baseline, save_baseline
from vidtune.search.defaults import RATIO_TOLERANCE
from vidtune.search.metrics import FLIP_FRAMES, Quality, quality
from vidtune.search.stages import StoredStages, run_from
from vidtune.search.timing import Interleaved, LatencyRecord, PeakMemory, alternating, summarise
from vidtune.techniques.setting import Setting, SettingLike, check_request, compose, resolve_values, stages_touched

__all__ = ["Evaluation", "evaluate", "evaluate_paired", "ratio_interval", "ensure_baseline", "noise_floor_setting"]


@dataclass
class Evaluation:
    """Result of one knob setting on one request."""

    knobs: Setting
    start_stage: str
    latency: dict[str, LatencyRecord]  # stage -> its summary (measured, or reused from the baseline)
    total_ms: float  # sum of per-stage medians
    peak_memory_bytes: int  # the setting's peak in the evaluation (PeakMemory: CUDA allocated, or the CPU's RSS)
    output: GenerationOutput
    quality: Quality | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)  # PeakMemory.stop(): reserved peak, kind
    # where the evaluation's wall time went (see ``evaluate``): seconds, and the first run's stages in ms
    timing: dict[str, Any] = field(default_factory=dict)
    paired: dict[str, Any] | None = None  # ``evaluate_paired``: the ratios against interleaved baseline runs
    # not timed: {"reason": why the screen stopped it after its warm-up, "latency_from": where ``latency`` came from}
    screened: dict[str, Any] | None = None

    def record(self) -> dict[str, Any]:
        """JSON-able trial record (no tensors)."""
        return {
            "knobs": self.knobs,
            "start_stage": self.start_stage,
            "latency": self.latency,
            "total_ms": self.total_ms,
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_memory_reserved_bytes": self.memory.get("peak_memory_reserved_bytes"),
            "peak_memory_kind": self.memory.get("peak_memory_kind"),
            "quality": self.quality.to_dict() if self.quality else None,
            "stats": self.stats,
            "timing": self.timing,
            **({"paired": self.paired} if self.paired is not None else {}),
            **({"screened": self.screened} if self.screened is not None else {}),
        }


class _Runs:
    """The runs of one evaluation: each one's wall seconds, the timed ones' per-stage samples, and the
    first run's stages (where a compile or an autotune lands)."""

    def __init__(self, pipeline: ReferencePipeline, request: GenerationRequest, start: str,
                 stored: StoredStages | None, on_stage: Any = None) -> None:
        self.args = (pipeline, request, start, stored, on_stage)
        self.seconds: list[float] = []
        self.samples: dict[str, list[float]] = {}
        self.first_ms: dict[str, float] = {}

    def run(self, timed: bool, setting: bool = True) -> tuple[GenerationOutput, dict[str, float]]:
        """One run; ``timed``: its stages count in the samples; ``setting=False``: a run of the baseline
        interleaved with the setting's (``evaluate_paired``), not the setting's first run."""
        t_run = time.perf_counter()
        out, times = run_from(*self.args)
        self.seconds.append(time.perf_counter() - t_run)
        if setting and not self.first_ms:
            self.first_ms = {stage: round(ms, 3) for stage, ms in times.items()}
        if timed:
            for stage, ms in times.items():
                self.samples.setdefault(stage, []).append(ms)
        return out, times


def _latency(samples: dict[str, list[float]], baseline: Baseline | None) -> dict[str, LatencyRecord]:
    """Per-stage summaries of the measured stages; the stages not run taken from the stored baseline."""
    latency = {stage: summarise(samples[stage]).to_dict() for stage in STAGES if stage in samples}
    if baseline is not None:
        for stage in STAGES:
            if stage not in latency and stage in baseline.latency:
                latency[stage] = {**baseline.latency[stage], "source": "baseline"}
    return latency


def _timing(t0: float, runs_s: list[float], warmup_s: float, apply_s: float, quality_s: float,
            first_run_ms: dict[str, float], waited_s: float = 0.0) -> dict[str, Any]:
    """Where an evaluation's wall time went: the generations' own (warm-up and timed runs) against
    everything else it did (applying and undoing the setting, the quality metrics, what run_from does
    between stages); the first run's stages show where a compile or an autotune landed."""
    wall_s = time.perf_counter() - t0
    generations_s = sum(runs_s)
    return {"wall_s": round(wall_s, 3), "timed_runs_s": round(generations_s - warmup_s, 3),
            "warmup_runs_s": round(warmup_s, 3), "apply_s": round(apply_s, 3), "quality_s": round(quality_s, 3),
            "waited_s": round(waited_s, 3), "framework_s": round(wall_s - generations_s, 3),
            "framework_fraction": round((wall_s - generations_s) / wall_s, 4) if wall_s > 0 else 0.0,
            "first_run_ms": first_run_ms}


def evaluate(
    pipeline: ReferencePipeline,
    request: GenerationRequest,
    knobs: SettingLike | None = None,
    *,
    baseline: Baseline | None = None,
    repeats: int = 3,
    warmup: int = 1,
    scoped: bool = True,
    on_run: Any = None,
    flip_frames: int = FLIP_FRAMES,
    before_timing: Any = None,
    on_stage: Any = None,
) -> Evaluation:
    """Measure ``knobs`` (values per technique) on ``request``.

    Args:
        pipeline: the reference pipeline (the model stays loaded between calls).
        request: the generation request.
        knobs: ``{"kernel_choice.sdpa_backend": {"video_self": "flash"}, ...}``; missing knobs are off.
        baseline: when given, stages before the first touched one are reused from it and quality is
            measured against its frames and audio.
        repeats: timed runs (median and spread are reported).
        warmup: untimed runs first (compile, autotune, allocator warm-up).
        scoped: re-run only from the first stage the setting touches (False: every stage, end to end).
        on_run: called with (run index, that run's stage milliseconds) after each run (progress lines).
        flip_frames: frames the FLIP metric is computed on (``metrics.quality``; 0: left out).
        before_timing: called once after the warm-up runs, before the first timed run (a worker waits there
            for work it overlapped with the warm-up, e.g. the quality model's run on the same GPU); its time
            counts as the framework's (``timing["waited_s"]``).
        on_stage: called with each stage's name as it starts, in every run (``search.progress.Heartbeat``).
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"evaluate: repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    values = resolve_values(knobs or {})
    check_request(values, request, pipeline.device)
    touched = stages_touched(values)
    start = touched[0] if (scoped and touched and baseline is not None) else "stage1"
    stored = baseline.stages if baseline is not None else None
    device = pipeline.device
    runs = _Runs(pipeline, request, start, stored, on_stage)
    t0 = time.perf_counter()
    patch = compose(pipeline, values)
    apply_s = time.perf_counter() - t0
    out = None
    memory = PeakMemory(device)  # (after the setting is applied: what it keeps resident counts from the start)
    waited_s = 0.0
    try:
        for i in range(warmup + repeats):
            if i == warmup and before_timing is not None:
                t_wait = time.perf_counter()
                before_timing()
                waited_s = time.perf_counter() - t_wait
            out, times = runs.run(timed=i >= warmup)
            if on_run is not None:
                on_run(i, times)
    finally:
        mem = memory.stop()  # (the generations' peak; the metrics after them are the framework's)
        t_undo = time.perf_counter()
        patch.undo()
        apply_s += time.perf_counter() - t_undo
    latency = _latency(runs.samples, baseline)
    total = sum(v["median_ms"] for v in latency.values())
    t_q = time.perf_counter()
    q = (quality(baseline.frames, baseline.audio, out.frames, out.audio, device, flip_frames, fps=request.fps,
                 sample_rate=out.sample_rate) if baseline is not None else None)
    quality_s = time.perf_counter() - t_q
    timing = _timing(t0, runs.seconds, sum(runs.seconds[:warmup]), apply_s, quality_s, runs.first_ms, waited_s)
    return Evaluation(knobs=values, start_stage=start, latency=latency, total_ms=total,
                      peak_memory_bytes=mem["peak_memory_bytes"], memory=mem, output=out, quality=q, stats=dict(out.stats),
                      timing=timing)


def ratio_interval(ratios: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Student-t interval of the mean of paired ratios ((-inf, inf) for fewer than two)."""
    import math
    import statistics

    from scipy.stats import t

    n = len(ratios)
    if n < 2:
        return (-math.inf, math.inf)
    half = float(t.ppf(0.5 + confidence / 2, n - 1)) * statistics.stdev(ratios) / math.sqrt(n)
    mean = statistics.fmean(ratios)
    return (float(mean - half), float(mean + half))


def evaluate_paired(
    pipeline: ReferencePipeline,
    request: GenerationRequest,
    knobs: SettingLike | None,
    *,
    baseline: Baseline,
    repeats: int = 3,
    max_repeats: int = 6,
    tolerance: float = RATIO_TOLERANCE,
    warmup: int = 1,
    scoped: bool = True,
    flip_frames: int = FLIP_FRAMES,
    before_timing: Any = None,
    screen: Callable[[GenerationOutput], str | None] | None = None,
    on_stage: Callable[[str], None] | None = None,
    prune: Callable[[float], str | None] | None = None,
    estimate: Callable[[GenerationOutput], dict[str, Any] | None] | None = None,
) -> Evaluation:
    """Measure ``knobs`` as a latency ratio against baseline runs interleaved with it in this process.

    After the setting's warm-up, pairs of runs of the same stages (the setting's, stage-scoped, and the
    baseline's from the same stored input) alternate in both orders, A B, B A, A B, ... (A: baseline), so
    a drift of the machine (clocks, heat, another process) lands on both. Each pair gives the ratio of
    the whole generation's latency, setting over baseline, the stages not re-run counted at the stored
    baseline's medians. Repeats adapt: at least ``repeats`` pairs; then, while the 95% interval of the
    mean ratio straddles 1 and is wider than +-``tolerance``, one more pair, up to ``max_repeats``.

    ``total_ms`` is the stored baseline's total times the median ratio (comparable between trials, whatever
    the machine's speed at the time); ``paired`` holds the ratios, their interval, the repeats, and
    ``faster``: True when the interval lies below 1 (faster beyond the noise). ``latency`` holds the
    setting's per-stage medians as ``evaluate`` does.

    ``screen``: called once with the setting's first output (the warm-up's, after ``before_timing``; without a
    warm-up, the first pair's); a reason (a string) ends the evaluation there (``_screened``): a setting the
    quality gate rejects is not worth its timed pairs. ``on_stage``: as ``evaluate``'s.

    ``prune``: successive halving over pairs: called with the first pair's ratio when more would follow; a
    reason ends the timing there (the setting cannot win), returned as measured, ``paired["pruned"]`` the reason.
    ``estimate``: the rung below the first pair (search/latency_model.py), called after the screen with the setting
    not applied and its first output; its ``ratio``, made better by its ``slack`` (the model's error), goes to
    ``prune`` first (unless its ``prune`` is False): a reason ends the evaluation before any pair, its latency the
    estimate's (``paired["repeats"]`` 0); so does an estimate that is ``trust``ed. Kept as ``paired["estimate"]``.
    """
    import statistics

    if repeats < 1 or max_repeats < repeats or warmup < 0:
        raise ValueError(f"evaluate_paired: need 1 <= repeats <= max_repeats and warmup >= 0, got {repeats}, "
                         f"{max_repeats} and {warmup}")
    values = resolve_values(knobs or {})
    check_request(values, request, pipeline.device)
    touched = stages_touched(values)
    start = touched[0] if (scoped and touched) else "stage1"
    stored = baseline.stages
    device = pipeline.device
    peaks: list[dict[str, Any]] = []  # one window per application of the setting: the baseline's runs are not in it
    ran = STAGES[STAGES.index(start):]
    unrun_ms = sum(v["median_ms"] for s, v in baseline.latency.items() if s not in ran)
    t0 = time.perf_counter()
    apply_s = 0.0
    runs = _Runs(pipeline, request, start, stored, on_stage)
    out = None

    def apply(side: str) -> Callable[[], None] | None:
        """The setting applied for B (its peak-memory window open until it is undone), nothing for A."""
        nonlocal apply_s
        if side == "A":
            return None
        t_apply = time.perf_counter()
        patch = compose(pipeline, values)
        apply_s += time.perf_counter() - t_apply
        memory = PeakMemory(device)

        def undo() -> None:
            nonlocal apply_s
            peaks.append(memory.stop())
            t_undo = time.perf_counter()
            patch.undo()
            apply_s += time.perf_counter() - t_undo
        return undo

    def run(side: str, timed: bool = True) -> float:
        """One run of the stages from ``start``, the setting's (B) or the baseline's (A); its total ms."""
        nonlocal out
        if side == "A":
            return sum(runs.run(timed=False, setting=False)[1].values())
        out, times = runs.run(timed)
        return sum(times.values())

    with Interleaved(apply) as sides:  # (B's runs in a row under one application: B A | A B share B's)
        for _ in range(warmup):
            sides.run("B", lambda: run("B", timed=False))
        sides.release()  # (before_timing and the estimate see the pipeline without the setting)
        warmup_s = sum(runs.seconds)
        waited_s = 0.0
        if before_timing is not None:  # (as in ``evaluate``: after the warm-up, before any timed run)
            t_wait = time.perf_counter()
            before_timing()
            waited_s = time.perf_counter() - t_wait
        unscreened = screen is not None  # asked once, on the setting's first output: the warm-up's, else the first pair's

        def screened() -> Evaluation | None:
            nonlocal unscreened
            if not unscreened or out is None:
                return None
            sides.release()  # (the application's peak window closed before the screen reads it)
            unscreened, reason = False, screen(out)
            return None if reason is None else _screened(reason, values, start, runs, baseline, out, peaks, request,
                                                         flip_frames, device, (t0, warmup_s, apply_s, waited_s))

        if (stopped := screened()) is not None:
            return stopped
        est = estimate(out) if (estimate is not None and out is not None) else None  # (out: the warm-up's)
        pruned = (prune(est["ratio"] / (1.0 + est.get("slack", 0.0)), f"its estimate, {est.get('slack', 0.0):.0%} better,")
                  if (est is not None and prune is not None and est.get("prune", True)) else None)
        pairs: list[tuple[float, float]] = []  # (baseline, setting) totals over the stages run
        rounds = alternating(("A", "B"), max_repeats)  # A B, B A, ...
        while len(pairs) < max_repeats and pruned is None and not (est or {}).get("trust"):
            got = {side: sides.run(side, lambda: run(side)) for side in next(rounds)}
            pairs.append((got["A"], got["B"]))
            if (stopped := screened()) is not None:
                return stopped
            ratios = [(unrun_ms + b) / (unrun_ms + a) for a, b in pairs]
            interval = ratio_interval(ratios)
            if prune is not None and len(pairs) == 1 < repeats and (pruned := prune(ratios[0])) is not None:
                break
            if len(pairs) >= repeats and (interval[1] - interval[0] <= 2 * tolerance or not interval[0] <= 1.0 <= interval[1]):
                break
    a_ms, b_ms = [a for a, _ in pairs], [b for _, b in pairs]
    if pairs:
        latency, ratio = _latency(runs.samples, baseline), statistics.median(ratios)
    else:  # stopped by the estimate, or its estimate trusted: faster or slower beyond the model's error
        latency, ratio, ratios = est["latency"], est["ratio"], []
        interval = (est["ratio"] / (1.0 + est.get("slack", 0.0)), est["ratio"] * (1.0 + est.get("slack", 0.0)))
    base_total = sum(v["median_ms"] for v in baseline.latency.values())
    t_q = time.perf_counter()
    q = quality(baseline.frames, baseline.audio, out.frames, out.audio, device, flip_frames, fps=request.fps,
                sample_rate=out.sample_rate)
    quality_s = time.perf_counter() - t_q
    timing = _timing(t0, runs.seconds, warmup_s, apply_s, quality_s, runs.first_ms, waited_s)
    paired = {"ratio": ratio, "mean": statistics.fmean(ratios or [ratio]), "interval": list(interval), "ratios": ratios,
              "repeats": len(ratios), "baseline_ms": a_ms, "setting_ms": b_ms, "unrun_ms": unrun_ms,
              "faster": interval[1] < 1.0, "slower": interval[0] > 1.0,
              **({"pruned": pruned} if pruned is not None else {}), **({"estimate": est} if est is not None else {}),
              "method": "A B, B A, ... in one process; ratio of whole-generation latency per pair, the stages "
                        "not re-run at the stored baseline's medians; 95% Student-t interval of the mean"}
    stats = dict(out.stats)
    mem = max(peaks, key=lambda m: m["peak_memory_bytes"])
    return Evaluation(knobs=values, start_stage=start, latency=latency, total_ms=base_total * ratio,
                      peak_memory_bytes=mem["peak_memory_bytes"], memory=mem, output=out, quality=q, stats=stats,
                      timing=timing, paired=paired)


def _screened(reason: str, values: Setting, start: str, runs: _Runs, baseline: Baseline, out: GenerationOutput,
              peaks: list[dict[str, Any]], request: GenerationRequest, flip_frames: int, device: torch.device,
              clock: tuple[float, float, float, float]) -> Evaluation:
    """An evaluation the screen stopped after the warm-up: its latency is the first run's (a compile or an
    autotune included, so an upper bound), the stages not run the stored baseline's; no ``paired``. Its
    quality is measured as usual, on the warm-up's output (the same setting, the same input)."""
    t0, warmup_s, apply_s, waited_s = clock
    latency = _latency({stage: [ms] for stage, ms in runs.first_ms.items()}, baseline)
    t_q = time.perf_counter()
    q = quality(baseline.frames, baseline.audio, out.frames, out.audio, device, flip_frames,
                fps=request.fps, sample_rate=out.sample_rate)
    timing = _timing(t0, runs.seconds, warmup_s, apply_s, time.perf_counter() - t_q, runs.first_ms, waited_s)
    mem = max(peaks, key=lambda m: m["peak_memory_bytes"])
    return Evaluation(knobs=values, start_stage=start, latency=latency,
                      total_ms=sum(v["median_ms"] for v in latency.values()), peak_memory_bytes=mem["peak_memory_bytes"],
                      memory=mem, output=out, quality=q, stats=dict(out.stats), timing=timing,
                      screened={"reason": reason, "latency_from": "the setting's first run (a compile or an autotune "
                                                                   "included, where it has one)"})


def ensure_baseline(
    pipeline: ReferencePipeline,
    request: GenerationRequest,
    source: ModelSource,
    directory: Path,
    *,
    repeats: int = 3,
    warmup: int = 1,
    force: bool = False,
    noise_floor: bool = True,
    mp4: bool = True,
    background: bool = False,
    say: Any = None,
    flip_frames: int = FLIP_FRAMES,
) -> tuple[Baseline, bool]:
    """Load the baseline in ``directory`` if its key matches, else run and store it.

    A new baseline costs ``repeats`` timed generations plus one: its noise floor (``noise_floor_setting``,
    recorded in ``meta.json``) is measured on the first untimed run, which is also the warm-up (allocator,
    convolution algorithms, the text encoder; only the baseline's own attention kernels are not warmed by
    it, and a slower first timed run is outside the median of three). Further ``warmup`` runs, if more
    than one, are of the baseline itself. ``background=True`` writes the MP4 in a thread
    (``Baseline.wait_files``; the files a reuse reads are written before this returns); ``mp4=False`` leaves
    it out (it is for a person to watch; at 3840x2176 a 602 MB encode). ``say`` gets a line per generation.
    Returns the baseline and whether it was reused.
    """
    key = baseline_key(source, request, pipeline)
    if not force:
        found = load_baseline(directory, key, pipeline.device)
        if found is not None:
            return found, True
    say = say or (lambda line: None)
    total = (max(warmup, 1) if noise_floor else warmup) + repeats
    t0 = time.perf_counter()
    floor_out, setting = None, None
    if noise_floor:
        setting = noise_floor_setting(pipeline.device)
        floor_ev = evaluate(pipeline, request, setting, repeats=1, warmup=0)
        floor_out = floor_ev.output
        say(f"baseline: generation 1/{total} (the noise floor's, untimed) {time.perf_counter() - t0:.1f} s")
        warmup = max(0, warmup - 1)

    def progress(i: int, ms: dict[str, float]) -> None:
        n = i + 1 + (1 if noise_floor else 0)
        what = "warm-up" if i < warmup else f"timed {i - warmup + 1}/{repeats}"
        say(f"baseline: generation {n}/{total} ({what}) {sum(ms.values()) / 1000:.1f} s")

    ev = evaluate(pipeline, request, {}, repeats=repeats, warmup=warmup, on_run=progress)
    out = ev.output
    extra = {"total_ms": ev.total_ms, "peak_memory_bytes": ev.peak_memory_bytes, "stats": ev.stats,
             "generations": total}
    if floor_out is not None:
        q = quality(out.frames, out.audio, floor_out.frames, floor_out.audio, flip_frames=flip_frames, fps=request.fps,
                    sample_rate=out.sample_rate)
        extra["noise_floor"] = {"setting": setting, "quality": q.to_dict()}
    extra["seconds"] = round(time.perf_counter() - t0, 3)  # the generations and the metrics, not the files
    base = save_baseline(directory, key, request, source, pipeline, out.frames, out.audio, out.sample_rate,
                         StoredStages.from_output(out), ev.latency, extra=extra, mp4=mp4, background=background)
    say(f"baseline: {total} generation(s) and metrics in {extra['seconds']:.1f} s; files written"
        + (", its MP4 in the background" if (background and mp4) else ""))
    return base, False


def noise_floor_setting(device: torch.device) -> dict[str, dict[str, str]]:
    """A change that should be harmless: another exact attention backend for every attention kind.

    Its quality against the baseline is the floating-point noise floor that approximate techniques are
    judged beside (flash on a GPU, whose default is cuDNN; the math kernel on a CPU).
    """
    from vidtune.model.generation import ATTENTION_KINDS

    backend = "flash" if torch.device(device).type == "cuda" else "math"
    return {"kernel_choice.sdpa_backend": {kind: backend for kind in ATTENTION_KINDS}}
