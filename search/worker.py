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

from vidtune._compat import actor_threads
from vidtune.search.defaults import FLIP_FRAMES, MP4_AUTO_BYTES, RATIO_TOLERANCE
from vidtune.search.halving import pair_pruner
from vidtune.search.gpu_memory import (before_run, enforce_memory_budget, memory_cap_gib, quality_concurrent,
                                       release_after_failure, worker_budget)
from vidtune.model.loading import ModelSource
from vidtune.model.request import GenerationRequest
from vidtune.search.quality_model import (QualityProcess, QualitySpec, geometry,  # noqa: F401  (re-exported)
                                         model_source, quality_setting, unmeasured_on_quality_model)
from vidtune.search.records import Reason, Status, failure_reason, inject_fault
from vidtune.search.timing import alternating, stage_split
from vidtune.techniques.setting import Setting, SettingLike

__all__ = ["WorkerSpec", "TrialWorker", "QualityProcess", "geometry", "quality_setting",
           "unmeasured_on_quality_model"]


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to rebuild the same pipeline and request in another process."""

    source: ModelSource  # (a mapping of its fields is converted)
    request: GenerationRequest  # (a mapping of its fields is converted)
    device: str
    stage2_tiling: dict[str, int] = field(default_factory=dict)
    vae_tiling: str = "default"
    repeats: int = 3
    warmup: int = 1
    baseline_dir: str = ""
    compile_cache_dir: str = ""  # techniques/kernel_choice/compile_cache.py ("": compiled artifacts not kept)
    paired: bool = True  # trials measured as a ratio against interleaved baseline runs (evaluate_paired)
    max_repeats: int = 6
    ratio_tolerance: float = RATIO_TOLERANCE  # (search/evaluator.py, evaluate_paired)
    baseline_mp4: bool | None = None  # None: when the frames are <= MP4_AUTO_BYTES
    flip_frames: int = FLIP_FRAMES  # frames the FLIP metric is computed on (search/metrics.py; 0: left out)
    # GiB this worker's process may allocate on its GPU (torch.cuda.set_per_process_memory_fraction), so that
    # an over-budget setting fails as OOM (recorded) instead of using the card; None: the whole card. On a
    # CPU nothing is enforced (gate.peak_memory_gb still rejects what was measured above it).
    memory_budget_gb: float | None = None
    progress_file: str = ""  # progress lines (the baseline's generations) appended here for the driver to show
    # torch's CPU threads in this worker's process (0: leave them; -1: its node's share, ``actor_threads``): a Ray
    # actor of num_cpus=1 starts with OMP_NUM_THREADS=1; the campaign's pool sets its host's cores over its actors
    threads: int = 0
    # family trials estimated first by the latency model (search/latency_model.py): True stops those it rules out,
    # "trust" also records the others at it (no pairs), "record" records it beside the pairs, False leaves it out
    estimate: bool | str = False
    quality: QualitySpec | None = None  # the quality model (a mapping of its fields is converted); None: this model's

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", model_source(self.source))
        object.__setattr__(self, "request", GenerationRequest.of(self.request))
        object.__setattr__(self, "quality", QualitySpec.of(self.quality))


class TrialWorker:
    """Builds the pipeline once; evaluates settings against the stored baseline."""

    def __init__(self, spec: WorkerSpec) -> None:
        import vidtune  # noqa: F401  (torchaudio import shim in this process too)
        from vidtune.model import ReferencePipeline, Stage2Tiling, load_models

        from vidtune.techniques.kernel_choice.compile_cache import set_cache_dir

        self.spec = spec
        if spec.threads:
            import torch

            torch.set_num_threads(spec.threads if spec.threads > 0 else actor_threads())
        set_cache_dir(spec.compile_cache_dir or None)
        q, concurrent, budget = spec.quality, quality_concurrent(spec), worker_budget(spec)  # (gpu_memory.py)
        self.memory_budget = enforce_memory_budget(budget, spec.device)
        self.memory_cap_gib = memory_cap_gib(spec.device, budget)  # (an OOM's record says under which cap)
        self.source, self.request = spec.source, spec.request
        models = load_models(self.source, device=spec.device)
        self.pipeline = ReferencePipeline(models, device=spec.device, stage2_tiling=Stage2Tiling(**spec.stage2_tiling),
                                          vae_tiling=spec.vae_tiling if spec.vae_tiling == "default" else None)
        self.baseline = None
        self.quality_worker = None
        if spec.quality:  # a second, trained model on the same device, evaluated at each trial's mapped setting
            qspec = WorkerSpec(
                source=q.source, request=q.request, device=spec.device, repeats=1, warmup=0, paired=False,
                baseline_dir=q.baseline_dir, compile_cache_dir=spec.compile_cache_dir, baseline_mp4=False,
                flip_frames=spec.flip_frames)
            self._quality_spec = qspec
            if concurrent:
                import torch

                self.quality_worker = QualityProcess(qspec, TrialWorker, threads=torch.get_num_threads())
            else:
                self.quality_worker = TrialWorker(qspec)
        # where a quality model gives the numbers, this model's own (latency_model_quality, informative only) leave
        # FLIP out (on a CPU a 1024x1536 frame took 2.2 s; on a GPU FLIP is ~10 ms a frame, search/flip.py)
        self.flip_frames = 0 if self.quality_worker is not None else spec.flip_frames
        self.progress: Any = None  # progress lines of long calls (bench); the CLI points it at stderr
        self._passes: dict[str, Any] = {}  # the latency model's captured passes (``estimator``)

    def _say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)
        if self.spec.progress_file:
            with open(self.spec.progress_file, "a") as f:
                f.write(message + "\n")

    def ping(self) -> str:
        return "ok"

    def configure(self, spec: WorkerSpec) -> str:
        """Made anew for ``spec`` (a pool adopted by another campaign): as a new process, less its start."""
        import torch

        from vidtune.techniques.kernel_choice.compile_cache import forget_loads

        self.close()
        torch._dynamo.reset()
        forget_loads()
        self.__init__(spec)
        return "ok"

    def threads(self) -> int:
        """torch's CPU threads in this worker's process."""
        import torch

        return torch.get_num_threads()

    def ensure_baseline(self) -> dict[str, Any]:
        """Run or reuse the baseline in ``spec.baseline_dir``; returns its key, latency and noise floor."""
        from vidtune.search.evaluator import ensure_baseline

        r = self.request
        mp4 = self.spec.baseline_mp4
        mp4 = (r.frames * r.height * r.width * 3 <= MP4_AUTO_BYTES) if mp4 is None else mp4
        # the MP4 is written in the background while the trials start (the raw files, which another process
        # may need, before this returns); the frames stay on this worker's device for the metrics
        base, reused = ensure_baseline(self.pipeline, self.request, self.source, Path(self.spec.baseline_dir),
                                       repeats=self.spec.repeats, warmup=self.spec.warmup, mp4=mp4, background=True,
                                       say=self._say, flip_frames=self.flip_frames)
        self.baseline = base
        return {"key": base.key, "reused": reused, "latency": base.latency, "directory": str(base.directory),
                "quality_model": self.ensure_quality_baseline(),
                "total_ms": sum(v["median_ms"] for v in base.latency.values()),
                "noise_floor": base.meta.get("noise_floor"), "environment": base.meta.get("environment"),
                "generations": 0 if reused else base.meta.get("generations"),
                "seconds": 0.0 if reused else base.meta.get("seconds"), "mp4": bool(mp4 and not reused)}

    def ensure_quality_baseline(self) -> dict[str, Any] | None:
        """Run or reuse the quality model's baseline (None without a quality model)."""
        if self.quality_worker is None:
            return None
        q, w = self.quality_worker.ensure_baseline(), self.quality_worker
        self._say(f"baseline: the quality model's {'reused' if q['reused'] else 'computed'} "
                  f"({w.source.identity()}, {w.request.height}x{w.request.width}x{w.request.frames})")
        return {"model": w.source.identity(), "request": w.request.to_dict(), "key": q["key"],
                "noise_floor": q["noise_floor"], "geometry": self.spec.quality.geometry}

    def wait_baseline_files(self, timeout: float | None = None) -> bool:
        """Block until the baseline's MP4 (written in the background) is on disk; False on timeout."""
        if self.quality_worker is not None and not self.quality_worker.wait_baseline_files(timeout):
            return False
        return self.baseline.wait_files(timeout) if self.baseline is not None else True

    def _quality_on_model(self, knobs: Setting, record: dict[str, Any],
                          qrec: dict[str, Any] | None = None) -> dict[str, Any]:
        """Replace ``record``'s quality with the quality model's at ``knobs`` mapped to it (``transfer_setting``);
        this model's own numbers stay as ``latency_model_quality``. The parallelism family is left out there:
        it changes how the work is spread, not what is computed (its own numerics are measured here).
        ``qrec``: the quality model's record when the screen already has it."""
        t0 = time.time()
        mapped, notes = quality_setting(knobs, self.spec.quality)
        if qrec is None:
            qrec = self.quality_worker.evaluate(mapped, scoped=True, repeats=1)
        unmeasured = unmeasured_on_quality_model(knobs, mapped, self.request, self.quality_worker.request)
        where = {"model": self.quality_worker.source.identity(),
                 "request": {k: getattr(self.quality_worker.request, k) for k in ("height", "width", "frames", "seed")},
                 "knobs": mapped, "mapping": notes + unmeasured, "unmeasured": unmeasured}
        if qrec["status"] != Status.OK:
            return {**record, "status": Status.FAIL, "reason": qrec["reason"], "quality_from": where,
                    "message": f"on the quality model {where['model']}: {qrec['message']}"}
        out = {**record, "latency_model_quality": record.get("quality"), "quality": qrec["quality"], "quality_from": where}
        t = dict(out.get("timing") or {})
        if t.get("wall_s"):  # the quality model's evaluation is this trial's overhead too: where it ran in its own
            # process during the warm-up, only what the trial waited for it (already in ``waited_s``) and this call
            spent = time.time() - t0
            t["quality_model_s"] = round(qrec.get("wall_s", spent), 3)
            t["quality_model_concurrent"] = isinstance(self.quality_worker, QualityProcess)
            t["wall_s"] = round(t["wall_s"] + spent, 3)
            t["framework_s"] = round(t["framework_s"] + spent, 3)
            t["framework_fraction"] = round(t["framework_s"] / t["wall_s"], 4)
            out["timing"] = t
        return out

    def _load_baseline(self):
        if self.baseline is None:
            from vidtune.search.baseline import baseline_key, load_baseline

            key = baseline_key(self.source, self.request, self.pipeline)
            self.baseline = load_baseline(Path(self.spec.baseline_dir), key, self.pipeline.device)
            if self.baseline is None:
                raise RuntimeError(f"no baseline with key {key[:12]} in {self.spec.baseline_dir}")
        return self.baseline

    def close(self) -> None:
        """Wait for the baseline's files (a process that ends must not leave them half-written);
        ``ParallelTrialWorker`` stops its helper ranks here too, and a ``QualityProcess`` ends."""
        self.wait_baseline_files()
        if isinstance(self.quality_worker, QualityProcess):
            self.quality_worker.close()

    def evaluate(self, knobs: SettingLike, scoped: bool = True, repeats: int | None = None,
                 screen: Any = None, front: list[tuple[float, float]] | None = None) -> dict[str, Any]:
        """Evaluate a setting; returns a JSON-able record with ``status`` ok or fail (+ reason).

        ``screen``: a gate (``Gate`` or ``AnyTier``); when the quality (the quality model's, else this model's on
        the warm-up's output) fails it after the warm-up, the timed runs are left out (``screened`` in the
        record; paired evaluations only). Why: in h100-19b-1536g three of six trials failed the gate, each after
        ~55 s of timed pairs of a 1536x1024 generation, where the quality model had its answer in 1-4 s.

        ``front``: the (total ms, PSNR dB) of the settings its family has measured faster than the baseline; given,
        a paired evaluation stops after its first pair when that pair shows it cannot join them (``pair_pruner``)."""
        from vidtune.search.evaluator import evaluate, evaluate_paired
        from vidtune.search.latency_model import estimator
        from vidtune.search.progress import warming_up

        t0, held = time.time(), None
        try:
            knobs = Setting.of(knobs)  # (validated once: the evaluator and the quality model take it as it is)
            held = before_run(self.pipeline.device, knobs)
            inject_fault()
            base = self._load_baseline()
            n = repeats or self.spec.repeats
            before = None
            if isinstance(self.quality_worker, QualityProcess):  # its run overlaps this one's warm-up
                if not self.quality_worker.alive():  # (it died in an earlier trial, recorded there)
                    import torch

                    self.quality_worker = QualityProcess(self._quality_spec, TrialWorker, threads=torch.get_num_threads())
                self.quality_worker.submit(quality_setting(knobs, self.spec.quality)[0], True, 1)
                before = self.quality_worker.wait
            screened: dict[str, Any] = {}  # the quality model's record, once the screen has asked for it
            with warming_up(self._say, f"evaluating {', '.join(sorted(knobs)) or 'no knob'}", base, [knobs]) as beat:
                if self.spec.paired:
                    ev = evaluate_paired(self.pipeline, self.request, knobs, baseline=base, repeats=n,
                                         max_repeats=max(n, self.spec.max_repeats), tolerance=self.spec.ratio_tolerance,
                                         warmup=self.spec.warmup, scoped=scoped, flip_frames=self.flip_frames,
                                         before_timing=before, on_stage=beat.stage,
                                         estimate=estimator(self.pipeline, self.request, knobs, base, self._passes,
                                                            prune=self.spec.estimate in (True, "trust"),
                                                            trust=self.spec.estimate == "trust")
                                         if (self.spec.estimate and front is not None) else None,
                                         prune=None if front is None else pair_pruner(
                                             front, base, self.spec.ratio_tolerance,
                                             lambda: (screened.get("quality") or {}).get("psnr_db")),
                                         screen=None if screen is None else lambda out: self._screen(screen, knobs,
                                                                                                     out, screened))
                else:
                    ev = evaluate(self.pipeline, self.request, knobs, baseline=base, repeats=n, warmup=self.spec.warmup,
                                  scoped=scoped, flip_frames=self.flip_frames, before_timing=before, on_stage=beat.stage)
            record = ev.record()
            record.update(status=Status.OK, wall_s=time.time() - t0)
            if self.quality_worker is not None:
                record = self._quality_on_model(knobs, record, screened.get("qrec"))
                record["wall_s"] = time.time() - t0
            if record.get("quality") is not None:  # (this model's peak, whichever model gave the quality: the
                # gate reads one mapping, and gate.peak_memory_gb is a ceiling on it)
                record["quality"] = {**record["quality"], "peak_memory_gb": record["peak_memory_bytes"] / 2**30}
            return record
        except Exception as exc:  # recorded, never raised: the campaign goes on
            kind, message = failure_reason(exc)
            failed = {"status": Status.FAIL, "reason": kind, "message": message, "knobs": knobs, "wall_s": time.time() - t0,
                      "traceback": traceback.format_exc()[-3000:]}
            if kind == Reason.OOM and held is not None:  # (what later campaigns weigh it by: search/knowledge.py)
                failed["memory"] = {"cap_gib": self.memory_cap_gib, "held_before_gib": round(held / 2**30, 3)}
        # (here, the exception's frames and what they held are gone): the driver replaces a process left full
        stuck = release_after_failure(self.pipeline.device, held)
        return {**failed, "replace_worker": stuck} if stuck else failed

    def _screen(self, gate: Any, knobs: Setting, out: Any, screened: dict[str, Any]) -> str | None:
        """Why ``knobs`` need not be timed (None: time it): its quality fails ``gate``. The quality model's
        record is kept in ``screened`` for the trial's record. Peak memory is not screened (it is measured
        over the timed runs too, and a ceiling on it is rare): the quality alone decides."""
        from vidtune.search.metrics import quality

        if self.quality_worker is not None:
            qrec = self.quality_worker.evaluate(quality_setting(knobs, self.spec.quality)[0], True, 1)
            screened["qrec"] = qrec
            if qrec.get("status") != Status.OK:
                return f"the quality model's run failed ({qrec.get('reason')})"
            q, where = qrec["quality"], f"on the quality model {self.quality_worker.source.identity()}"
        else:
            base = self._load_baseline()
            q = quality(base.frames, base.audio, out.frames, out.audio, self.pipeline.device, self.flip_frames,
                        fps=self.request.fps, sample_rate=out.sample_rate).to_dict()
            where = "on this model"
        q = screened["quality"] = {**q, "peak_memory_gb": 0.0}
        return None if gate.passes(q) else f"below the gate {where}: {gate.shortfall(q)}"

    def bench(self, knobs: SettingLike, repeats: int, out_dir: str | None = None,
              rewarm: bool = True, reference: str = "stored",
              others: dict[str, SettingLike] | None = None, out_dirs: dict[str, str] | None = None) -> dict[str, Any]:
        """Baseline and setting alternated in both orders (A B, B A, A B, ...), one full run each, after the
        setting's warm-up (a compile, an autotune) and one run of each after it, so that no recompile lands
        in a timed run; ratio of median totals, and per stage.

        ``others`` (name -> knobs): more settings in the same process, each warmed up the same way, all
        alternated with one baseline: A B C ..., ... C B A, A B C ...; each setting's ratio is against the
        same baseline runs (``others`` in the result: speed-up, totals, stages, quality, stats). On a large
        model this saves the baseline's runs of a second bench (a multistep 19B generation is over a minute).

        ``rewarm=False`` leaves out that untimed pair (two whole generations: at 3840x2176 about 140 s on
        the H200); the graphs Dynamo compiled during the timed runs are counted either way
        (``graphs_compiled_while_timed``: not 0 means a timed run paid a compile).
        With ``out_dir``, the tuned run's video (MP4) and raw frames/audio (safetensors) are written there;
        ``out_dirs`` (a name of ``others`` -> folder) the same for the other settings.

        ``reference="run"``: an untimed baseline run of this process, kept in memory, is the quality reference
        instead of a stored baseline (which costs ``eval.repeats`` + 1 generations and its files: at 3840x2176x121
        on the H200 2 x ~115 s and 3 GB; the bench's own baseline runs time the ratio either way).
        """
        import statistics

        from torch._dynamo.utils import counters

        from vidtune.search.evaluator import evaluate
        from vidtune.search.progress import warming_up

        inject_fault("bench" if knobs else "bench-of-the-baseline")
        others = dict(others or {})
        if "B" in others or "A" in others:
            raise ValueError("bench: the other settings' names must not be A or B (the baseline and the setting)")
        settings = {name: Setting.of(k) for name, k in {"B": knobs, **others}.items()}  # (validated once)
        before_run(self.pipeline.device, {t for k in settings.values() for t in k})  # (what other settings kept: freed)
        base = self._reference_run() if reference == "run" else self._load_baseline()
        totals: dict[str, list[float]] = {name: [] for name in ("A", *settings)}
        stage_ms: dict[str, list[dict[str, float]]] = {name: [] for name in ("A", *settings)}
        last: dict[str, Any] = {}
        t0 = time.time()
        # (quality only where it is read: FLIP, on the host, only for the last setting run)
        warms = {}
        with warming_up(self._say, "bench: warming up", base, settings.values()) as beat:
            for name, k in settings.items():
                beat.what(f"bench: warming up {'the setting' if name == 'B' else name}")
                warms[name] = evaluate(self.pipeline, self.request, k, baseline=base, repeats=1, warmup=self.spec.warmup,
                                       scoped=False, flip_frames=0, on_stage=beat.stage)
            if rewarm:
                # one more untimed run of each: re-applying a setting after the baseline ran must not recompile
                # in a timed run (compile keeps its graphs for the same block signature)
                beat.what("bench: the untimed run of the baseline and each setting after the warm-up")
                evaluate(self.pipeline, self.request, {}, baseline=None, repeats=1, warmup=0, scoped=False,
                         on_stage=beat.stage)
                for k in settings.values():
                    evaluate(self.pipeline, self.request, k, baseline=base, repeats=1, warmup=0, scoped=False,
                             flip_frames=0, on_stage=beat.stage)
        warm = warms["B"]
        warmup_s = time.time() - t0
        self._say(f"bench: setting{'s' if others else ''} warmed up in {warmup_s:.1f} s (its first run: " + ", ".join(
            f"{stage} {ms / 1000:.1f} s" for stage, ms in warm.timing["first_run_ms"].items()) + ")")
        graphs_before = counters["stats"]["unique_graphs"]

        def run(which: str, final: bool) -> Any:
            ev = evaluate(self.pipeline, self.request, settings.get(which, {}), baseline=base, repeats=1,
                          warmup=0, scoped=False, flip_frames=self.flip_frames if final else 0)
            totals[which].append(ev.total_ms)
            stage_ms[which].append({s: v["median_ms"] for s, v in ev.latency.items()})
            last[which] = ev
            return ev

        names = list(settings)
        for i, order in enumerate(alternating(["A", *names], repeats)):
            got = {w: run(w, i == repeats - 1 and w != "A") for w in order}
            self._say(f"bench: repeat {i + 1}/{repeats} ({' '.join(order)}): baseline {got['A'].total_ms:.1f} ms, "
                      + ", ".join(f"{'setting' if w == 'B' else w} {got[w].total_ms:.1f} ms" for w in names))
        compiled_while_timed = counters["stats"]["unique_graphs"] - graphs_before
        if compiled_while_timed:
            self._say(f"bench: warning: {compiled_while_timed} graph(s) compiled during the timed runs")

        def quality_of(name: str) -> dict[str, Any]:
            q = {"quality": last[name].quality.to_dict()}
            if self.quality_worker is not None:
                got = self._quality_on_model(settings[name], q)
                if got.get("status") == Status.FAIL:
                    raise RuntimeError(f"bench: {got['message']}")
                q = {k: got[k] for k in ("quality", "latency_model_quality", "quality_from")}
            return q

        from vidtune.model.media import write_mp4, write_raw

        for name, folder in {**({"B": out_dir} if out_dir else {}), **(out_dirs or {})}.items():
            out = last[name].output
            write_raw(Path(folder) / "output.safetensors", out.frames, out.audio, out.sample_rate, self.request.fps)
            write_mp4(Path(folder) / "video.mp4", out.frames, self.request.fps, out.audio, out.sample_rate)
        a_median = statistics.median(totals["A"])
        return {
            **quality_of("B"),
            "baseline_total_ms": totals["A"], "tuned_total_ms": totals["B"],
            "speedup": a_median / statistics.median(totals["B"]),
            "baseline_latency": last["A"].latency, "tuned_latency": last["B"].latency,
            "stages": stage_split(stage_ms["A"], stage_ms["B"]),
            "order": "A B, B A, ... (A: baseline, B: setting)" if not others else
                     f"A {' '.join(names)}, {' '.join(reversed(names))} A, ... (A: baseline, B: setting)",
            "warmup_s": round(warmup_s, 1), "warmup": warm.timing, "rewarm": rewarm, "graphs_compiled_while_timed": compiled_while_timed,
            "stats": last["B"].stats, "reference": reference,
            "others": {name: {"knobs": settings[name], "speedup": a_median / statistics.median(totals[name]),
                              "tuned_total_ms": totals[name], "tuned_latency": last[name].latency,
                              "stages": stage_split(stage_ms["A"], stage_ms[name]), "stats": last[name].stats,
                              "warmup": warms[name].timing, **quality_of(name)} for name in others},
        }

    def clip_quality(self, knobs: SettingLike, change: dict[str, Any]) -> dict[str, Any]:
        """``knobs`` on this worker's request with ``change`` (another seed or prompt; search/verdict.py)."""
        from vidtune.search.verdict import clip_quality

        return clip_quality(self, Setting.of(knobs), change)

    def verdict(self, knobs: SettingLike, clips: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``knobs``' quality on each of ``clips``, on the quality model when there is one (search/verdict.py)."""
        from vidtune.search.verdict import measure_clips

        return measure_clips(self, knobs, clips)

    def _reference_run(self):
        """An untimed all-off run of this process as the quality reference (``bench(reference="run")``)."""
        from vidtune.search.baseline import Baseline, StoredStages, baseline_key
        from vidtune.search.evaluator import evaluate

        t0 = time.time()
        ev = evaluate(self.pipeline, self.request, {}, repeats=1, warmup=0, scoped=False)
        out = ev.output
        self._say(f"bench: the reference (an untimed baseline run, kept in memory) in {time.time() - t0:.1f} s")
        key = baseline_key(self.source, self.request, self.pipeline)
        return Baseline(key, Path(self.spec.baseline_dir), out.frames, out.audio, out.sample_rate,
                        StoredStages.from_output(out), ev.latency, {"reference": "run", "key": key})
