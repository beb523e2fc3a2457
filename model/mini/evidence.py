"""Evidence that ``ltx2-mini`` learned, against the random-weight ``tiny`` preset (results/mini/).

    python -m vidtune.model.mini.evidence --out results/mini [--weights model/mini/weights] [--device cuda]

Every number is measured on held-out scenes (seeds the trainers never draw):
- VAE reconstruction PSNR (uint8 frames, encode -> decode through the shipped checkpoint);
- prompt adherence of generated videos: for each of the 7 colours, present when at least 0.2% of the
  pixels of the clip lie within 0.15 (RGB, 0-1 scale) of it; recall of prompted colours and the
  false-positive rate of unprompted ones; frame-to-frame consistency (mean |frame_t - frame_t-1| / 255);
- audio-video sync: bounces seen in the generated video (reversals of a prompted colour's centroid)
  against clicks heard in the generated audio (3 kHz band onsets), the lag of the cross-correlation of
  the two per-frame event trains, in frames;
- attention structure: in stage-2 video self-attention, the fraction of 32-token key blocks needed to
  hold 95% of each query's attention mass, per layer (trained attention should be markedly sparser);
  and the step-to-step relative L1 of the first block's residual (what first-block caching thresholds).
Writes evidence.json, report.md, sample MP4s and contact_sheet.png under --out.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch

from vidtune.model.mini.data import CLICK_HZ, COLOURS, render_video, sample_scene
from vidtune.model.mini.objectives import colour_range_ratio
from vidtune.model.mini.parts import HELD_OUT_SEED, clip_batch

__all__ = ["colour_presence", "event_lag_frames", "attention_block_fraction", "run"]

H, W, FRAMES, FPS = 256, 384, 33, 24.0
BLOCK = 32


def colour_presence(frames: torch.Tensor, min_fraction: float = 0.002, tol: float = 0.15) -> dict[str, bool]:
    """Which named colours occupy at least ``min_fraction`` of the pixels (uint8 frames [F, H, W, 3])."""
    x = frames.float() / 255
    out = {}
    for name, rgb in COLOURS.items():
        near = ((x - torch.tensor(rgb)).abs().max(-1).values < tol).float().mean()
        out[name] = bool(near >= min_fraction)
    return out


def _centroid_reversals(frames: torch.Tensor, colour: str) -> list[int]:
    x = frames.float() / 255
    mask = ((x - torch.tensor(COLOURS[colour])).abs().max(-1).values < 0.15).float()
    n = mask.sum((1, 2))
    if (n < 20).any():
        return []
    ys = torch.arange(x.shape[1], dtype=torch.float32)[None, :, None]
    xs = torch.arange(x.shape[2], dtype=torch.float32)[None, None, :]
    track = torch.stack([(mask * xs).sum((1, 2)) / n, (mask * ys).sum((1, 2)) / n], -1)
    vel = track[1:] - track[:-1]
    out = []
    for axis in (0, 1):
        a, b = vel[:-1, axis], vel[1:, axis]
        out += [int(f) + 1 for f in ((a * b < 0) & (a.abs() > 0.5) & (b.abs() > 0.5)).nonzero().flatten()]
    return sorted(out)


def _click_frames(audio: torch.Tensor, rate: int, frames: int, fps: float) -> torch.Tensor:
    """Per-video-frame energy of the click band (3 kHz), normalised to its maximum."""
    x = audio.float().mean(0)
    t = torch.arange(x.shape[0], dtype=torch.float32) / rate
    band = (x * torch.cos(2 * math.pi * CLICK_HZ * t)) ** 2 + (x * torch.sin(2 * math.pi * CLICK_HZ * t)) ** 2
    per = torch.zeros(frames)
    idx = torch.clamp((t * fps).long(), max=frames - 1)
    per.index_add_(0, idx, band)
    return per / per.max().clamp_min(1e-12)


def event_lag_frames(video_events: list[int], click_energy: torch.Tensor, max_lag: int = 4) -> int | None:
    """Lag (frames) maximising the cross-correlation of the bounce train with the click energy."""
    if not video_events:
        return None
    train = torch.zeros_like(click_energy)
    train[torch.tensor(video_events)] = 1.0
    best, best_lag = -1.0, None
    for lag in range(-max_lag, max_lag + 1):
        c = float((train * torch.roll(click_energy, -lag)).sum())
        if c > best:
            best, best_lag = c, lag
    return best_lag


class _AttentionProbe:
    """Records, per layer, the fraction of key blocks holding 95% of each query's attention (stage 2)."""

    def __init__(self, pipeline: Any, layer: int, inner: Any) -> None:
        self.pipeline, self.layer, self.inner = pipeline, layer, inner
        self.fractions: list[float] = []

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, mask: Any = None) -> torch.Tensor:
        ctx = self.pipeline.context
        if ctx is not None and ctx.stage == "stage2":
            self.fractions.append(attention_block_fraction(q, k, heads))
        return self.inner(q, k, v, heads, mask)


def attention_block_fraction(q: torch.Tensor, k: torch.Tensor, heads: int, block: int = BLOCK, mass: float = 0.95) -> float:
    """Mean over queries and heads of (key blocks needed for ``mass`` of the softmax) / (key blocks)."""
    b, n, hd = q.shape
    d = hd // heads
    qh = q.float().reshape(b, n, heads, d).transpose(1, 2)
    kh = k.float().reshape(b, k.shape[1], heads, d).transpose(1, 2)
    p = torch.softmax(qh @ kh.transpose(-1, -2) / math.sqrt(d), -1)  # [B, H, N, Nk]
    nk = kh.shape[2]
    nb = math.ceil(nk / block)
    p = torch.nn.functional.pad(p, (0, nb * block - nk)).reshape(b, heads, n, nb, block).sum(-1)
    sorted_mass = p.sort(-1, descending=True).values.cumsum(-1)
    needed = (sorted_mass < mass).sum(-1) + 1
    return float(needed.float().mean() / nb)


def _first_block_changes(pipeline: Any) -> tuple[dict[str, list[list[float]]], Any]:
    """A probe on the first block and the function that removes it: stage -> per step (1, 2, ...) the
    relative L1 change of the first block's residual from the previous step, conditional pass only.

    (A plain instance attribute and its removal: the model layer knows no technique, so it does not use
    the technique registry's ``Patch``.)"""
    vm = pipeline.models.transformer.velocity_model
    block0 = vm.transformer_blocks[0]
    changes: dict[str, list[list[float]]] = {}
    prev: dict[str, torch.Tensor] = {}
    original = block0.forward
    had_own = "forward" in vars(block0)

    def forward(video: Any, audio: Any, perturbations: Any) -> Any:
        v, a = original(video=video, audio=audio, perturbations=perturbations)
        ctx = pipeline.context
        if ctx is not None and ctx.pass_name == "cond":
            res = (v.x - video.x).float()
            key = ctx.stage
            if ctx.step == 0:
                prev.pop(key, None)
            if key in prev:  # per step index, over all prompts (averaged in the report)
                steps = changes.setdefault(key, [])
                while len(steps) < ctx.step:
                    steps.append([])
                steps[ctx.step - 1].append(float((res - prev[key]).abs().mean() / prev[key].abs().mean()))
            prev[key] = res
        return v, a

    def remove() -> None:
        if had_own:
            block0.forward = original
        else:
            del block0.forward

    block0.forward = forward
    return changes, remove


def _prompts(n: int) -> list[Any]:
    return [sample_scene(HELD_OUT_SEED + 1000 + i, pan_probability=0.0) for i in range(n)]


@torch.no_grad()
def run(models: Any, name: str, device: str, n_prompts: int = 8, out: Path | None = None,
        guided_steps: int | None = None) -> dict[str, Any]:
    """Every measure for one model; sample MP4s and frames under ``out`` when given. ``guided_steps``: the
    multistep pipeline's step count for the guided measures (None: the request's default, 40; fewer: a quicker
    check that they run)."""
    from vidtune.model import ReferencePipeline

    res: dict[str, Any] = {"model": name}
    # VAE reconstruction on held-out clips
    psnrs, colour = [], []
    for i in range(4):
        clip = clip_batch([HELD_OUT_SEED + i], 17, H, W, FPS, device)["video"].to(torch.bfloat16)
        rec = models.video_decoder(models.video_encoder(clip))
        a = ((clip.float() + 1) / 2).clamp(0, 1).mul(255).round()
        b = ((rec.float() + 1) / 2).clamp(0, 1).mul(255).round()
        mse = float((a - b).pow(2).mean())
        psnrs.append(10 * math.log10(255**2 / max(mse, 1e-10)))
        colour.append(colour_range_ratio(b, a))  # 0: a grey decoder
    res["vae_psnr_db"] = sum(psnrs) / len(psnrs)
    res["vae_colour_kept"] = sum(colour) / len(colour)
    pipe = ReferencePipeline(models, device=device)
    probes = []
    for layer, m in enumerate(pipe.attention_modules("video_self")):
        probes.append(_AttentionProbe(pipe, layer, m.attention_function))
        m.attention_function = probes[-1]
    changes, remove_probe = _first_block_changes(pipe)
    try:
        res.update(_generation_measures(pipe, name, n_prompts, out))
    finally:
        remove_probe()
        for layer, m in enumerate(pipe.attention_modules("video_self")):
            m.attention_function = probes[layer].inner
    ref = [render_video(sc, FRAMES, H, W, FPS) for sc in _prompts(n_prompts)]
    res.update(
        frame_change_reference_clips=sum(float((r[1:] - r[:-1]).abs().mean()) for r in ref) / len(ref),
        attention_fraction_95=[sum(p.fractions) / max(len(p.fractions), 1) for p in probes],
        first_block_rel_l1={k: [round(sum(x) / len(x), 4) for x in v] for k, v in changes.items()},
    )
    # the same prompts through the guided multistep pipeline (classifier-free guidance; the mini model was
    # trained with 10% prompt dropout): a weak conditional signal shows here before it does undistilled
    steps = {} if guided_steps is None else {"steps": guided_steps}
    guided = _generation_measures(pipe, name, n_prompts, out, mode="multistep", cfg_scale=GUIDED_CFG, **steps)
    res["guided"] = {k: v for k, v in guided.items() if k != "_samples"}
    res["_samples_guided"] = guided["_samples"]
    return res


GUIDED_CFG = 7.0  # multistep pipeline, 40 steps, CFG 7 (request defaults otherwise: STG 1, modality 3)


def _generation_measures(pipe: Any, name: str, n_prompts: int, out: Path | None, **request: Any) -> dict[str, Any]:
    """Prompt adherence, smoothness and audio-video sync of generated held-out prompts (``request``: extra
    request fields, e.g. the guided mode); the first 3 as MP4s under ``out`` and as frames in ``_samples``."""
    from vidtune.model import GenerationRequest
    from vidtune.model.media import write_mp4

    recall, false_pos, smooth, lags, samples = [], [], [], [], []
    suffix = "_guided" if request else ""
    for i, sc in enumerate(_prompts(n_prompts)):
        gen = pipe.run(GenerationRequest(prompt=sc.prompt, seed=i, height=H, width=W, frames=FRAMES, fps=FPS, **request))
        present = colour_presence(gen.frames)
        prompted = {s.colour for s in sc.shapes}
        recall.append(sum(present[c] for c in prompted) / len(prompted))
        others = [c for c in COLOURS if c not in prompted]
        false_pos.append(sum(present[c] for c in others) / len(others))
        smooth.append(float((gen.frames[1:].float() - gen.frames[:-1].float()).abs().mean() / 255))
        events = sorted({f for c in prompted for f in _centroid_reversals(gen.frames, c)})
        lags.append(event_lag_frames(events, _click_frames(gen.audio, gen.sample_rate, FRAMES, FPS)))
        if out is not None and i < 3:
            write_mp4(out / f"sample_{name}{suffix}_{i}.mp4", gen.frames, FPS, gen.audio, gen.sample_rate)
            samples.append((sc.prompt, gen.frames))
    return {"prompt_recall": sum(recall) / len(recall), "unprompted_colour_rate": sum(false_pos) / len(false_pos),
            "frame_change": sum(smooth) / len(smooth), "av_lag_frames": list(lags),
            "av_lag_within_one_frame": sum(1 for x in lags if x is not None and abs(x) <= 1),
            "av_clips_with_visible_bounces": sum(1 for x in lags if x is not None), "_samples": samples}


REFERENCE_REQUEST = dict(prompt="a red circle and a blue square bouncing", seed=0, height=128, width=192, frames=9,
                         fps=24.0)


# The reference clip is generated twice, in bf16 (the product's path) and in float32. CPU kernels round
# differently by CPU model and instruction set (oneDNN picks kernels by both), and 11 denoising steps
# amplify it. Measured against the AVX512 reference with torch 2.13.0 and 2 threads on 2026-12-01
# (ATEN_CPU_CAPABILITY forces the instruction set; tests/test_mini.py holds the tolerances):
#   bf16:    AVX2 mean |diff| 0.27, max 6 levels, 26% of values differ, PSNR 53.2 dB;
#            no AVX (DEFAULT) mean 0.32, max 13, 27%, 51.4 dB;
#   float32: AVX2 0.002% of values differ, by 1 level; DEFAULT 0.009%, by 1 level.
# In bf16 a real change hides in that noise (one weight tensor scaled by 1 + 2^-7: mean 0.35, max 13;
# one stage-1 sigma moved by 0.002: mean 0.25, max 9); in float32 it does not (25% and 4% of the
# values move), so the float32 clip is the check that a model, pipeline or weight change fails.
REFERENCE_DTYPES = {"bf16": torch.bfloat16, "float32": torch.float32}


def reference_clip(models: Any, dtype: torch.dtype = torch.bfloat16) -> Any:
    """The clip the CPU test reproduces from the shipped weights (small: 128x192x9); ``models`` loaded in
    ``dtype``."""
    from vidtune.model import GenerationRequest, ReferencePipeline

    return ReferencePipeline(models, dtype=dtype).run(GenerationRequest(**REFERENCE_REQUEST))


def reference_clip_path(folder: Path, dtype_name: str) -> Path:
    """Where the reference clip of one dtype lives (bf16 keeps its historical name)."""
    return folder / ("reference_clip.safetensors" if dtype_name == "bf16" else f"reference_clip_{dtype_name}.safetensors")


def write_reference_clip(weights: Path, folder: Path) -> list[Path]:
    """Generate the reference clips (bf16 and float32) on the CPU with 2 threads, as the tests run, and
    store their raw output with a JSON record of the weights' sha256 and the machine that made them."""
    from vidtune.model import ModelSource, load_models
    from vidtune.model.loading import file_sha256
    from vidtune.model.media import write_raw

    torch.set_num_threads(2)
    source = ModelSource(preset=None, checkpoint=str(weights / "model.safetensors"),
                         upsampler=str(weights / "spatial_upsampler.safetensors"))
    paths = []
    for name, dtype in REFERENCE_DTYPES.items():
        out = reference_clip(load_models(source, dtype=dtype), dtype)
        paths.append(write_raw(reference_clip_path(folder, name), out.frames, out.audio, out.sample_rate,
                               REFERENCE_REQUEST["fps"]))
    record = {**reference_machine(), "request": REFERENCE_REQUEST,
              "weights_sha256": {p.name: file_sha256(p) for p in (weights / "model.safetensors",
                                                                    weights / "spatial_upsampler.safetensors")}}
    (folder / "reference_clip.json").write_text(json.dumps(record, indent=2) + "\n")
    return paths


def reference_machine() -> dict[str, str]:
    """Where a reference clip was made (informative: the test's tolerances hold on any x86 CPU)."""
    import platform

    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu": _cpu_model() or platform.processor(),
            "torch": torch.__version__.split("+")[0], "threads": str(torch.get_num_threads())}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _contact_sheet(rows: list[tuple[str, torch.Tensor]], path: Path) -> None:
    from PIL import Image, ImageDraw

    picks = [0, FRAMES // 2, FRAMES - 1]
    tw, th = W // 2, H // 2
    sheet = Image.new("RGB", (tw * len(picks), (th + 14) * len(rows)), "white")
    draw = ImageDraw.Draw(sheet)
    for r, (label, frames) in enumerate(rows):
        draw.text((2, r * (th + 14)), label[:90], fill="black")
        for c, f in enumerate(picks):
            img = Image.fromarray(frames[f].cpu().numpy()).resize((tw, th))
            sheet.paste(img, (c * tw, r * (th + 14) + 14))
    sheet.save(path)


def main(argv: list[str] | None = None) -> int:
    from vidtune.model import ModelSource, load_models

    p = argparse.ArgumentParser(prog="python -m vidtune.model.mini.evidence")
    p.add_argument("--out", default="results/mini")
    p.add_argument("--weights", default="model/mini/weights")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--reference-clip", action="store_true",
                   help="only (re)write the test fixture reference_clip*.safetensors (bf16, float32) from the weights "
                        "(CPU), into --clip-out")
    p.add_argument("--clip-out", default="tests/data/mini_reference", help="where --reference-clip writes (the "
                   "fixture tests/test_mini.py reads)")
    a = p.parse_args(argv)
    if a.reference_clip:
        print(*write_reference_clip(Path(a.weights), Path(a.clip_out)), sep="\n")
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    w = Path(a.weights)
    mini = load_models(ModelSource(preset=None, checkpoint=str(w / "model.safetensors"),
                                   upsampler=str(w / "spatial_upsampler.safetensors")), device=a.device)
    tiny = load_models(ModelSource(preset="tiny"), device=a.device)
    results = [run(mini, "ltx2-mini", a.device, a.prompts, out), run(tiny, "tiny", a.device, a.prompts, out)]
    rows = [(f"{r['model']}: {prompt}", frames) for r in results for prompt, frames in r.pop("_samples")]
    guided = [r.pop("_samples_guided") for r in results]  # the contact sheet shows ltx2-mini's only
    rows[3:3] = [(f"ltx2-mini, multistep CFG {GUIDED_CFG:g}: {prompt}", frames) for prompt, frames in guided[0]]
    _contact_sheet(rows, out / "contact_sheet.png")
    (out / "evidence.json").write_text(json.dumps(results, indent=2))
    lines = ["# ltx2-mini: evidence that it learned", "",
             f"Measured by `python -m vidtune.model.mini.evidence` on {a.device}; held-out scenes; "
             f"{a.prompts} prompts at {H}x{W}x{FRAMES} (HxWxF), distilled two-stage pipeline.", "",
             "| measure | ltx2-mini | tiny (random weights) |", "|---|---|---|"]
    keys = [("vae_psnr_db", "VAE reconstruction PSNR (dB)"),
            ("vae_colour_kept", "VAE reconstruction colour range / clip's (0: grey)"),
            ("prompt_recall", "prompted colours present"),
            ("unprompted_colour_rate", "unprompted colours present"), ("frame_change", "mean frame-to-frame change"),
            ("av_lag_within_one_frame", "clips whose click lag is within 1 frame"),
            ("av_clips_with_visible_bounces", "clips with bounces seen in the video")]
    def cells(values: list[Any]) -> str:
        return " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in values)

    for k, label in keys:
        lines.append(f"| {label} | {cells([r[k] for r in results])} |")
    for k, label in keys[2:]:  # the generation measures again, guided
        lines.append(f"| {label}, multistep with CFG {GUIDED_CFG:g} | {cells([r['guided'][k] for r in results])} |")
    lines.append(f"| reference clips' frame-to-frame change | {results[0]['frame_change_reference_clips']:.3f} | |")
    for r in results:
        lines.append("")
        lines.append(f"{r['model']}: key blocks ({BLOCK} tokens) holding 95% of the attention, per layer: "
                     + ", ".join(f"{x:.3f}" for x in r["attention_fraction_95"])
                     + f"; first-block residual step-to-step relative L1: {json.dumps(r['first_block_rel_l1'])}")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
