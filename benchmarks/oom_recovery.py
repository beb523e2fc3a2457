"""A trial worker after an out-of-memory run: is its process still usable for the next setting?

    python -m vidtune.benchmarks.oom_recovery --preset ltx2-19b --size 1024x1536x121 --budget-gb 67.18 \
        --out $OUT/oom_recovery.json

One ``TrialWorker`` (the campaign's worker, in this process) under a memory cap (``eval.memory_budget_gb``; 67.18
GiB is an 80 GB H100 less the quality model's reserve), its baseline stored once (``--baseline-dir``), then the
settings in order (``--settings``, default: the CUDA-graphs + SDPA setting that ran out of memory in campaign
results/campaigns/h100-19b-1536u, then VAE tiles of 768 px, which had run at a 45.8 GiB peak there), each
evaluated as a family trial is (``TrialWorker.evaluate``). Per setting: its status, reason and message, the memory
allocated before and after it (``torch.cuda.memory_allocated``), its ``memory`` record and ``replace_worker``
(search/gpu_memory.py: more than 1 GiB left held after a failure, so a campaign would replace the actor). On a CPU
the same steps run on a small preset (the script's own check, tests/test_oom_recovery.py), with
``VIDTUNE_FAULT_INJECT=oom-stuck-once:<marker>`` standing in for the OOM. Writes one JSON file after each setting.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vidtune.techniques.setting import KnobValues

__all__ = ["run", "main", "SETTINGS"]

SETTINGS: dict[str, KnobValues] = {
    "cuda_graphs_sdpa": {"kernel_choice.cuda_graphs": {"enabled": True},
                         "kernel_choice.sdpa_backend": {"video_self": "off", "audio_self": "math", "text_cross": "cudnn",
                                                        "a2v": "off", "v2a": "off"}},
    "vae_tiles_768": {"tiling.vae_tiles": {"spatial_px": 768, "spatial_overlap_px": 64, "temporal_frames": 128,
                                           "temporal_overlap_frames": 24}},
    "step_skip": {"caching.step_skip": {"every": 2, "first_kept": 1, "last_kept": 1, "stage": "stage1"}},
}


def _allocated_gib(device: str) -> float | None:
    from vidtune.search.gpu_memory import allocated

    held = allocated(device)
    return None if held is None else round(held / 2**30, 3)


def run(preset: str, size: str, names: list[str], device: str, budget_gb: float | None, baseline_dir: str,
        out: str, seed: int = 0) -> dict[str, Any]:
    import torch

    from vidtune.model import ModelSource
    from vidtune.model.request import GenerationRequest
    from vidtune.search.worker import TrialWorker, WorkerSpec

    unknown = [n for n in names if n not in SETTINGS]  # (both checked before any model is built)
    if unknown:
        raise SystemExit(f"--settings: unknown {unknown}; allowed: {sorted(SETTINGS)}")
    try:
        height, width, frames = (int(x) for x in size.split("x"))
    except ValueError:
        raise SystemExit(f"--size must be HEIGHTxWIDTHxFRAMES (e.g. 1024x1536x121), got {size!r}") from None
    request = GenerationRequest(prompt="a red circle and a blue square bouncing", seed=seed, height=height,
                                width=width, frames=frames, fps=24.0)
    spec = WorkerSpec(source=ModelSource(preset=preset), request=request, device=device, repeats=1, warmup=0,
                      paired=False, baseline_dir=baseline_dir, baseline_mp4=False, flip_frames=0,
                      memory_budget_gb=budget_gb)
    t0 = time.perf_counter()
    worker = TrialWorker(spec)
    result: dict[str, Any] = {"preset": preset, "size": size, "device": device, "torch": torch.__version__,
                              "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
                              "memory_budget": worker.memory_budget, "load_s": round(time.perf_counter() - t0, 2),
                              "allocated_after_load_gib": _allocated_gib(device), "settings": []}
    t0 = time.perf_counter()
    worker.ensure_baseline()
    result.update(baseline_s=round(time.perf_counter() - t0, 2), allocated_after_baseline_gib=_allocated_gib(device))
    for name in names:
        before = _allocated_gib(device)
        t0 = time.perf_counter()
        rec = worker.evaluate(SETTINGS[name], scoped=False)
        entry = {"name": name, "knobs": SETTINGS[name], "status": str(rec.get("status")),
                 "reason": None if rec.get("reason") is None else str(rec["reason"]),
                 "message": (rec.get("message") or "")[:400], "seconds": round(time.perf_counter() - t0, 2),
                 "allocated_before_gib": before, "allocated_after_gib": _allocated_gib(device),
                 "memory": rec.get("memory"), "replace_worker": rec.get("replace_worker"),
                 "total_ms": rec.get("total_ms"), "peak_gib": None if rec.get("peak_memory_bytes") is None
                 else round(rec["peak_memory_bytes"] / 2**30, 2)}
        result["settings"].append(entry)
        print(json.dumps(entry, default=str), flush=True)
        Path(out).write_text(json.dumps(result, indent=1, default=str))
    worker.close()
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="ltx2-19b")
    p.add_argument("--size", default="1024x1536x121", help="HxWxF")
    p.add_argument("--settings", nargs="+", default=["cuda_graphs_sdpa", "vae_tiles_768"],
                   help=f"in order, of {sorted(SETTINGS)}")
    p.add_argument("--device", default="cuda")
    p.add_argument("--budget-gb", type=float, default=None, help="the worker's memory cap (GiB; default: none)")
    p.add_argument("--baseline-dir", default="/tmp/oom-baseline")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    run(a.preset, a.size, a.settings, a.device, a.budget_gb, a.baseline_dir, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
