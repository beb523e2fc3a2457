"""kernel_choice.fused_norms: the block transcription is bit-identical to ltx-core's; the Triton kernels
(Triton's interpreter on the CPU) match the references to one bf16 rounding."""

from __future__ import annotations

import os

import pytest
import torch

from vidtune.kernels.fused_norms import (
    adaln_rmsnorm_reference,
    adaln_rmsnorm_triton,
    gated_residual_reference,
    gated_residual_triton,
)
from vidtune.model import GenerationRequest, ReferencePipeline
from vidtune.search.metrics import psnr_db
from vidtune.techniques import CompositionError, get
from vidtune.techniques.registry import check_composition

interpreter = pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs CUDA or Triton's interpreter (conftest sets it before Triton loads)")


@pytest.mark.parametrize("mode", ["distilled", "multistep"])  # multistep: the STG and modality perturbations
def test_reference_backend_is_bit_identical_to_ltx_core(mode, tiny_models, tiny_request):
    req = GenerationRequest(**{**tiny_request.to_dict(), "mode": mode, "steps": 3})
    ref = ReferencePipeline(tiny_models).run(req)
    pipe = ReferencePipeline(tiny_models)
    with get("kernel_choice.fused_norms").apply(pipe, {"ops": "norms+gates", "backend": "reference"}):
        out = pipe.run(req)
    assert torch.equal(out.frames, ref.frames) and torch.equal(out.audio, ref.audio)


@interpreter
@pytest.mark.parametrize("b,t,c,per_token", [(1, 100, 64, True), (2, 37, 96, False), (1, 5, 200, True)])
def test_triton_kernels_match_references(b, t, c, per_token):
    g = torch.Generator().manual_seed(c)
    x, y = (torch.randn(b, t, c, generator=g).bfloat16() for _ in range(2))
    scale, shift = (0.1 * torch.randn(b, t if per_token else 1, c, generator=g).bfloat16() for _ in range(2))
    got = adaln_rmsnorm_triton(x, scale, shift, 1e-6)
    want = adaln_rmsnorm_reference(x.float(), scale.float(), shift.float(), 1e-6)
    # float32 inside, one rounding to bf16 at the end: within one bf16 ulp of |values| <= 8 (2^-5)
    assert got.dtype == torch.bfloat16 and (got.float() - want).abs().max() <= 2**-5
    got = gated_residual_triton(x, y, scale)
    want = gated_residual_reference(x.float(), y.float(), scale.float())
    assert (got.float() - want).abs().max() <= 2**-5


@interpreter
def test_triton_backend_on_tiny_is_at_the_noise_floor(tiny_models):
    req = GenerationRequest(prompt="fused", seed=1, height=128, width=192, frames=9, fps=24.0)
    ref = ReferencePipeline(tiny_models).run(req)
    pipe = ReferencePipeline(tiny_models)
    with get("kernel_choice.fused_norms").apply(pipe, {"ops": "norms+gates", "backend": "triton"}):
        out = pipe.run(req)
    # measured 50.1 dB on 256x384x17 (the flash-vs-default backend noise floor was 50.6 dB): rounding
    # once instead of after every elementwise op; 40 dB leaves room for other shapes
    assert psnr_db(ref.frames, out.frames).min() > 40.0
    assert not torch.equal(out.frames, ref.frames)  # the kernels did run


def test_fused_norms_rejects_cuda_graphs_and_needs_a_device_for_triton(tiny_models, monkeypatch):
    with pytest.raises(CompositionError, match="blocks.forward"):
        check_composition({"kernel_choice.fused_norms": {"ops": "norms"}, "kernel_choice.cuda_graphs": {"enabled": True}})
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(Exception, match="backend=triton needs a CUDA device"):
        get("kernel_choice.fused_norms").apply(ReferencePipeline(tiny_models), {"ops": "norms"})
