"""The trial worker: keeps one pipeline built on one device and evaluates knob settings on it.

Used in-process, or as a Ray actor (one per GPU, or one on the CPU) by the campaign driver. Every
failure is returned as a record with a reason (``oom``, ``non-finite``, ``invalid``, ``error``),
never raised, so a campaign goes on; timeouts and dead actors are handled by the driver.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["WorkerSpec", "TrialWorker", "failure_reason"]


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to rebuild the same pipeline and request in another process."""

    source: dict[str, Any]  # ModelSource fields
    request: dict[str, Any]  # GenerationRequest fields
    device: str
    stage2_tiling: dict[str, int] = field(default_factory=dict)
    vae_tiling: str = "default"
    repeats: int = 3
    warmup: int = 1
    baseline_dir: str = ""
    compile_cache_dir: str = ""  # techniques/kernel_choice/compile_cache.py ("": compiled artifacts not kept)
    paired: bool = True  # trials measured as a ratio against interleaved baseline runs (evaluate_paired)
    max_repeats: int = 6
    ratio_tolerance: float = 0.02


def failure_reason(exc: BaseException) -> tuple[str, str]:
    """(kind, message) of a failed trial: oom, non-finite, invalid, or error."""
    import torch

    from vidtune.search.stages import NonFiniteOutput
    from vidtune.techniques.registry import CompositionError, KnobError

    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
        return "oom", str(exc).splitlines()[0][:500]
    if isinstance(exc, NonFiniteOutput):
        return "non-finite", str(exc)
    if isinstance(exc, (KnobError, CompositionError)):
        return "invalid", str(exc)
    return "error", f"{type(exc).__name__}: {exc}"[:1000]


def _inject_fault() -> None:
    """Fault injection for tests of the driver: ``VIDTUNE_FAULT_INJECT=die-once:<marker file>`` makes the
    first evaluation (in any worker) kill its own process, as a crash or the OOM killer would."""
    import os

    spec = os.environ.get("VIDTUNE_FAULT_INJECT", "")
    if spec.startswith("die-once:"):
        marker = Path(spec.split(":", 1)[1])
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.close(fd)
        os._exit(1)


class TrialWorker:
    """Builds the pipeline once; evaluates settings against the stored baseline."""

    def __init__(self, spec: WorkerSpec) -> None:
        import vidtune  # noqa: F401  (torchaudio import shim in this process too)
        from vidtune.model import GenerationRequest, ModelSource, ReferencePipeline, Stage2Tiling, load_models

        from vidtune.techniques.kernel_choice.compile_cache import set_cache_dir

        self.spec = spec
        set_cache_dir(spec.compile_cache_dir or None)
        src = dict(spec.source)
        if src.get("stg_blocks") is not None:
            src["stg_blocks"] = tuple(src["stg_blocks"])
        self.source = ModelSource(**src)
        self.request = GenerationRequest.from_dict(spec.request)
        models = load_models(self.source, device=spec.device)
        self.pipeline = ReferencePipeline(models, device=spec.device, stage2_tiling=Stage2Tiling(**spec.stage2_tiling),
                                          vae_tiling=spec.vae_tiling if spec.vae_tiling == "default" else None)
        self.baseline = None
        # progress lines of long calls (bench); the CLI points it at stderr. A bench of a large model can
        # run for minutes, and one killed at its time limit said nothing of where it was (round 3 of
        # results/benchmarks/parallel: ltx2-19b on two H200s, 290 s, no output).
        self.progress: Any = None

    def _say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)

    def ping(self) -> str:
        return "ok"

    def ensure_baseline(self) -> dict[str, Any]:
        """Run or reuse the baseline in ``spec.baseline_dir``; returns its key, latency and noise floor."""
        from vidtune.search.evaluator import ensure_baseline

        base, reused = ensure_baseline(self.pipeline, self.request, self.source, Path(self.spec.baseline_dir),
                                       repeats=self.spec.repeats, warmup=self.spec.warmup)
        self.baseline = base
        return {"key": base.key, "reused": reused, "latency": base.latency, "directory": str(base.directory),
                "total_ms": sum(v["median_ms"] for v in base.latency.values()),
                "noise_floor": base.meta.get("noise_floor"), "environment": base.meta.get("environment")}

    def _load_baseline(self):
        if self.baseline is None:
            from vidtune.search.baseline import baseline_key, load_baseline

            key = baseline_key(self.source, self.request, self.pipeline)
            self.baseline = load_baseline(Path(self.spec.baseline_dir), key, self.pipeline.device)
            if self.baseline is None:
                raise RuntimeError(f"no baseline with key {key[:12]} in {self.spec.baseline_dir}")
        return self.baseline

    def close(self) -> None:
        """Nothing to release in one process (``ParallelTrialWorker`` stops its helper ranks here)."""

    def evaluate(self, knobs: dict[str, dict[str, Any]], scoped: bool = True, repeats: int | None = None) -> dict[str, Any]:
        """Evaluate a setting; returns a JSON-able record with ``status`` ok or fail (+ reason)."""
        from vidtune.search.evaluator import evaluate, evaluate_paired

        _inject_fault()
        t0 = time.time()
        try:
            base = self._load_baseline()
            n = repeats or self.spec.repeats
            if self.spec.paired:
                ev = evaluate_paired(self.pipeline, self.request, knobs, baseline=base, repeats=n,
                                     max_repeats=max(n, self.spec.max_repeats), tolerance=self.spec.ratio_tolerance,
                                     warmup=self.spec.warmup, scoped=scoped)
            else:
                ev = evaluate(self.pipeline, self.request, knobs, baseline=base, repeats=n, warmup=self.spec.warmup,
                              scoped=scoped)
            record = ev.record()
            record.update(status="ok", wall_s=time.time() - t0)
            return record
        except Exception as exc:  # recorded, never raised: the campaign goes on
            kind, message = failure_reason(exc)
            return {"status": "fail", "reason": kind, "message": message, "knobs": knobs, "wall_s": time.time() - t0,
                    "traceback": traceback.format_exc()[-3000:]}

    def bench(self, knobs: dict[str, dict[str, Any]], repeats: int, out_dir: str | None = None,
              rewarm: bool = True) -> dict[str, Any]:
        """Baseline and setting alternated in both orders (A B, B A, A B, ...), one full run each, after the
        setting's warm-up (a compile, an autotune) and one run of each after it, so that no recompile lands
        in a timed run; ratio of median totals, and per stage.

        ``rewarm=False`` leaves out that untimed pair (two whole generations: at 3840x2176 about 140 s on
        the H200); the graphs Dynamo compiled during the timed runs are counted either way
        (``graphs_compiled_while_timed``: not 0 means a timed run paid a compile).
        With ``out_dir``, the tuned run's video (MP4) and raw frames/audio (safetensors) are written there.
        """
        import statistics

        from torch._dynamo.utils import counters

        from vidtune.search.evaluator import evaluate

        base = self._load_baseline()
        a_totals, b_totals, last = [], [], None
        a_stages: list[dict[str, float]] = []
        b_stages: list[dict[str, float]] = []
        t0 = time.time()
        warm = evaluate(self.pipeline, self.request, knobs, baseline=base, repeats=1, warmup=self.spec.warmup,
                        scoped=False)
        if rewarm:
            # one more untimed run of each: re-applying a setting after the baseline ran must not recompile
            # in a timed run (compile keeps its graphs for the same block signature)
            evaluate(self.pipeline, self.request, {}, baseline=base, repeats=1, warmup=0, scoped=False)
            evaluate(self.pipeline, self.request, knobs, baseline=base, repeats=1, warmup=0, scoped=False)
        warmup_s = time.time() - t0
        self._say(f"bench: setting warmed up in {warmup_s:.1f} s (its first run: " + ", ".join(
            f"{stage} {ms / 1000:.1f} s" for stage, ms in warm.timing["first_run_ms"].items()) + ")")
        graphs_before = counters["stats"]["unique_graphs"]

        def run(which: str) -> Any:
            ev = evaluate(self.pipeline, self.request, {} if which == "A" else knobs, baseline=base, repeats=1,
                          warmup=0, scoped=False)
            (a_totals if which == "A" else b_totals).append(ev.total_ms)
            (a_stages if which == "A" else b_stages).append({s: v["median_ms"] for s, v in ev.latency.items()})
            return ev

        for i in range(repeats):
            order = "AB" if i % 2 == 0 else "BA"
            got = {w: run(w) for w in order}
            last = (got["A"], got["B"])
            self._say(f"bench: repeat {i + 1}/{repeats} ({' '.join(order)}): baseline {got['A'].total_ms:.1f} ms, "
                      f"setting {got['B'].total_ms:.1f} ms")
        compiled_while_timed = counters["stats"]["unique_graphs"] - graphs_before
        if compiled_while_timed:
            self._say(f"bench: warning: {compiled_while_timed} graph(s) compiled during the timed runs")
        a, b = last
        stages = {s: {"baseline_ms": statistics.median(r[s] for r in a_stages),
                      "tuned_ms": statistics.median(r[s] for r in b_stages)} for s in a_stages[0]}
        for v in stages.values():
            v["speedup"] = v["baseline_ms"] / v["tuned_ms"] if v["tuned_ms"] > 0 else None
        if out_dir:
            from vidtune.model.media import write_mp4, write_raw

            out = b.output
            write_raw(Path(out_dir) / "output.safetensors", out.frames, out.audio, out.sample_rate, self.request.fps)
            write_mp4(Path(out_dir) / "video.mp4", out.frames, self.request.fps, out.audio, out.sample_rate)
        return {
            "baseline_total_ms": a_totals, "tuned_total_ms": b_totals,
            "speedup": statistics.median(a_totals) / statistics.median(b_totals),
            "baseline_latency": a.latency, "tuned_latency": b.latency, "stages": stages,
            "order": "A B, B A, ... (A: baseline, B: setting)",
            "warmup_s": round(warmup_s, 1), "warmup": warm.timing, "rewarm": rewarm, "graphs_compiled_while_timed": compiled_while_timed,
            "quality": b.quality.to_dict(), "stats": b.stats,
        }
