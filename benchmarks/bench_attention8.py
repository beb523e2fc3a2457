"""Kernel-level: 8-bit video self-attention (kernels/attention8.py) against cuDNN bf16 attention, interleaved.

    python -m vidtune.benchmarks.bench_attention8 --tokens 24576 130560 --out attention8.json

For each sequence length, [1, heads, N, dim] bf16 inputs (the keys with a shared channel offset, as video keys
have), after an untimed round: cuDNN's SDPA, the 8-bit path whole (quantisation of Q, K, V in PyTorch and the
kernel) and the kernel alone on quantised inputs, in alternating order (search/timing.py); their medians, the
speed-ups over cuDNN, TFLOP/s (4 N^2 heads dim per call) and the 8-bit output's relative error against cuDNN's.
Writes the JSON after each length. Needs a CUDA GPU (Hopper for the INT8 and FP8 tensor-core dots).
"""

from __future__ import annotations

import argparse
import json
import statistics
import traceback
from pathlib import Path
from typing import Any

__all__ = ["main"]


def run(tokens: list[int], heads: int, dim: int, repeats: int, out: str) -> dict[str, Any]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from vidtune.kernels.attention8 import attention8_triton, launch, quantize
    from vidtune.search.baseline import environment
    from vidtune.search.timing import interleaved, summarise, time_call

    device = torch.device("cuda")
    result: dict[str, Any] = {"heads": heads, "dim": dim, "repeats": repeats, "environment": environment(device),
                              "lengths": {}}
    for n in tokens:
        g = torch.Generator(device=device).manual_seed(n)
        q, k, v = (torch.randn(1, heads, n, dim, generator=g, device=device, dtype=torch.bfloat16) for _ in range(3))
        k = k + 2.0 * torch.randn(1, 1, 1, dim, generator=g, device=device, dtype=torch.bfloat16)
        try:
            def cudnn() -> torch.Tensor:
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v)

            z = quantize(q, k, v)
            fns = {"cudnn_bf16": cudnn, "attention8": lambda: attention8_triton(q, k, v),
                   "attention8_kernel": lambda: launch(z, q.dtype)}
            ref, got = cudnn(), attention8_triton(q, k, v)
            error = float((got.float() - ref.float()).norm() / ref.float().norm())
            ms = interleaved(list(fns), repeats, lambda name: None, lambda name: time_call(fns[name], device))
            flops = 4.0 * n * n * heads * dim
            med = {name: statistics.median(t) for name, t in ms.items()}
            row = {name: {**summarise(t).to_dict(), "tflops": flops / (med[name] * 1e-3) / 1e12} for name, t in ms.items()}
            row.update(speedup=med["cudnn_bf16"] / med["attention8"], kernel_speedup=med["cudnn_bf16"] / med["attention8_kernel"],
                       rel_error_vs_cudnn=error)
            print(f"{n} tokens: cuDNN {med['cudnn_bf16']:.2f} ms, 8-bit {med['attention8']:.2f} ms (x{row['speedup']:.2f}), "
                  f"kernel alone {med['attention8_kernel']:.2f} ms (x{row['kernel_speedup']:.2f}), error {error:.4f}",
                  flush=True)
        except Exception as exc:  # recorded with its reason; the next length still runs
            row = {"failed": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
            print(f"{n} tokens: FAILED {type(exc).__name__}: {exc}", flush=True)
        result["lengths"][str(n)] = row
        Path(out).write_text(json.dumps(result, indent=1, default=str))
        del q, k, v
        torch.cuda.empty_cache()
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[24576, 130560], help="sequence lengths")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    run(a.tokens, a.heads, a.dim, a.repeats, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
