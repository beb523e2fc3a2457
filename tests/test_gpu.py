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


def test_mini_transformer_trains_on_cuda_with_gpu_noise(tmp_path):
    """The transformer's training step on the GPU: noise from a CUDA generator, host tensors copied from
    pinned memory, losses read only when logged; the logged losses are finite floats. The synchronising
    calls left inside the step are counted (CUDA's sync debug mode) and printed: ltx-core's forward
    copies its RoPE frequency grid and patch sizes from host memory each pass (rope.py,
    patchifiers.py), so the step is not free of them, only of its own."""
    import json
    import math
    import warnings

    from vidtune.model.mini import train as T

    kw = dict(batch=2, height=128, width=192, frames=9, save_every=1, log_every=2)
    for c in ("video_vae", "audio_vae"):  # the transformer trains on their (frozen) encoders
        T.train(T.TrainConfig(component=c, out=str(tmp_path), steps=1, device="cuda", **kw))
    real = T.STEPS["transformer"]
    seen: dict[str, list] = {"devices": [], "syncs": []}

    def watched(mods, batch, cfg, g):
        seen["devices"].append(g.device.type)
        if "_latents" not in batch:  # a fresh batch is encoded first (the VAE encoders): not counted
            return real(mods, batch, cfg, g)
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                return real(mods, batch, cfg, g)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            seen["syncs"] += [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message)]

    T.STEPS["transformer"] = watched
    try:
        # step 1 encodes its batch (not counted); reuse 2 keeps step 2, the counted one, on the same batch
        T.train(T.TrainConfig(component="transformer", out=str(tmp_path), steps=2, device="cuda", reuse=2, **kw))
    finally:
        T.STEPS["transformer"] = real
    print(f"synchronising calls in one transformer step: {len(seen['syncs'])}", *seen["syncs"][:10], sep="\n  ")
    assert seen["devices"] == ["cuda", "cuda"]
    state = torch.load(tmp_path / "transformer.pt", weights_only=False)
    last = state["log"][-1]
    assert state["step"] == 2 and all(isinstance(last[k], float) and math.isfinite(last[k])
                                      for k in ("loss", "video_mse", "audio_mse")), json.dumps(last)
