"""Sol with a CuTe DSL kernel (Hopper), the issue's second backend beside Triton.

``sol_attention_cute`` has the contract of ``sol_attention_triton`` and the same maths:

1. routing: the same fused Triton pass (``sol_triton.route``), so both backends keep the same blocks;
2. the kernel, ``kernels/sol_cute_sm90.py`` (warp-specialised: a TMA loader warp per query block, two
   consumer warpgroups with warpgroup MMAs, written with nvidia-cutlass-dsl): the kept blocks exactly,
   then with ``correction`` the rejected blocks' approximation in the same online softmax; it returns O
   normalised and the rows' base-2 log-sum-exp;
3. with ``CUTE_LAUNCH["correction"] = "triton"`` instead: the kernel does the kept blocks only and the
   Triton kernel's correction loop (``sol_triton.launch(init=...)``) starts from their state (m = lse,
   l = 1, acc = O: the same softmax state up to a common factor). Measured slower than fused (round 13f).

Why a second kernel: after eleven Triton rounds the kept blocks ran at ~75% of cuDNN's dense rate per
block (results/benchmarks/sparse/README.md). Triton 3.6 does not emit this schedule (a producer warp
feeding a ring of shared-memory stages, consumer warpgroups with register budgets of their own).

Where it runs: a CUDA GPU of compute capability 9.0 with nvidia-cutlass-dsl installed (the ``gpu``
extra). On a CPU the kernel still compiles to sm_90a PTX (``compile_ptx``, tested in CI); its numbers
are checked against ``sol_attention_reference`` on the GPU (tests marked gpu).
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from typing import Any

import torch

from vidtune.kernels.sol_triton import split_hi_lo, launch, route

__all__ = ["cute_available", "cute_importable", "kept_attention_cute", "sol_attention_cute", "compile_ptx",
           "CUTE_LAUNCH"]

# stages: K/V slots per consumer (each slot holds one 64-key block of K and of V: 32 KB at d = 128; 3 is
# the most that fits; round 13b: 3 ran 2.4% faster than 2); correction: "fused" (the CuTe kernel streams
# the block means after the kept blocks) or "triton" (Triton's correction pass after the kernel; round
# 13c: 83.5 ms against 76.0 ms fused at 130,560 tokens, beta 1.0). Round 13b also measured issuing the
# next block's S = Q K^T before this block's softmax (a second score accumulator): 4-21% slower; the
# code of b9f72f6 holds it.
# q_regs: Q read once into registers, so S = Q K^T reads only K from shared memory (round 13e: kept part
# 54.75 ms against 58.00 ms, Sol end to end 74.55 ms against 77.78 ms at 130,560 tokens, beta 1.0).
CUTE_LAUNCH: dict[str, Any] = {"stages": 3, "correction": "fused", "q_regs": True}
_COMPILED: dict[tuple[Any, ...], Any] = {}


def _import_dsl() -> Any:
    """Import the kernel module. nvidia-cutlass-dsl puts its packages under nvidia_cutlass_dsl/dsl_packages
    and adds that folder with a .pth file, which an install with ``pip --target`` (the device's) skips."""
    spec = importlib.util.find_spec("nvidia_cutlass_dsl")
    if spec is not None:
        for base in spec.submodule_search_locations or []:
            path = os.path.join(base, "dsl_packages")
            if os.path.isdir(path) and path not in sys.path:
                sys.path.append(path)
    from vidtune.kernels import sol_cute_sm90

    return sol_cute_sm90


def cute_importable() -> bool:
    """True where nvidia-cutlass-dsl (and the CUDA Python bindings it needs) import."""
    try:
        _import_dsl()
    except Exception:  # noqa: BLE001 - any import failure means: not here
        return False
    return True


def cute_available(device: Any) -> bool:
    """True on a CUDA device of compute capability 9.0 (Hopper) where nvidia-cutlass-dsl imports."""
    device = torch.device(device)
    return (device.type == "cuda" and torch.cuda.is_available()
            and torch.cuda.get_device_capability(device) == (9, 0) and cute_importable())


def _cute_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
               idx: torch.Tensor, nkept: torch.Tensor, km_hi: torch.Tensor, km_lo: torch.Tensor, vsum: torch.Tensor,
               keep: torch.Tensor) -> tuple[Any, ...]:
    """Torch tensors ([B*H, N, D], lse [B*H, N], idx and keep [B*H, Nqb, Nkb], nkept [B*H, Nqb], block
    means and value sums [B*H, Nkb, D]) as the kernel's CuTe views: Q, K, O (N, D, B*H); V (D, N, B*H);
    lse (N, B*H); idx, keep (Nkb, Nqb, B*H); nkept (Nqb, B*H); means (Nkb, D, B*H); value sums
    (D, Nkb, B*H). Layouts are marked dynamic, so one compiled kernel serves every sequence length and
    head count."""
    _import_dsl()
    from cutlass.cute.runtime import from_dlpack

    def view(t: torch.Tensor, lead: int) -> Any:
        return from_dlpack(t, assumed_align=16).mark_layout_dynamic(leading_dim=lead)

    return (view(q.permute(1, 2, 0), 1), view(k.permute(1, 2, 0), 1), view(v.permute(2, 1, 0), 0),
            view(o.permute(1, 2, 0), 1), view(lse.permute(1, 0), 0), view(idx.permute(2, 1, 0), 0),
            view(nkept.permute(1, 0), 0), view(km_hi.permute(1, 2, 0), 1), view(km_lo.permute(1, 2, 0), 1),
            view(vsum.permute(2, 1, 0), 0), view(keep.permute(2, 1, 0), 0))


def _compiled(args: tuple[Any, ...], d: int, dtype: torch.dtype, stream: Any, correction: bool,
              ptx_dir: str | None = None) -> Any:
    """The kernel compiled for these dtypes (once per process); ``ptx_dir``: compile for sm_90a without a GPU
    and write the PTX there (not cached)."""
    mod = _import_dsl()
    import cutlass
    import cutlass.cute as cute

    # what the compiled code depends on (CUTE_LAUNCH["correction"] only picks ``correction``)
    key = (d, dtype, correction, CUTE_LAUNCH["stages"], CUTE_LAUNCH["q_regs"])
    if ptx_dir is None and key in _COMPILED:
        return _COMPILED[key]
    kernel = mod.SolKeptSm90(d, CUTE_LAUNCH["stages"], correction, CUTE_LAUNCH["q_regs"])
    if ptx_dir is not None:
        return cute.compile(kernel, *args, cutlass.Float32(1.0), stream,
                            options=f"--gpu-arch sm_90a --keep-ptx --dump-dir={ptx_dir}")
    _COMPILED[key] = cute.compile(kernel, *args, cutlass.Float32(1.0), stream)
    return _COMPILED[key]


def kept_attention_cute(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, r: dict[str, torch.Tensor],
                        correction: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over each query block's kept key blocks (``r`` from ``route``), with ``correction`` also
    the rejected blocks' approximation: (O normalised, [B*H, N, D] in q's dtype; base-2 log-sum-exp,
    [B*H, N] float32). q, k, v: [B, H, N, D] bf16/fp16 on a Hopper GPU."""
    _import_dsl()
    import cuda.bindings.driver as cuda
    import cutlass

    b, h, n, d = q.shape
    qf, kf, vf = (t.reshape(b * h, n, d).contiguous() for t in (q, k, v))
    out = torch.empty_like(qf)
    lse = torch.empty(b * h, n, dtype=torch.float32, device=q.device)
    km_hi, km_lo = split_hi_lo(r["kmean"], q.dtype)  # hi + lo: ~16 mantissa bits, as in the Triton kernel
    vsum = r["vsum"].to(q.dtype).contiguous()  # bf16, like the values themselves (Triton's value_lo off)
    args = _cute_args(qf, kf, vf, out, lse, r["idx"], r["nkept"], km_hi, km_lo, vsum, r["keep"])
    stream = cuda.CUstream(torch.cuda.current_stream(q.device).cuda_stream)
    _compiled(args, d, q.dtype, stream, correction)(*args, cutlass.Float32(math.log2(math.e) / math.sqrt(d)), stream)
    return out, lse


def sol_attention_cute(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: float, block: int = 64,
                       sigma: str = "exact", neighbours: int = 1, correction: bool = True
                       ) -> tuple[torch.Tensor, float]:
    """Same contract as ``sol_attention_reference``: [B, H, N, D] in, (output in q's dtype, density) out."""
    out, density = sol_attention_cute_t(q, k, v, beta, block, sigma, neighbours, correction)
    return out, float(density)


def sol_attention_cute_t(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: float, block: int = 64,
                         sigma: str = "exact", neighbours: int = 1, correction: bool = True
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """``sol_attention_cute`` with the density as a 0-d tensor on q's device (no host read)."""
    if not cute_available(q.device):
        raise RuntimeError("the CuTe Sol kernel needs a Hopper GPU (compute capability 9.0) with nvidia-cutlass-dsl "
                           "installed (pip install 'vidtune[gpu]'); use sparse_attention backend=triton or reference")
    if block != 64 or q.shape[-1] not in (64, 128):
        raise ValueError(f"the CuTe kernel takes blocks of 64 and head dim 64 or 128; got block {block}, head dim "
                         f"{q.shape[-1]}")
    if q.dtype == torch.float32:  # the tensor cores take bf16: round the inputs, return float32
        out, density = sol_attention_cute_t(q.bfloat16(), k.bfloat16(), v.bfloat16(), beta, block, sigma, neighbours,
                                            correction)
        return out.float(), density
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"the CuTe kernel takes bf16, fp16 or float32 inputs, got {q.dtype}")
    r = route(q, k, v, beta, block, sigma, neighbours)
    fused = correction and CUTE_LAUNCH["correction"] == "fused"
    out, lse = kept_attention_cute(q, k, v, r, correction=fused)
    b, h, n, d = q.shape
    if correction and not fused:
        return launch(q, k, v, r, block, True, init=(out, lse)), r["density"]
    return out.reshape(b, h, n, d), r["density"]


def compile_ptx(head_dim: int = 128, n: int = 300, heads: int = 2, correction: bool = True) -> str:
    """Compile the kernel for sm_90a without a GPU and return its PTX (CI's check that it builds)."""
    import tempfile

    import cuda.bindings.driver as cuda

    nqb = -(-n // 64)
    q = torch.zeros(heads, n, head_dim, dtype=torch.bfloat16)
    means = torch.zeros(heads, nqb, head_dim, dtype=torch.bfloat16)
    idx = torch.zeros(heads, nqb, nqb, dtype=torch.int32)
    args = _cute_args(q, q, q, q, torch.zeros(heads, n), idx, torch.zeros(heads, nqb, dtype=torch.int32), means,
                      means, means, idx.to(torch.int8))
    with tempfile.TemporaryDirectory() as tmp:
        _compiled(args, head_dim, torch.bfloat16, cuda.CUstream(0), correction, ptx_dir=tmp)
        ptx = [f for f in os.listdir(tmp) if f.endswith(".ptx")]
        if not ptx:
            raise RuntimeError("nvidia-cutlass-dsl compiled the kernel but wrote no PTX")
        with open(os.path.join(tmp, ptx[0])) as fh:
            return fh.read()
