"""Tier verdicts that hold beyond one clip: a setting's quality on a grid of seeds and prompts.

A campaign measures every trial's quality on one clip (its request's seed and prompt, on the quality model).
One clip is not enough for a verdict: the same exact-ish knobs (FP8 on every linear, compile, 768 px VAE tiles)
read ``balanced`` on ltx2-mini at 512x768x33 (worst temporal PSNR 37.5 dB) and ``lossless`` at 448x768x33
(worst frame 43.8 dB). So before a tier's setting is exported, it is measured on more clips (``verdict.seeds``
and ``verdict.prompts``: the grid of the campaign's seed and prompt and these, the campaign's own clip
included), each against a baseline of that clip, and the tier takes the worst value of every metric over
them (``worst``); the spread is recorded with it.

The worker side (``clip_quality``) runs where the quality is measured: the quality model's worker, or the
campaign's own when it has none. The driver side is ``vidtune/verdicts.py``.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from vidtune.search.records import Reason, Status, failure_reason
from vidtune.search.spec import CampaignSpec, Gate

__all__ = ["clip_grid", "check_verdict_config", "clip_quality", "measure_clips", "worst", "spread"]


def check_verdict_config(config: Mapping[str, Any] | None, request: Mapping[str, Any]
                         ) -> tuple[tuple[dict[str, Any], ...], int]:
    """The ``verdict`` config (``seeds``, ``prompts``, ``candidates``) validated against the request whose clip is
    the campaign's own (the quality model's, or the campaign's): the clips (``clip_grid``) and how many of a tier's
    candidates may be tried. ``ValueError`` naming the field and the values it takes."""
    config = dict(config or {})
    unknown = sorted(set(config) - {"seeds", "prompts", "candidates"})
    if unknown:
        raise ValueError(f"verdict: unknown field(s) {unknown}; it takes seeds, prompts, candidates")
    seeds = [] if config.get("seeds") is None else config["seeds"]
    prompts = [] if config.get("prompts") is None else config["prompts"]
    candidates = config.get("candidates", CampaignSpec.verdict_candidates)
    if isinstance(candidates, bool) or not isinstance(candidates, int) or not 1 <= candidates <= 100:
        raise ValueError(f"verdict.candidates must be an integer in [1, 100], got {candidates!r}")
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence):
        raise ValueError(f"verdict.seeds must be a list of integers in [0, 2**31), got {seeds!r}")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2**31:
            raise ValueError(f"verdict.seeds must be a list of integers in [0, 2**31), got {list(seeds)!r}")
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise ValueError(f"verdict.prompts must be a list of prompts (non-empty strings), got {prompts!r}")
    for p in prompts:
        if not isinstance(p, str) or not p.strip() or len(p) > 2000:
            raise ValueError(f"verdict.prompts must be a list of non-empty strings of at most 2000 characters, "
                             f"got {p!r}")
    return tuple(clip_grid(request, seeds, prompts)), candidates


def clip_grid(request: Mapping[str, Any], seeds: Iterable[int], prompts: Iterable[str]) -> list[dict[str, Any]]:
    """The clips a verdict is measured on besides the request's own: every (seed, prompt) of the request's seed
    and prompt and ``seeds`` x ``prompts``, as request changes (``{"seed": 1}``, ``{"prompt": ...}``, or both),
    the request's own clip left out. A request given by a prompt embedding keeps it: other prompts are left out."""
    all_seeds = list(dict.fromkeys([request["seed"], *seeds]))
    all_prompts = [request["prompt"]] if request.get("prompt_embedding") else list(
        dict.fromkeys([request["prompt"], *prompts]))
    clips = []
    for seed in all_seeds:
        for prompt in all_prompts:
            change = {k: v for k, v in (("seed", seed), ("prompt", prompt)) if v != request[k]}
            if change:
                clips.append(change)
    return clips


def _clip_directory(baseline_dir: str, request: Any) -> Path:
    """One stored baseline per clip, beside the campaign's (or the quality model's) own."""
    tag = hashlib.sha256(f"{request.seed}\0{request.prompt}".encode()).hexdigest()[:12]
    return Path(baseline_dir) / "clips" / f"seed{request.seed}-{tag}"


def clip_quality(worker: Any, knobs: Any, change: Mapping[str, Any]) -> dict[str, Any]:
    """``knobs`` (already mapped to ``worker``'s model) on ``worker``'s request with ``change`` (seed, prompt):
    its quality against that clip's baseline (run once and stored, then reused). One untimed generation each:
    no latency is read here. Returns the status and the quality, or a failed status with its reason and message."""
    from vidtune.search.evaluator import ensure_baseline, evaluate

    request = replace(worker.request, **dict(change))
    try:
        base, _ = ensure_baseline(worker.pipeline, request, worker.source,
                                  _clip_directory(worker.spec.baseline_dir, request), repeats=1, warmup=0,
                                  noise_floor=False, mp4=False, flip_frames=worker.flip_frames)
        ev = evaluate(worker.pipeline, request, knobs, baseline=base, repeats=1, warmup=0,
                      flip_frames=worker.flip_frames)
    except Exception as exc:  # recorded: the verdict says the clip failed, the campaign goes on
        reason, message = failure_reason(exc)
        return {"status": Status.FAIL, "reason": reason, "message": message}
    return {"status": Status.OK, "quality": ev.quality.to_dict() if ev.quality else None}


def measure_clips(worker: Any, knobs: Any, clips: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``knobs`` on each of ``clips`` where ``worker`` measures quality: its quality model's worker (the setting
    mapped to that model, as for a trial), else ``worker`` itself. One record per clip: the change and
    ``clip_quality``'s answer (a failed call is that clip's failure, not raised)."""
    from vidtune.search.quality_model import quality_setting
    from vidtune.techniques.setting import Setting

    knobs = Setting.of(knobs)
    target = worker.quality_worker if worker.quality_worker is not None else worker
    mapped = quality_setting(knobs, worker.spec.quality)[0] if worker.quality_worker is not None else knobs
    out = []
    for change in clips:
        try:
            got = target.clip_quality(mapped, dict(change))
        except Exception as exc:  # (the quality model's process ended: QualityProcessError)
            got = {"status": Status.FAIL, "reason": Reason.ERROR, "message": f"{type(exc).__name__}: {exc}"}
        out.append({"change": dict(change), **got})
    return out


def worst(qualities: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Every gated metric at its worst over ``qualities``: the lowest of a floor (PSNR, SSIM, ...), the highest
    of a ceiling (FLIP, ...), the largest in size of a signed one (the audio-video offset). A metric one clip
    lacks is missing in the result (a gate then fails it: not shown to pass on every clip)."""
    out: dict[str, Any] = {}
    keys = set().union(*(q.keys() for q in qualities)) if qualities else set()
    for key in keys:
        values = [q.get(key) for q in qualities]
        if any(v is None for v in values) or not all(isinstance(v, (int, float)) for v in values):
            continue
        if key in Gate.ABSOLUTE:
            out[key] = max(values, key=abs)
        elif key in Gate.CEILINGS:
            out[key] = max(values)
        else:  # floors, and the informative metrics (higher is better for every one vidtune measures)
            out[key] = min(values)
    return out


def spread(qualities: Sequence[Mapping[str, Any]], keys: Sequence[str] = ("psnr_db", "psnr_db_worst", "ssim",
                                                                           "flip_worst", "temporal_psnr_db_worst")
           ) -> dict[str, list[float]]:
    """[lowest, highest] of each of ``keys`` over the clips that have it (for the report)."""
    out = {}
    for key in keys:
        values = [q[key] for q in qualities if isinstance(q.get(key), (int, float))]
        if values:
            out[key] = [min(values), max(values)]
    return out
