"""GPU benchmark: the video VAE decode alone, per decode setting, each in a new process: its first run and its
steady runs.

    python -m vidtune.benchmarks.bench_decode --preset ltx2-19b --size 1536x1024x121 --out decode.json \
        --variant eager= --variant cudnn=kernel_choice.vae_decode.cudnn_benchmark=true ...

Why a process per setting: what a new request size costs a trial is the first run in a process that has not
decoded that size (cuDNN's algorithm search per convolution shape, Dynamo's tracing, Inductor's compile or its
cache), and one process would let the first setting pay for the next. Each child builds the preset's video decoder
alone (seeded random weights: latency only), applies the setting through the registry (``compose``, as a trial
does), decodes a seeded latent of the request's shape once (the first run, wall seconds, with Dynamo's compile
times where it compiled), then ``--repeats`` times (CUDA events: median and spread). A variant listed twice runs
twice: the second finds Inductor's on-disk cache warm (the cached first run). Writes one JSON file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

__all__ = ["main"]


def _child(preset_name: str, size: str, knobs: list[str], repeats: int, device_name: str) -> dict[str, Any]:
    import torch

    from vidtune.model.loading import Models
    from vidtune.model.pipeline import ReferencePipeline
    from vidtune.model.presets import get_preset
    from vidtune.model.weights import build_random_component
    from vidtune.search.timing import StageTimer
    from vidtune.settings import knob_values
    from vidtune.techniques.setting import compose

    t0 = time.perf_counter()
    height, width, frames = (int(x) for x in size.lower().split("x"))
    device = torch.device(device_name)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    preset = get_preset(preset_name)
    decoder = build_random_component(preset, "video_decoder", device=device, dtype=torch.bfloat16)
    models = Models(transformer=None, video_encoder=None, video_decoder=decoder, audio_decoder=None, vocoder=None,
                    upsampler=None, stg_blocks=preset.stg_blocks, context_tokens=64)
    pipe = ReferencePipeline(models, device=device)
    g = torch.Generator(device=device).manual_seed(0)
    latent = torch.randn(1, 128, (frames - 1) // 8 + 1, height // 32, width // 32, generator=g, device=device,
                         dtype=torch.bfloat16)
    rng = torch.Generator(device=device).manual_seed(1).get_state()
    patch = compose(pipe, knob_values(knobs))
    built_s = time.perf_counter() - t0
    sync()
    t1 = time.perf_counter()
    with torch.inference_mode():
        frames_out = pipe.decode_video(latent, rng)
    sync()
    first_s = time.perf_counter() - t1
    compile_times = ""
    try:
        from torch._dynamo.utils import compile_times

        compile_times = str(compile_times(repr="str", aggregate=True))[:4000]
    except Exception as exc:  # (a private summary: its absence is not a failure)
        compile_times = f"unavailable: {exc}"
    times = []
    for _ in range(repeats):
        timer = StageTimer(device)
        with timer, torch.inference_mode():
            pipe.decode_video(latent, rng)
        times.append(timer.elapsed_ms)
    patch.undo()
    return {"knobs": knobs, "built_s": round(built_s, 2), "first_run_s": round(first_s, 2),
            "median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "runs_ms": times,
            "frames": list(frames_out.shape), "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            "compile_times": compile_times}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="ltx2-19b")
    p.add_argument("--size", default="1024x1536x121", help="HEIGHTxWIDTHxFRAMES of the request")
    p.add_argument("--device", default="cuda", help="cuda (the benchmark), or cpu (to check the script)")
    p.add_argument("--variant", action="append", default=[], help="NAME=KNOB=VALUE,KNOB=VALUE (NAME= alone: no knob)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", required=True)
    p.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child is not None:
        print(json.dumps(_child(a.preset, a.size, a.child, a.repeats, a.device)))
        return 0
    results = []
    for item in a.variant:
        name, _, knobs = item.partition("=")
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "vidtune.benchmarks.bench_decode", "--preset", a.preset, "--size", a.size,
               "--repeats", str(a.repeats), "--device", a.device, "--out", a.out, "--child", *[k for k in knobs.split(",") if k]]
        res = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
        rec: dict[str, Any] = {"name": name, "process_s": round(time.perf_counter() - t0, 2), "rc": res.returncode}
        if res.returncode == 0:
            rec.update(json.loads(res.stdout.strip().splitlines()[-1]))
        else:
            rec["stderr"] = res.stderr[-3000:]
        results.append(rec)
        print(f"{name}: first run {rec.get('first_run_s')} s, median {rec.get('median_ms')} ms, process "
              f"{rec['process_s']} s, rc {res.returncode}", flush=True)
        with open(a.out, "w") as f:  # (after each variant: a call cut by its limit keeps what finished)
            json.dump({"preset": a.preset, "size": a.size, "repeats": a.repeats, "variants": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
