"""GPU-only checks (marked ``gpu``; skipped without CUDA). Their CPU counterparts run in CI."""

from __future__ import annotations

import pytest
import torch

from vidtune.model import GenerationRequest, ModelSource, ReferencePipeline, load_models

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda_pipeline():
    return ReferencePipeline(load_models(ModelSource(preset="tiny"), device="cuda"), device="cuda")


def test_tiny_on_cuda_is_deterministic(cuda_pipeline):
    r = GenerationRequest(seed=5)
    a, b = cuda_pipeline.run(r), cuda_pipeline.run(r)
    assert torch.equal(a.frames, b.frames) and torch.equal(a.audio, b.audio)


@pytest.mark.parametrize("backend", ["cudnn", "flash", "efficient", "math"])
def test_sdpa_backends_match_reference_on_gpu(backend):
    from vidtune.kernels.sdpa import SDPAAttention, sdpa_reference

    g = torch.Generator(device="cuda").manual_seed(0)
    for tq, tk, h, d in [(512, 512, 4, 64), (126, 4096, 8, 64), (1000, 1000, 2, 128)]:
        q, k, v = (torch.randn(1, n, h * d, generator=g, device="cuda").bfloat16() for n in (tq, tk, tk))
        out = SDPAAttention(backend)(q, k, v, h).float()
        assert torch.allclose(out, sdpa_reference(q, k, v, h).float(), atol=2e-2, rtol=1e-2)


def test_trial_quality_on_cuda_equals_the_cpu_measure():
    """A trial's SSIM is computed on its GPU (``ssim_per_frame``); it must be scikit-image's number."""
    from vidtune.search.metrics import quality

    g = torch.Generator().manual_seed(3)
    ref = torch.randint(0, 256, (5, 96, 160, 3), generator=g, dtype=torch.uint8)
    out = (ref.int() + torch.randint(-9, 10, ref.shape, generator=g)).clamp(0, 255).to(torch.uint8)
    audio = torch.randn(2, 1000, generator=g)
    cpu, gpu = quality(ref, audio, out, audio * 0.99), quality(ref, audio, out, audio * 0.99, "cuda")
    assert abs(cpu.ssim - gpu.ssim) < 1e-9 and abs(cpu.ssim_worst - gpu.ssim_worst) < 1e-9
    assert (cpu.psnr_db, cpu.audio_snr_db) == (gpu.psnr_db, gpu.audio_snr_db)
