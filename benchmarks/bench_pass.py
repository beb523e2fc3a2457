"""GPU benchmark: one stage-2 transformer pass of a preset per SDPA backend setting, interleaved.

    python -m vidtune.benchmarks.bench_pass --preset ltx2-19b --sizes 768x512x121 1536x1024x121 --out result.json

For each resolution it builds the stage-2 inputs exactly as the pipeline does (patchified latent,
positions from ltx-core's latent tools, a 1024-token stand-in context, sigma 0.909375) and times one
full transformer pass (X0Model forward) with CUDA events, after a warm-up pass, repeating the settings
interleaved (A B C A B C ...) so drift hits every setting alike. Also times the bare attention shapes
(video self-attention, audio queries over video keys) per backend. Writes one JSON file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from vidtune.kernels.sdpa import SDPA_BACKENDS, SDPAAttention
from vidtune.model.pipeline import ATTENTION_KINDS
from vidtune.model.presets import Preset, get_preset
from vidtune.model.text import standin_context
from vidtune.search.baseline import environment
from vidtune.search.timing import interleaved, summarise, time_call

# The math backend materialises the full score matrix: at 24,576 tokens x 32 heads that is 38.6 GB in
# bf16 per layer (plus the softmax copy) beside 38 GB of weights; it is only run where it fits.
MATH_MAX_TOKENS = 8192


def pass_inputs(preset: Preset, height: int, width: int, frames: int, fps: float, device: torch.device):
    from ltx_core.model.transformer import Modality
    from ltx_core.tools import AudioLatentTools, VideoLatentTools
    from ltx_core.types import AudioLatentShape, VideoLatentShape, VideoPixelShape
    from ltx_pipelines.utils.types import PipelineComponents

    comps = PipelineComponents(dtype=torch.bfloat16, device=device)
    shape = VideoPixelShape(batch=1, frames=frames, height=height, width=width, fps=fps)
    vshape = VideoLatentShape.from_pixel_shape(shape=shape, latent_channels=128, scale_factors=comps.video_scale_factors)
    vtools = VideoLatentTools(comps.video_patchifier, vshape, fps)
    atools = AudioLatentTools(comps.audio_patchifier, AudioLatentShape.from_video_pixel_shape(shape))
    g = torch.Generator(device=device).manual_seed(0)
    vstate = vtools.create_initial_state(device, torch.bfloat16, None)
    astate = atools.create_initial_state(device, torch.bfloat16, None)
    vlat = torch.randn(vstate.latent.shape, generator=g, device=device, dtype=torch.bfloat16)
    alat = torch.randn(astate.latent.shape, generator=g, device=device, dtype=torch.bfloat16)
    cfg = preset.config["transformer"]
    tokens = preset.extra.get("context_tokens", 64)
    if cfg.get("caption_proj_before_connector", False):
        vdim, adim = cfg["cross_attention_dim"], cfg["audio_cross_attention_dim"]
    else:  # the transformer projects raw caption features itself (LTX-2.0 19B layout)
        vdim = adim = cfg["caption_channels"]
    vctx = standin_context("bench", vdim, tokens, torch.bfloat16, device)
    actx = standin_context("bench", adim, tokens, torch.bfloat16, device)
    sigma = torch.tensor([0.909375], device=device)
    video = Modality(latent=vlat, sigma=sigma, timesteps=vstate.denoise_mask * sigma, positions=vstate.positions, context=vctx)
    audio = Modality(latent=alat, sigma=sigma, timesteps=astate.denoise_mask * sigma, positions=astate.positions, context=actx)
    return video, audio


def _set_backend(transformer: torch.nn.Module, backend: str | None, originals: dict) -> None:
    for block in transformer.velocity_model.transformer_blocks:
        for attrs in ATTENTION_KINDS.values():
            for attr in attrs:
                module = getattr(block, attr)
                originals.setdefault(id(module), module.attention_function)
                module.attention_function = originals[id(module)] if backend is None else SDPAAttention(backend)


def bench_attention(device: torch.device, repeats: int) -> dict[str, Any]:
    """Bare attention shapes of a 1536x1024x121 stage-2 pass, per backend."""
    out: dict[str, Any] = {}
    shapes = {
        "video_self_24576x24576_h32d128": (24576, 24576, 32, 128),
        "v2a_audio_q126_over_video_k24576_h32d64": (126, 24576, 32, 64),
    }
    g = torch.Generator(device=device).manual_seed(1)
    for name, (tq, tk, h, d) in shapes.items():
        q = torch.randn(1, tq, h * d, generator=g, device=device, dtype=torch.bfloat16)
        k = torch.randn(1, tk, h * d, generator=g, device=device, dtype=torch.bfloat16)
        v = torch.randn(1, tk, h * d, generator=g, device=device, dtype=torch.bfloat16)
        backends = [b for b in SDPA_BACKENDS if b != "math" or tq * tk <= MATH_MAX_TOKENS**2]
        # (an untimed round first: each backend's autotune; then A B C, C B A, ...)
        samples = interleaved(backends, repeats, lambda b: None,
                              lambda b: time_call(lambda: SDPAAttention(b)(q, k, v, h), device))
        flops = 4 * tq * tk * h * d
        out[name] = {b: {**summarise(s).to_dict(), "tflops": flops / (statistics.median(s) * 1e-3) / 1e12}
                     for b, s in samples.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="ltx2-19b")
    ap.add_argument("--sizes", nargs="+", default=["768x512x121", "1536x1024x121"], help="WIDTHxHEIGHTxFRAMES")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fps", type=float, default=24.0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (a smoke test)")
    ap.add_argument("--skip-attention", action="store_true", help="skip the bare attention shapes")
    ap.add_argument("--settings", nargs="+", default=None, help="subset of: off cudnn flash efficient math")
    ap.add_argument("--transformer-override", nargs="*", default=[], metavar="KEY=JSON",
                    help="change transformer config keys of the preset, e.g. rope_type='\"interleaved\"'")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    from ltx_core.model.transformer import X0Model

    from vidtune.model.weights import build_random_component

    preset = get_preset(args.preset)
    overrides = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.transformer_override)}
    if overrides:
        config = preset.copy_config()
        config["transformer"].update(overrides)
        preset = dataclasses.replace(preset, config=config)
    t0 = time.time()
    transformer = X0Model(build_random_component(preset, "transformer", device=device, dtype=torch.bfloat16)).eval()
    result: dict[str, Any] = {"preset": args.preset, "transformer_overrides": overrides, "environment": environment(device),
                              "build_s": time.time() - t0, "passes": {}, "repeats": args.repeats,
                              "method": "CUDA events around one X0Model forward; 1 warm-up pass per setting; "
                                        "settings interleaved per repeat; median over repeats"}
    originals: dict = {}
    settings = args.settings or ["off", *SDPA_BACKENDS]
    for size in args.sizes:
        w, h, f = (int(x) for x in size.split("x"))
        video, audio = pass_inputs(preset, h, w, f, args.fps, device)
        tokens = video.latent.shape[1]
        active = [s for s in settings if s != "math" or tokens <= MATH_MAX_TOKENS]
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        with torch.inference_mode():  # (an untimed round of every backend first, then A B C, C B A, ...)
            samples = interleaved(active, args.repeats,
                                  lambda s: _set_backend(transformer, None if s == "off" else s, originals),
                                  lambda s: time_call(lambda: transformer(video=video, audio=audio, perturbations=None),
                                                      device))
        _set_backend(transformer, None, originals)
        result["passes"][size] = {
            "video_tokens": tokens,
            "audio_tokens": audio.latent.shape[1],
            "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
            "settings": {s: summarise(v).to_dict() for s, v in samples.items()},
            "skipped": {"math": f"score matrix too large above {MATH_MAX_TOKENS} tokens"} if "math" not in active else {},
        }
        print(size, {s: round(statistics.median(v), 1) for s, v in samples.items()}, flush=True)
    del transformer
    if cuda:
        torch.cuda.empty_cache()
    if not args.skip_attention:
        result["attention"] = bench_attention(device, args.repeats + 2)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result.get("attention", {}), indent=1)[:2000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
