"""Run the pipeline from any stage, taking earlier stages' outputs from storage, timing each stage."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import safetensors.torch
import torch

from vidtune.model.generation import STAGES, GenerationOutput, StageLatents
from vidtune.model.request import GenerationRequest
from vidtune.search.timing import StageTimer

if TYPE_CHECKING:
    from vidtune.model.pipeline import ReferencePipeline  # (annotations: the pipeline module imports ltx-pipelines)

__all__ = ["StoredStages", "NonFiniteOutput", "run_from"]


class NonFiniteOutput(RuntimeError):
    """A stage produced NaN or inf (a failed trial, recorded with this reason)."""


@dataclass
class StoredStages:
    """Every stage boundary of one run, enough to restart at any stage."""

    stage1_video: torch.Tensor
    stage1_audio: torch.Tensor
    stage1_rng: torch.Tensor
    upsampled: torch.Tensor
    stage2_video: torch.Tensor
    stage2_audio: torch.Tensor
    stage2_rng: torch.Tensor

    @classmethod
    def from_output(cls, out: GenerationOutput) -> "StoredStages":
        return cls(out.stage1.video, out.stage1.audio, out.stage1.rng_state, out.upsampled,
                   out.stage2.video, out.stage2.audio, out.stage2.rng_state)

    def save(self, path: Path) -> None:
        safetensors.torch.save_file({f.name: getattr(self, f.name).contiguous().cpu() for f in fields(self)}, str(path))

    @classmethod
    def load(cls, path: Path, device: torch.device) -> "StoredStages":
        t = safetensors.torch.load_file(str(path))
        # generator states stay on the CPU (torch.Generator.set_state takes a CPU ByteTensor)
        return cls(**{k: (v if k.endswith("_rng") else v.to(device)) for k, v in t.items()})


def _check_finite(stage: str, *tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise NonFiniteOutput(f"{stage} produced non-finite values (NaN/inf)")


def run_from(pipeline: ReferencePipeline, request: GenerationRequest, start: str,
             stored: StoredStages | None,
             on_stage: Callable[[str], None] | None = None) -> tuple[GenerationOutput, dict[str, float]]:
    """Run ``start`` and every later stage; earlier stage outputs come from ``stored``. ``on_stage`` is called
    with each stage's name as it starts (``search.progress.Heartbeat``).

    Returns the output (its frames on the pipeline's device) and the elapsed milliseconds of each stage
    that ran.
    """
    if start not in STAGES:
        raise ValueError(f"start stage must be one of {list(STAGES)}, got {start!r}")
    first = STAGES.index(start)
    if first > 0 and stored is None:
        raise ValueError(f"starting at {start} needs the stored outputs of the stages before it")
    pipeline.reset_stats()
    times: dict[str, float] = {}
    timer = StageTimer(pipeline.device, memory=True)
    peaks: dict[str, int] = {}
    started = on_stage if on_stage is not None else (lambda name: None)
    ctx = pipeline.encode_prompt(request) if first <= STAGES.index("stage2") else None

    s1 = StageLatents(stored.stage1_video, stored.stage1_audio, stored.stage1_rng) if first > 0 else None
    if first <= 0:
        started("stage1")
        with timer:
            s1 = pipeline.stage1(request, ctx)
        times["stage1"] = timer.elapsed_ms
        peaks["stage1"] = timer.peak_bytes
        _check_finite("stage1", s1.video, s1.audio)
    up = stored.upsampled if first > 1 else None
    if first <= 1:
        started("upsample")
        with timer:
            up = pipeline.upsample(s1.video)
        times["upsample"] = timer.elapsed_ms
        peaks["upsample"] = timer.peak_bytes
        _check_finite("upsample", up)
    s2 = StageLatents(stored.stage2_video, stored.stage2_audio, stored.stage2_rng) if first > 2 else None
    if first <= 2:
        started("stage2")
        with timer:
            s2 = pipeline.stage2(request, up, s1.audio, s1.rng_state, ctx)
        times["stage2"] = timer.elapsed_ms
        peaks["stage2"] = timer.peak_bytes
        _check_finite("stage2", s2.video, s2.audio)
    started("decode_video")
    with timer:
        frames = pipeline.decode_video(s2.video, s2.rng_state)
    times["decode_video"] = timer.elapsed_ms
    peaks["decode_video"] = timer.peak_bytes
    started("decode_audio")
    with timer:
        audio, sr = pipeline.decode_audio(s2.audio)
    times["decode_audio"] = timer.elapsed_ms
    peaks["decode_audio"] = timer.peak_bytes
    _check_finite("decode_audio", audio)
    if any(math.isnan(t) for t in times.values()):
        raise RuntimeError("a stage timer did not run")
    # the frames stay where the decode made them (the quality metrics run there; a copy to the host of a
    # 4K video is 3 GB); the audio is small and goes to the host
    pipeline.records["peak_memory_bytes"] = peaks  # per stage run (StageTimer: CUDA allocated, or the CPU's RSS)
    out = GenerationOutput(frames=frames, audio=audio.cpu(), sample_rate=sr, stage1=s1, upsampled=up, stage2=s2,
                           stats=pipeline.run_stats())
    return out, times
