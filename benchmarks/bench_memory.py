"""GPU benchmark: whole generations under the memory family's settings, their peak memory and latency.

    python -m vidtune.benchmarks.bench_memory --preset ltx2-19b --size 1536x1024x121 [--budget-gb 24] --out $OUT/memory.json
    python -m vidtune.benchmarks.bench_memory --settings fp8_stored fp8_stored_offload40_prefetch2@24 \
        fp8_stored_offload48_prefetch2@16 --out $OUT/memory.json      # a budget per setting: NAME@GIB

Builds the pipeline once, then alternates the bf16 baseline (A) and each setting (B, C, ...): A B C ... A,
each after one untimed warm-up run of it. Per run: wall time (CUDA-synchronised), the allocator's peak
(``max_memory_allocated``, reset before the run), the memory held between runs once the setting is applied
(weights and what stays resident), and the block streamer's copy counts (bytes streamed, blocks whose copy
was not prefetched). ``--budget-gb 24`` enforces a budget during each setting's runs as a campaign trial's
``eval.memory_budget_gb`` does (an allocation above it fails as OOM, recorded). Random weights: latency and
memory only. Writes one JSON file.

    python -m vidtune.benchmarks.bench_memory --copy-alone 48x387.5 --out $OUT/copy_alone.json

times what block offload's copies cost with nothing to hide behind: ``BLOCKS`` blocks of ``MB`` megabytes (the
19B's FP8 blocks: 48 of 387.5 MB, 18.6 GB a pass) streamed through the same ``BlockStreamer`` as the technique,
passes of ``before(k)``/``after(k)`` with no compute between them, so that the pass takes as long as its copies.
With a streamed and a resident generation timed in one process (the settings above), the share of the copy
hidden behind compute is ``1 - (streamed - resident) / (passes x copy-alone pass)``. No model is built: seconds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from vidtune.techniques.setting import KnobValues

SETTINGS: dict[str, KnobValues] = {
    "fp8_stored": {"kernel_choice.fp8_linear": {"layers": "all"}, "memory.fp8_weights": {"layers": "all"}},
    "fp8_stored_offload40_prefetch2": {"kernel_choice.fp8_linear": {"layers": "all"}, "memory.fp8_weights": {"layers": "all"},
                                       "memory.block_offload": {"offloaded_blocks": 40, "prefetch": 2}},
    "fp8_stored_offload48_prefetch2": {"kernel_choice.fp8_linear": {"layers": "all"}, "memory.fp8_weights": {"layers": "all"},
                                       "memory.block_offload": {"offloaded_blocks": 48, "prefetch": 2}},
    "fp8_stored_offload48_placed": {"kernel_choice.fp8_linear": {"layers": "all"}, "memory.fp8_weights": {"layers": "all"},
                                    "memory.block_offload": {"offloaded_blocks": 48, "prefetch": 2},
                                    "memory.stage_placement": {"upsampler": True, "decoders": True, "cleanup": True}},
}


def _run(pipe: Any, request: Any) -> dict[str, Any]:
    cuda = torch.cuda.is_available()  # (on a CPU: the script's own check, times only)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    held = torch.cuda.memory_allocated() if cuda else 0
    t0 = time.perf_counter()
    out = pipe.run(request)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    copies = pipe.run_stats().get("block_offload_copies")
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    return {"seconds": round(seconds, 3), "peak_gib": round(peak / 2**30, 2), "held_gib": round(held / 2**30, 2),
            "copies": copies, "frames_sum": int(out.frames.sum().item())}


def copy_alone(blocks: int, block_mb: float, prefetch: int = 2, passes: int = 5, tensors_per_block: int = 8,
               device: str | None = None) -> dict[str, Any]:
    """Passes over ``blocks`` offloaded blocks of ``block_mb`` MB each through ``BlockStreamer`` with no compute
    between ``before(k)`` and ``after(k)``: the copy time of a pass when nothing hides it (CUDA-synchronised
    wall time per pass, after one untimed pass), and the bandwidth it implies. The host side is a few pinned
    buffers shared by the blocks (a block's bytes, not its values, set the copy's cost; pinning 18 GB would take
    longer than the measurement). On a CPU the same loop runs the clone path (the script's own check)."""
    from vidtune.techniques.memory.block_offload import BlockStreamer
    from vidtune.techniques.memory.host_copies import HostSlot

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = dev.type == "cuda"
    per = max(1, int(block_mb * 1e6 / tensors_per_block / 2))  # bf16/uint8 mix does not matter: bytes do
    distinct = min(blocks, prefetch + 2)
    hosts = [[torch.empty(per, dtype=torch.bfloat16, pin_memory=cuda) for _ in range(tensors_per_block)]
             for _ in range(distinct)]
    sink: dict[tuple[int, int], torch.Tensor] = {}
    slots = [[HostSlot(h, lambda t, key=(k, i): sink.__setitem__(key, t)) for i, h in enumerate(hosts[k % distinct])]
             for k in range(blocks)]
    copied = [0, 0]  # blocks, bytes copied since the last pass started

    def on_copy(nbytes: int, waited: bool) -> None:
        copied[0] += 1
        copied[1] += nbytes

    streamer = BlockStreamer(slots, dev, prefetch, on_copy)

    def one_pass() -> float:
        if cuda:
            torch.cuda.synchronize(dev)
        copied[:] = [0, 0]
        t0 = time.perf_counter()
        for k in range(blocks):
            streamer.before(k)
            streamer.after(k)
        if cuda:
            torch.cuda.current_stream(dev).wait_stream(streamer.side)
            torch.cuda.synchronize(dev)
        return time.perf_counter() - t0

    one_pass()  # untimed: the allocator's first blocks, the side stream's first use
    times = sorted(one_pass() for _ in range(passes))
    nbytes = copied[1]  # (what the last pass copied: every block once, the prefetch window cycling round)
    median = times[len(times) // 2]
    return {"device": str(dev), "blocks": blocks, "block_mb": round(streamer.nbytes[0] / 1e6, 1), "prefetch": prefetch,
            "blocks_copied_per_pass": copied[0], "bytes_per_pass": nbytes, "pass_s": [round(t, 6) for t in times],
            "pass_s_median": round(median, 6),
            "gb_per_s": round(nbytes / median / 1e9, 2)}


def parse_setting(text: str, default_gb: float | None, error: Any) -> tuple[str, float | None]:
    """``NAME`` or ``NAME@GIB`` (a budget enforced for that setting's runs) -> (name, budget or ``default_gb``);
    ``error`` (argparse's) names the bad part and the allowed values."""
    name, _, gb = text.partition("@")
    if name not in SETTINGS:
        error(f"--settings: {name!r} is not a setting; the settings are {list(SETTINGS)}")
    if not gb:
        return name, default_gb
    try:
        budget = float(gb)
    except ValueError:
        budget = -1.0
    if not budget > 0:
        error(f"--settings: the budget after @ in {text!r} must be a number of GiB > 0")
    return name, budget


def main() -> None:
    from vidtune.model import GenerationRequest, ModelSource, ReferencePipeline, load_models
    from vidtune.search.worker import enforce_memory_budget
    from vidtune.techniques import compose

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="ltx2-19b")
    p.add_argument("--size", default="1536x1024x121", help="WIDTHxHEIGHTxFRAMES")
    p.add_argument("--settings", nargs="*", default=list(SETTINGS), metavar="NAME[@GIB]",
                   help=f"settings from {list(SETTINGS)}, each with its own enforced budget after @ (e.g. "
                        f"fp8_stored_offload48_prefetch2@16; without one: --budget-gb)")
    p.add_argument("--budget-gb", type=float, default=None,
                   help="enforce this GPU memory budget (GiB) during each setting's runs (not the baseline's)")
    p.add_argument("--copy-alone", metavar="BLOCKSxMB", default=None,
                   help="only time block offload's copies with nothing to hide behind (e.g. 48x387.5: the 19B's FP8 "
                        "blocks); no model is built")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    if a.copy_alone:
        try:
            n, mb = a.copy_alone.split("x")
            blocks, block_mb = int(n), float(mb)
            assert blocks > 0 and block_mb > 0
        except (ValueError, AssertionError):
            p.error(f"--copy-alone: {a.copy_alone!r} must be BLOCKSxMB, a whole number of blocks > 0 and megabytes > 0 "
                    f"(e.g. 48x387.5)")
        res = {"copy_alone": copy_alone(blocks, block_mb),
               "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "torch": torch.__version__}
        Path(a.out).write_text(json.dumps(res, indent=2))
        print(json.dumps(res), flush=True)
        return
    plan = [parse_setting(s, a.budget_gb, p.error) for s in a.settings]  # (before the model is built)
    width, height, frames = (int(v) for v in a.size.split("x"))
    t0 = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    models = load_models(ModelSource(preset=a.preset), device=device)
    pipe = ReferencePipeline(models, device=device)
    request = GenerationRequest(prompt="a red circle bouncing on a blue background", seed=0, height=height, width=width,
                                frames=frames)
    result: dict[str, Any] = {"preset": a.preset, "size": a.size, "build_s": round(time.perf_counter() - t0, 1),
                              "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__, "runs": []}
    out_path = Path(a.out)

    def record(label: str, knobs: dict, warm: dict, timed: dict, apply_s: float = 0.0) -> None:
        result["runs"].append({"setting": label, "knobs": knobs, "apply_s": round(apply_s, 1), "warmup": warm, **timed})
        out_path.write_text(json.dumps(result, indent=2))  # (after every run: a cut call keeps what finished)
        print(label, json.dumps(timed), flush=True)

    record("baseline", {}, _run(pipe, request), _run(pipe, request))
    for label, budget_gb in plan:
        t1 = time.perf_counter()
        with compose(pipe, SETTINGS[label]):
            apply_s = time.perf_counter() - t1
            budget = None
            if budget_gb and device == "cuda":  # enforced as a campaign trial is (eval.memory_budget_gb): an
                torch.cuda.empty_cache()  # allocation above it fails as OOM; the cache the bf16 runs left goes first
                budget = enforce_memory_budget(budget_gb, device)
            try:
                record(label, {**SETTINGS[label], "budget": budget}, _run(pipe, request), _run(pipe, request), apply_s)
            except torch.OutOfMemoryError as e:
                record(label, {**SETTINGS[label], "budget": budget}, {}, {"oom": str(e).splitlines()[0][:300]}, apply_s)
            finally:
                if budget is not None:
                    torch.cuda.set_per_process_memory_fraction(1.0)
    record("baseline_again", {}, {}, _run(pipe, request))  # (warm already: one timed run closes the A ... A frame)


if __name__ == "__main__":
    main()
