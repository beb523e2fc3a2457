"""What a generation is made of, apart from the pipeline that runs it: the stage names and each stage's steps,
the attention kinds, a transformer pass's context, the stages' latents and the output; the device helpers the
pipeline's stages share and the pass router that names each transformer pass."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from vidtune.model.request import GenerationRequest

__all__ = ["ATTENTION_KINDS", "STAGES", "GenerationOutput", "StageLatents", "StepContext", "default_vae_tiling",
           "stage_steps", "to_device_at_once", "rope_grids_on", "sync_if_cuda",
           "cpu_safe_cuda_sync", "read_once", "PassRouter"]


STAGES = ("stage1", "upsample", "stage2", "decode_video", "decode_audio")

# Attention kind -> attribute names of the ltx-core Attention modules in each BasicAVTransformerBlock.
ATTENTION_KINDS: dict[str, tuple[str, ...]] = {
    "video_self": ("attn1",),
    "audio_self": ("audio_attn1",),
    "text_cross": ("attn2", "audio_attn2"),
    "a2v": ("audio_to_video_attn",),  # video queries over audio keys
    "v2a": ("video_to_audio_attn",),  # audio queries over video keys
}

# len(DISTILLED_SIGMA_VALUES) - 1 and len(STAGE_2_DISTILLED_SIGMA_VALUES) - 1 of ltx_pipelines.utils.constants 1.0.0
DISTILLED_STAGE1_STEPS = 8
DISTILLED_STAGE2_STEPS = 3


def stage_steps(request: GenerationRequest) -> dict[str, int]:
    """Denoising steps of each stage for ``request``, known before any model is built (the search uses
    them to skip knob settings that cannot change anything, e.g. a cache whose warm-up covers a stage).
    The counts of ltx-pipelines' distilled schedules are written here, not imported: importing
    ``ltx_pipelines.utils.constants`` imports the whole package (transformers with it, 4 s), and the campaign's
    driver asks this of every sample (tests/test_pipeline.py checks the counts against the package's)."""
    if request.stage1_sigmas is not None:
        stage1 = len(request.stage1_sigmas) - 1
    elif request.mode == "distilled":
        stage1 = DISTILLED_STAGE1_STEPS
    else:
        stage1 = request.steps  # LTX2Scheduler: steps + 1 sigmas
    return {"stage1": stage1, "stage2": DISTILLED_STAGE2_STEPS}


def default_vae_tiling():
    """The official VAE tiling (``TilingConfig.default()``: 512 px tiles / 64 overlap, 64 frames / 24)."""
    from ltx_core.model.video_vae import TilingConfig

    return TilingConfig.default()


@dataclass(frozen=True)
class StepContext:
    """Where the pipeline is when a transformer pass runs; read by techniques (e.g. caches)."""

    stage: str
    step: int
    num_steps: int
    sigma: float
    pass_name: str = "cond"
    tile: int = 0
    num_tiles: int = 1
    grid: tuple[int, int, int] | None = None  # latent (frames, height, width) of the video tokens in this pass
    # the step's number over the pipeline's life: unlike (stage, step) it never repeats, so work saved in one
    # step (caching.stg_prefix's tokens) is never taken for another run's step of the same number
    serial: int = 0


@dataclass
class StageLatents:
    """Plain-tensor output of a denoising stage, plus the noise generator state that follows it."""

    video: torch.Tensor  # [B, 128, F, H, W] (unpatchified)
    audio: torch.Tensor  # [B, 8, T, 16]
    rng_state: torch.Tensor  # torch.Generator state after the stage's noise draws


@dataclass
class GenerationOutput:
    """Everything one request produces: final media and each stage's output."""

    frames: torch.Tensor  # uint8 [F, H, W, 3]
    audio: torch.Tensor  # float32 [channels, samples]
    sample_rate: int
    stage1: StageLatents | None = None
    upsampled: torch.Tensor | None = None
    stage2: StageLatents | None = None
    stats: dict[str, Any] = field(default_factory=dict)


def to_device_at_once(tensors: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Several small host tensors on ``device`` with one copy and no host synchronisation.

    A copy from pageable host memory synchronises the host with the GPU (``set_sync_debug_mode`` counts
    one per tensor); here the tensors go into one pinned buffer, copied without blocking (the pinned
    allocator keeps the buffer until the copy is done), and come back as views of the device copy.
    """
    if device.type != "cuda" or not tensors:
        return [t.to(device) for t in tensors]
    flat = torch.cat([t.reshape(-1) for t in tensors]).pin_memory().to(device, non_blocking=True)
    views = torch.split(flat, [t.numel() for t in tensors])
    return [v.view(t.shape) for v, t in zip(views, tensors)]


def sync_if_cuda(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def cpu_safe_cuda_sync() -> Iterator[None]:
    """ltx_pipelines calls ``torch.cuda.synchronize()`` unconditionally; make it a no-op without CUDA."""
    if torch.cuda.is_available():
        yield
        return
    original = torch.cuda.synchronize
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.cuda.synchronize = original  # type: ignore[assignment]


def read_once(tensors: list[torch.Tensor]) -> list[float]:
    """The values of one-element tensors, in order, with one device-to-host transfer per device."""
    if any(t.numel() != 1 for t in tensors):
        raise ValueError("recorders may hold only one-element tensors")
    read: dict[int, float] = {}
    for device in {t.device for t in tensors}:  # in practice one
        mine = [t for t in tensors if t.device == device]
        for t, value in zip(mine, torch.stack([t.detach().float().reshape(()) for t in mine]).tolist()):
            read[id(t)] = value
    return [read[id(t)] for t in tensors]


class PassRouter:
    """Stands in for the transformer inside the official denoising functions and names each pass.

    The official guidance code calls the transformer up to four times per step; which call is which
    follows from its arguments: no perturbation and the negative context -> ``uncond``; self-attention
    skipped -> ``stg``; audio-video cross-attention skipped -> ``modality``; else ``cond``.
    """

    def __init__(self, pipeline: Any, negative_video: torch.Tensor | None) -> None:
        self.pipeline = pipeline
        self.negative_video = negative_video

    def _name(self, video: Any, perturbations: Any) -> str:
        from ltx_core.guidance.perturbations import PerturbationType

        if perturbations is None:
            if self.negative_video is not None and video.context is self.negative_video:
                return "uncond"
            return "cond"
        types = {p.type for cfg in perturbations.perturbations for p in cfg.perturbations}
        if PerturbationType.SKIP_A2V_CROSS_ATTN in types or PerturbationType.SKIP_V2A_CROSS_ATTN in types:
            return "modality"
        return "stg"

    def __call__(self, video: Any, audio: Any, perturbations: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pipeline.run_pass(self._name(video, perturbations), video, audio, perturbations)


def rope_grids_on(device: torch.device) -> None:
    """ltx-core's RoPE frequency grids served from ``device``: bit for bit the same values, without the copy.

    ltx-core builds each grid once on the host (an ``lru_cache``) and copies it to the positions' device in
    every transformer pass, for video, audio and both cross-modal embeddings: each copy synchronises the host
    with the GPU, and stage-2 tiles multiply the passes (4 per step in 2 x 2 tiles). The grids of this
    process are kept, one copy per device, where its CUDA pipelines run; ``generate_freqs`` then moves a
    tensor already on its device (no copy). A pipeline on another device gets the same values copied back.
    """
    from ltx_core.model.transformer import transformer_args

    for name in ("generate_freq_grid_pytorch", "generate_freq_grid_np"):
        current = getattr(transformer_args, name)
        host = getattr(current, "vt_host", current)
        cache: dict[tuple, torch.Tensor] = getattr(current, "vt_cache", {})

        def on_device(theta: float, count: int, dim: int, _host=host, _cache=cache, _device=device) -> torch.Tensor:
            key = (theta, count, dim, str(_device))
            if key not in _cache:
                _cache[key] = _host(theta, count, dim).to(_device)
            return _cache[key]

        on_device.vt_host, on_device.vt_cache = host, cache
        setattr(transformer_args, name, on_device)
