"""Parallelism benchmark: each strategy on N ranks against one rank, outputs compared (issue: multi-GPU run).

    python -m vidtune.benchmarks.bench_parallel --world 2 --out results/benchmarks/parallel/x2.json
    python -m vidtune.benchmarks.bench_parallel --world 4 --out results/benchmarks/parallel/x4.json

Per case, every rank builds the same transformer (``--preset``, optionally cut to ``--layers`` blocks
and the time scaled to the full depth in the report), then alternates the one-rank run (every rank
computes alone, no communication: the single-GPU time) with the parallel run, ``repeats`` times, and
rank 0 reports medians, speed-up, parallel efficiency (speed-up / N) and the max |difference| of the
outputs. Cases (sizes are request sizes, H x W as ``WxHxF``):
- ``sequence``: one stage-2 transformer pass, sequence_parallel (Ulysses + v2a by log-sum-exp, and
  Ulysses + v2a by gathered keys/values, with the bytes each moves per rank);
- ``guidance``: one multistep stage-1 step (4 guidance passes), guidance_parallel;
- ``tile``: stage 2 (3 steps) with a 2 x 2 tile grid, tile_parallel.
NCCL on GPUs (NVLink multicast left off: NCCL_NVLS_ENABLE=0), gloo on the CPU (its test).
"""

from __future__ import annotations

import argparse
import json
import statistics
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

__all__ = ["run_rank", "main"]


def _pipeline(preset_name: str, layers: int | None, device: torch.device, tiling: Any = None) -> Any:
    from ltx_core.model.transformer import X0Model

    from vidtune.model import Models, ReferencePipeline
    from vidtune.model.presets import get_preset
    from vidtune.model.weights import build_random_component

    p = get_preset(preset_name)
    if layers:
        cfg = p.copy_config()
        cfg["transformer"]["num_layers"] = layers
        p = replace(p, config=cfg, stg_blocks=tuple(b for b in p.stg_blocks if b < layers) or (0,))
    tr = X0Model(build_random_component(p, "transformer", device=device, dtype=torch.bfloat16)).eval()
    models = Models(transformer=tr, video_encoder=None, video_decoder=None, audio_decoder=None, vocoder=None,
                    upsampler=None, stg_blocks=p.stg_blocks, context_tokens=p.extra.get("context_tokens", 64))
    return ReferencePipeline(models, device=device, stage2_tiling=tiling), p


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Any, device: torch.device) -> tuple[float, Any]:
    import time

    import torch.distributed as dist

    dist.barrier()
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    dist.barrier()
    return (time.perf_counter() - t0) * 1000.0, out


def _compare(a: Any, b: Any) -> float:
    ta = [t for t in (a if isinstance(a, (tuple, list)) else (a,)) if isinstance(t, torch.Tensor)]
    tb = [t for t in (b if isinstance(b, (tuple, list)) else (b,)) if isinstance(t, torch.Tensor)]
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(ta, tb))


def _case(name: str, size: str, world: int, args: Any, device: torch.device) -> tuple[Any, dict, Any]:
    """(function running the case on a pipeline, the parallel setting, the pipeline)."""
    from vidtune.model import GenerationRequest
    from vidtune.model.tiles import Stage2Tiling
    from vidtune.benchmarks.bench_pass import pass_inputs

    w, h, f = (int(x) for x in size.split("x"))
    if name.startswith("sequence"):
        pipe, preset = _pipeline(args.preset, args.layers, device)
        video, audio = pass_inputs(preset, h, w, f, 24.0, device)
        v2a = "gather_kv" if name.endswith("gather") else "lse"
        heads = preset.config["transformer"]["num_attention_heads"]
        comm = "ulysses" if heads % world == 0 else "allgather_kv"
        setting = {"parallelism.sequence_parallel": {"degree": world, "comm": comm, "v2a": v2a}}
        return (lambda p: p.transformer_pass(video, audio, None)), setting, pipe
    if name == "guidance":
        pipe, preset = _pipeline(args.preset, args.layers, device)
        req = GenerationRequest(prompt="bench", seed=0, height=h, width=w, frames=f, fps=24.0, mode="multistep",
                                stage1_sigmas=(1.0, 0.0))
        return (lambda p: p.stage1(req).video), {"parallelism.guidance_parallel": {"degree": world}}, pipe
    if name == "tile":
        pipe, preset = _pipeline(args.preset, args.layers, device, Stage2Tiling(rows=2, cols=2, overlap=-1))
        req = GenerationRequest(prompt="bench", seed=0, height=h, width=w, frames=f, fps=24.0)
        g = torch.Generator(device=device).manual_seed(0)
        lat = torch.randn(1, 128, (f - 1) // 8 + 1, h // 32, w // 32, generator=g, device=device, dtype=torch.bfloat16)
        from ltx_core.types import AudioLatentShape, VideoPixelShape

        ashape = AudioLatentShape.from_video_pixel_shape(VideoPixelShape(batch=1, frames=f, width=w, height=h, fps=24.0))
        alat = torch.randn(*ashape.to_torch_shape(), generator=g, device=device, dtype=torch.bfloat16)
        rng = torch.Generator(device=device).manual_seed(1).get_state()
        return (lambda p: p.stage2(req, lat, alat, rng).video), {"parallelism.tile_parallel": {"degree": world}}, pipe
    raise ValueError(f"case must be sequence, sequence_gather, guidance or tile, got {name!r}")


def run_rank(rank: int, world: int, args: Any) -> dict[str, Any]:
    """One rank's part of every case; rank 0 returns the report."""
    from vidtune.techniques import compose

    device = torch.device(f"cuda:{rank}" if torch.cuda.is_available() else "cpu")
    report: dict[str, Any] = {}
    for case in args.cases:
        name, size = case.split("@")
        try:
            fn, setting, pipe = _case(name, size, world, args, device)
            with torch.inference_mode():
                ref = fn(pipe)  # warm-up, one rank alone
                with compose(pipe, setting):
                    fn(pipe)  # warm-up, parallel
                one, par, diff, stats = [], [], 0.0, {}
                for _ in range(args.repeats):
                    t, _ = _timed(lambda: fn(pipe), device)
                    one.append(t)
                    with compose(pipe, setting):
                        pipe.reset_stats()
                        t, out = _timed(lambda: fn(pipe), device)
                        stats = json.loads(json.dumps(pipe.run_stats(), default=str))
                    par.append(t)
                    diff = max(diff, _compare(ref, out))
            scale = 1.0
            if args.layers:
                from vidtune.model.presets import get_preset

                scale = get_preset(args.preset).config["transformer"]["num_layers"] / args.layers
            speedup = statistics.median(one) / statistics.median(par)
            report[case] = {"setting": setting, "one_rank_ms": one, "parallel_ms": par,
                            "one_rank_median_ms": statistics.median(one), "parallel_median_ms": statistics.median(par),
                            "full_depth_estimate_ms": {"one_rank": statistics.median(one) * scale,
                                                       "parallel": statistics.median(par) * scale},
                            "speedup": speedup, "efficiency": speedup / world, "max_abs_diff_vs_one_rank": diff,
                            "stats": stats}
            del pipe
        except Exception as exc:  # recorded; the other cases still run
            report[case] = {"failed": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return report if rank == 0 else {}


def main(argv: list[str] | None = None) -> int:
    from vidtune.search.baseline import environment
    from vidtune.techniques.parallelism.distributed import launch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--preset", default="ltx2-19b")
    ap.add_argument("--layers", type=int, default=4, help="blocks built (0: all); times are scaled to full depth too")
    ap.add_argument("--cases", nargs="+", default=["sequence@1536x1024x121", "sequence_gather@1536x1024x121",
                                                   "sequence@3840x2176x121", "guidance@1536x1024x121",
                                                   "tile@3840x2176x121"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    report = launch(run_rank, a.world, a)[0]
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    doc = {"world": a.world, "preset": a.preset, "layers": a.layers, "environment": environment(device),
           "method": __doc__, "cases": report}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=2, default=str))
    for case, r in report.items():
        if "failed" in r:
            print(f"{case}: FAILED {r['failed']}")
        else:
            print(f"{case}: one rank {r['one_rank_median_ms']:.1f} ms, {a.world} ranks {r['parallel_median_ms']:.1f} ms, "
                  f"x{r['speedup']:.2f} (efficiency {r['efficiency']:.2f}), max|diff| {r['max_abs_diff_vs_one_rank']:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
