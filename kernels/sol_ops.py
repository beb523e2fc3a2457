"""Sol sparse attention as one PyTorch custom operator, so torch.compile keeps it inside a block's graph.

``vidtune::sol_attention(q, k, v, beta, block, sigma, correction, backend) -> (out, density)`` runs the
routing and the kept-block kernel of the chosen backend (``reference``: PyTorch, any device; ``triton``;
``cute``: Hopper). Why an operator: Dynamo cannot trace the Triton launcher (it stops at
``triton._C.libtriton.native_specialize_impl``, seen on the H200 with the 4K setting) nor the CuTe DSL's,
so a compiled block holding the kernels broke into a graph per attention call; as an opaque operator with
a fake (meta) implementation the block is one graph. The density is a 0-d float32 tensor on q's device:
it is read on the host once, when the run's statistics are (``ReferencePipeline.run_stats``), never in
the hot path.
"""

from __future__ import annotations

import torch

__all__ = ["SOL_BACKENDS", "sol_attention_op"]

SOL_BACKENDS = ("reference", "triton", "cute")


@torch.library.custom_op("vidtune::sol_attention", mutates_args=())
def _sol_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: float, block: int, sigma: str,
                   correction: bool, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    if backend == "reference":
        from vidtune.kernels.sol_attention import sol_attention_reference_t as kernel
    elif backend == "triton":
        from vidtune.kernels.sol_triton import sol_attention_triton_t as kernel
    elif backend == "cute":
        from vidtune.kernels.sol_cute import sol_attention_cute_t as kernel
    else:
        raise ValueError(f"backend must be one of {list(SOL_BACKENDS)}, got {backend!r}")
    out, density = kernel(q, k, v, beta, block=block, sigma=sigma, correction=correction)
    # an operator's outputs may not alias its inputs or each other (the reference returns q's dtype as is)
    return out.contiguous() if out.data_ptr() != q.data_ptr() else out.clone(), density.to(torch.float32).reshape(())


@_sol_attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: float, block: int, sigma: str, correction: bool,
      backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty(q.shape, dtype=q.dtype, device=q.device), q.new_empty((), dtype=torch.float32)


def sol_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: float, block: int = 64,
                     sigma: str = "exact", correction: bool = True, backend: str = "reference"
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sol attention on [B, H, N, D] tensors through the custom operator: (output in q's dtype, density as a
    0-d float32 tensor on q's device). Same numbers as the backend's own function."""
    return _sol_attention(q, k, v, float(beta), int(block), sigma, bool(correction), backend)
