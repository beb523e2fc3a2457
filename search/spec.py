"""A campaign's spec: its settings, quality gate and tiers, and their file (``campaign_spec.json``)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from vidtune.search.errors import SearchSpaceError, StorageError

__all__ = ["Gate", "AnyTier", "CampaignSpec", "spec_summary", "save_spec", "load_spec", "check_resumed_quality"]


@dataclass(frozen=True)
class Gate:
    """Quality floors and ceilings a setting must meet (against the baseline of the same request and seed);
    a field set to None is not gated."""

    psnr_db: float | None = 35.0
    ssim: float | None = 0.95
    audio_snr_db: float | None = 10.0
    # off by default; search/metrics.py says what each measures, results/calibration/ which follow a degradation
    psnr_db_worst: float | None = None  # floor on the worst frame's PSNR
    temporal_psnr_db: float | None = None  # floor on the mean PSNR of the frame-to-frame change
    temporal_psnr_db_worst: float | None = None
    flip: float | None = None  # ceiling on the mean FLIP of the sampled frames (0 same .. 1)
    flip_worst: float | None = None
    audio_spectral_db: float | None = None  # ceiling on the audio's mean log-spectral difference
    audio_spectral_snr_db: float | None = None  # floor on the SNR of the audio's STFT magnitudes
    av_offset_ms: float | None = None  # ceiling on |audio-video offset| against the baseline's, ms
    peak_memory_gb: float | None = None  # ceiling on the setting's peak memory (GiB; evaluator.PeakMemory)

    FLOORS = ("psnr_db", "ssim", "audio_snr_db", "psnr_db_worst", "temporal_psnr_db", "temporal_psnr_db_worst",
              "audio_spectral_snr_db")
    CEILINGS = ("flip", "flip_worst", "audio_spectral_db", "av_offset_ms", "peak_memory_gb")
    ABSOLUTE = ("av_offset_ms",)  # signed metrics whose size is the error (gated, and calibrated, as |value|)

    def constraints(self, quality: dict[str, float]) -> list[float]:
        """Optuna constraints: <= 0 means the floor (or ceiling) is met; one per field set, in the order of
        FLOORS then CEILINGS (the first three as campaigns have always stored them). A gated metric the
        record lacks (measured before it existed, or FLIP left out with eval.flip_frames=0) fails its
        constraint: it was not shown to pass."""
        out = []
        for key in self.FLOORS + self.CEILINGS:
            limit = getattr(self, key)
            if limit is None:
                continue
            value = quality.get(key)
            if value is None:
                out.append(1e6)
            elif key in self.ABSOLUTE:
                out.append(abs(value) - limit)
            else:
                out.append(limit - value if key in self.FLOORS else value - limit)
        return out

    def passes(self, quality: dict[str, float]) -> bool:
        return all(c <= 0 for c in self.constraints(quality))

    def shortfall(self, quality: dict[str, float]) -> str:
        """The fields ``quality`` fails, with their values and limits (empty when it passes)."""
        failed = []
        for key, c in zip([k for k in self.FLOORS + self.CEILINGS if getattr(self, k) is not None],
                          self.constraints(quality)):
            if c > 0:
                value = quality.get(key)
                sign = ">=" if key in self.FLOORS else "<="
                failed.append(f"{key} {'missing' if value is None else format(value, '.4g')} (needs {sign} "
                              f"{getattr(self, key):g})")
        return ", ".join(failed)


@dataclass(frozen=True)
class AnyTier:
    """The families' gate when a campaign exports quality tiers: feasible when some tier's gate passes (one
    constraint, the smallest over the tiers of each tier's largest), so that each tier's integrator finds
    its candidates among the survivors."""

    tiers: tuple[tuple[str, Gate], ...]

    def constraints(self, quality: dict[str, float]) -> list[float]:
        return [min(max(g.constraints(quality), default=-1.0) for _, g in self.tiers)]

    def passes(self, quality: dict[str, float]) -> bool:
        return self.constraints(quality)[0] <= 0

    def shortfall(self, quality: dict[str, float]) -> str:
        """Empty when some tier passes; else what the loosest tier's gate fails."""
        if self.passes(quality):
            return ""
        name, gate = self.tiers[-1]
        return f"no tier passes; {name}: {gate.shortfall(quality)}"


@dataclass(frozen=True)
class CampaignSpec:
    """A campaign's settings (from Hydra's ``campaign`` config group and the eval/model/request groups)."""

    name: str
    results_dir: str
    families: tuple[str, ...]
    trials_per_family: int
    gate: Gate
    trial_timeout_s: float = 900.0
    time_budget_s: float | None = None  # the measuring phases' time ceiling, summed over resumes (budget.minutes)
    run_limit_s: float | None = None  # this one run's wall-time ceiling (budget.run_minutes): it pauses, resumable
    storage: str | None = None  # None: results/<name>/optuna.journal; else an RDB URL
    ray_address: str | None = None  # None: a local Ray bound to 127.0.0.1
    num_actors: int = 0  # 0: one per GPU (per ``ranks_per_actor`` GPUs), or one on the CPU
    ranks_per_actor: int = 1  # >1: each actor owns that many ranks (parallelism family), see parallel_worker
    seed: int = 0
    integrator_max_exhaustive: int = 64
    integrator_trials: int = 16
    integrator_merge: bool = True  # a family's candidates include merges of two of its survivors (integrator/combine.py)
    final_repeats: int = 5
    integrator_max_p: float = 0.05  # the tuned combination must beat the baseline at this significance
    worker: Any = None  # the workers' WorkerSpec (search/worker.py; a mapping of its fields is converted)
    warm_start: tuple[str, ...] = ()  # earlier campaigns (same results_dir, model, device) whose best seed ours
    # settings queued first in the families' studies, each family its part: {"origin": a tuned config's path,
    # "knobs": its knobs mapped to this model and request, "notes": what the mapping changed} (seed_configs)
    seeds: tuple[dict[str, Any], ...] = ()
    catalogue: bool = True  # queue the shipped starting points first and skip known losers (search/catalogue.py)
    knowledge: bool = True  # reuse earlier campaigns of this model and GPU class under results_dir (search/knowledge.py)
    probes: bool = True  # each technique probed at its knobs' fast end, backed off, combined (search/probes.py)
    # a trial or combination whose quality fails the search gate after its warm-up run is not timed: its
    # interleaved pairs (most of a trial's wall time) would only measure a setting the gate rejects
    screen: bool = True
    # a paired family trial stops after its first pair when it cannot join its family's survivors (search/halving.py)
    prune: bool = True
    # quality tiers, strictest first: one tuned config each (tuned-<tier>.yaml); the families then search under
    # AnyTier and ``gate`` is not used. Empty: one tuned config under ``gate``
    tiers: tuple[tuple[str, Gate], ...] = ()
    # a tier's chosen setting is measured on these clips too (request changes: another seed or prompt) and
    # holds the tier only if the worst of each metric over them passes; else its next candidate is tried, up to
    # ``verdict_candidates`` (search/verdict.py)
    verdict_clips: tuple[dict[str, Any], ...] = ()
    # (6: a verdict costs a few untimed generations of the quality model, 1-6 s on an H100 for 3 clips; with 3,
    # campaign h100-19b-1536k spent them on three candidates sharing one failing step skip)
    verdict_candidates: int = 6

    def __post_init__(self) -> None:
        if isinstance(self.worker, Mapping):
            from vidtune.search.worker import WorkerSpec

            object.__setattr__(self, "worker", WorkerSpec(**self.worker) if self.worker else None)

    @property
    def search_gate(self) -> Gate | AnyTier:
        """The gate the families' studies and the combinations are measured against."""
        return AnyTier(self.tiers) if self.tiers else self.gate

    @property
    def directory(self) -> Path:
        return Path(self.results_dir) / self.name


def spec_summary(spec: CampaignSpec) -> dict[str, Any]:
    d = asdict(spec)
    if spec.worker is not None:  # (requests as their own to_dict writes them: the fields from_dict reads back)
        d["worker"]["request"] = spec.worker.request.to_dict()
        if spec.worker.quality is not None:
            d["worker"]["quality"]["request"] = spec.worker.quality.request.to_dict()
    d["gate"] = asdict(spec.gate)
    d["tiers"] = [[name, asdict(g)] for name, g in spec.tiers]
    return d


def save_spec(spec: CampaignSpec) -> Path:
    """Write ``campaign_spec.json`` so ``vidtune ask``/``tell``/``report`` can find the studies and gate."""
    from vidtune._io import atomic_write_text, strict_json

    path = spec.directory / "campaign_spec.json"
    atomic_write_text(path, strict_json(spec_summary(spec), indent=2))
    return path


def check_resumed_quality(spec: CampaignSpec) -> None:
    """Raise ``SearchSpaceError`` when a campaign folder's stored spec measured quality on another model or
    request than ``spec`` would (``quality_model.*``, or their ``auto`` values of another vidtune): its trials'
    numbers and the new ones would not compare. Names the stored values, to pass them explicitly."""
    path = spec.directory / "campaign_spec.json"
    if not path.is_file():
        return
    def where(q: dict[str, Any] | None) -> Any:
        if not q:
            return None
        r = q["request"]
        return {"model": q["source"].get("preset") or q["source"], "height": r["height"], "width": r["width"],
                "frames": r["frames"], "prompt": r["prompt"]}
    stored = where((_read_spec_json(path).get("worker") or {}).get("quality"))
    asked = where(json.loads(json.dumps(asdict(spec.worker.quality), default=list))
                  if spec.worker is not None and spec.worker.quality is not None else None)
    if stored != asked:
        how = ("quality_model.model=self" if stored is None else
               f"quality_model.model={stored['model']} quality_model.height={stored['height']} "
               f"quality_model.width={stored['width']} quality_model.frames={stored['frames']}")
        raise SearchSpaceError(f"campaign {spec.name!r} measured its trials' quality on {stored}; this run would measure "
                               f"it on {asked}, and the numbers would not compare. Resume with {how}, or start a new "
                               f"campaign (another name=)")


def load_spec(directory: Path) -> CampaignSpec:
    path = Path(directory) / "campaign_spec.json"
    if not path.is_file():
        raise ValueError(f"campaign {str(directory)!r} has no campaign_spec.json: run `vidtune campaign name=...` first")
    d = _read_spec_json(path)
    try:
        d["gate"] = Gate(**d["gate"])
        d["tiers"] = tuple((name, Gate(**g)) for name, g in d.get("tiers") or ())
        d["families"] = tuple(d["families"])
        d["warm_start"] = tuple(d.get("warm_start") or ())
        d["seeds"] = tuple(d.get("seeds") or ())
        d["verdict_clips"] = tuple(d.get("verdict_clips") or ())
        return CampaignSpec(**d)
    except (KeyError, TypeError, ValueError) as exc:
        raise StorageError(f"{path}: not a campaign spec vidtune can read ({type(exc).__name__}: {exc}); restore it from "
                           f"a backup, or run `vidtune campaign name=...` again with the campaign's settings") from None


def _read_spec_json(path: Path) -> dict[str, Any]:
    """``campaign_spec.json`` as a dict; ``StorageError`` naming the file when it is not one."""
    try:
        d = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise StorageError(f"{path}: cannot be read as a campaign spec ({exc}); restore it from a backup, or move it "
                           f"away and run `vidtune campaign name=...` again with the campaign's settings") from None
    if not isinstance(d, dict):
        raise StorageError(f"{path}: a campaign spec is a JSON object, this holds {type(d).__name__}")
    return d
