"""The latency model against whole generations: for each setting, its estimate (search/latency_model.py) and its
paired whole-generation ratio in the same process, the model's error and what each cost.

    python -m vidtune.benchmarks.latency_model --preset ltx2-mini --size 256x384x17 --device cpu --out lm.json \
        --variant math=kernel_choice.sdpa_backend.video_self=math --variant merge=sparse_attention.token_merge.spatial=2

For each variant, in one process on one pipeline: the paired evaluation first (``evaluate_paired``: one warm-up
run, then ``--pairs`` interleaved pairs of the stages the setting touches; a compile lands in its warm-up), then
the estimate (one untimed round of each side, then ``--estimate-pairs`` rounds of one replayed pass per denoising stage and
step class, and the decoders' own runs). The error is estimate / measured - 1; the costs are the estimate's wall
seconds against the pairs' timed runs (the warm-up left out of both). Writes one JSON file after each variant.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]


def run(preset: str, size: str, variants: list[tuple[str, list[str]]], pairs: int, device: str, out: str,
        baseline_dir: str, seed: int, estimate_pairs: int = 3, mode: str = "distilled",
        steps: int = 40, lean: bool = False) -> dict[str, Any]:
    import torch

    from vidtune.model import ModelSource, ReferencePipeline, load_models
    from vidtune.model.request import GenerationRequest
    from vidtune.search.evaluator import ensure_baseline, evaluate_paired
    from vidtune.search.latency_model import capture_passes, estimate, not_modelled
    from vidtune.settings import knob_values

    height, width, frames = (int(x) for x in size.split("x"))
    settings = [(name, knob_values(knobs)) for name, knobs in variants]  # (every variant checked before any work)
    source = ModelSource(preset=preset)
    pipe = ReferencePipeline(load_models(source, device=device), device=device)
    request = GenerationRequest(prompt="a red circle and a blue square bouncing", seed=seed, height=height,
                                width=width, frames=frames, fps=24.0, mode=mode, steps=steps)
    base, _ = ensure_baseline(pipe, request, source, Path(baseline_dir), repeats=3, warmup=1, noise_floor=False, mp4=False)
    captured = capture_passes(pipe, request, base.stages)
    result: dict[str, Any] = {"preset": preset, "size": size, "device": device, "pairs": pairs,
                              "estimate_pairs": estimate_pairs, "seed": seed, "mode": mode, "steps": steps,
                              "torch": torch.__version__, "variants": []}
    for name, values in settings:
        rec: dict[str, Any] = {"name": name, "knobs": values.to_dict()}
        why = not_modelled(values)
        if why is not None:
            rec["not_modelled"] = why
        else:
            ev = evaluate_paired(pipe, request, values, baseline=base, repeats=pairs, max_repeats=pairs, warmup=1)
            t0 = time.perf_counter()
            est = estimate(pipe, request, values, base, pairs=estimate_pairs, captured=captured,
                           run_stats=ev.output.stats)  # (a cache's counted passes: the pairs' last run's)
            rec.update(measured=ev.paired["ratio"], interval=ev.paired["interval"], estimated=est["ratio"],
                       error=est["ratio"] / ev.paired["ratio"] - 1, estimate_s=round(time.perf_counter() - t0, 3),
                       pairs_s=ev.timing["timed_runs_s"], estimate_detail=est["measured"])
            if lean:  # (the same setting, warmed up, estimated again without the untimed round and passes)
                t0 = time.perf_counter()
                est = estimate(pipe, request, values, base, pairs=estimate_pairs, captured=captured,
                               run_stats=ev.output.stats, lean=True)
                rec.update(estimated_lean=est["ratio"], error_lean=est["ratio"] / ev.paired["ratio"] - 1,
                           estimate_lean_s=round(time.perf_counter() - t0, 3), estimate_lean_detail=est["measured"])
            print(f"{name}: measured x{1 / rec['measured']:.3f}, estimated x{1 / rec['estimated']:.3f}, error "
                  f"{100 * rec['error']:+.1f}%, {rec['estimate_s']:.1f} s against {rec['pairs_s']:.1f} s"
                  + (f"; lean x{1 / rec['estimated_lean']:.3f}, {100 * rec['error_lean']:+.1f}%, {rec['estimate_lean_s']:.1f} s"
                     if lean else ""), flush=True)
        result["variants"].append(rec)
        for key in ("error", "error_lean"):
            errors = [abs(v[key]) for v in result["variants"] if key in v]
            if errors:
                result[f"median_abs_{key}"], result[f"worst_abs_{key}"] = statistics.median(errors), max(errors)
        Path(out).write_text(json.dumps(result, indent=1, default=str))
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="ltx2-mini")
    p.add_argument("--size", default="256x384x17", help="HEIGHTxWIDTHxFRAMES of the request")
    p.add_argument("--device", default="cpu")
    p.add_argument("--variant", action="append", default=[], help="NAME=KNOB=VALUE,KNOB=VALUE")
    p.add_argument("--pairs", type=int, default=3, help="the paired whole generations' pairs (the reference)")
    p.add_argument("--estimate-pairs", type=int, default=3, help="the estimate's rounds (a campaign's: 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mode", default="distilled", choices=("distilled", "multistep"))
    p.add_argument("--steps", type=int, default=40, help="multistep stage-1 steps")
    p.add_argument("--baseline-dir", default="latency-model-baseline")
    p.add_argument("--lean", action="store_true", help="also the lean estimate (no untimed round or passes)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    variants = []
    for item in a.variant:
        name, _, knobs = item.partition("=")
        variants.append((name, [k for k in knobs.split(",") if k]))
    run(a.preset, a.size, variants, a.pairs, a.device, a.out, a.baseline_dir, a.seed, a.estimate_pairs, a.mode, a.steps,
        a.lean)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
