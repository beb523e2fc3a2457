"""Quality metrics on inputs with known answers; media files that really parse."""

from __future__ import annotations

import math

import pytest
import torch

from vidtune.model.media import probe_mp4, read_raw, write_mp4, write_raw
from vidtune.search.metrics import PSNR_CAP_DB, audio_snr_db, psnr_db, quality


def _frames(seed: int = 0, f: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(20, 236, (f, 32, 48, 3), generator=g, dtype=torch.uint8)


def test_psnr_known_noise_level():
    ref = _frames()
    out = ref.clone()
    out.view(-1)[::2] += 2  # every other value off by exactly 2 -> MSE = 2^2 / 2 = 2
    expected = 10 * math.log10(255**2 / 2.0)  # 45.12 dB
    assert psnr_db(ref, out) == pytest.approx([expected] * 3, abs=1e-9)


def test_psnr_identical_is_capped_and_worst_frame_reported():
    ref = _frames()
    out = ref.clone()
    out[1] = 255 - out[1]
    q = quality(ref, torch.zeros(2, 100), out, torch.zeros(2, 100))
    assert q.psnr_db_worst < 10 and q.psnr_db == pytest.approx((2 * PSNR_CAP_DB + q.psnr_db_worst) / 3)
    assert q.ssim_worst < 0.2 < q.ssim and not q.identical
    same = quality(ref, torch.ones(2, 10), ref.clone(), torch.ones(2, 10))
    assert same.identical and same.psnr_db == PSNR_CAP_DB and same.ssim == 1.0 and same.audio_snr_db == PSNR_CAP_DB


@pytest.mark.parametrize("shape,noise", [((3, 32, 48), 2), ((2, 7, 9), 40), ((2, 64, 67), 0), ((4, 45, 80), 255)])
def test_ssim_equals_scikit_image(shape, noise):
    """The torch SSIM (used in every trial, on the GPU there) is scikit-image's SSIM: smooth frames
    with noise of several strengths, odd sizes, the 7x7 minimum; float64 sums in a different order
    only, hence 1e-9 rather than exact."""
    import numpy as np
    from skimage.metrics import structural_similarity

    from vidtune.search.metrics import ssim_per_frame

    g = torch.Generator().manual_seed(sum(shape) + noise)
    f, h, w = shape
    yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    smooth = torch.stack([(127 + 100 * torch.sin(xx / 5 + k) * torch.cos(yy / 7 + c)) for k in range(f)
                          for c in range(3)]).reshape(f, 3, h, w).permute(0, 2, 3, 1)
    ref = smooth.round().clamp(0, 255).to(torch.uint8)
    out = (ref.int() + torch.randint(-noise, noise + 1, ref.shape, generator=g)).clamp(0, 255).to(torch.uint8)
    mine = ssim_per_frame(ref, out)
    theirs = np.array([structural_similarity(ref[i].numpy(), out[i].numpy(), channel_axis=-1, data_range=255)
                       for i in range(f)])
    np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-9)
    assert (noise == 0) == bool(np.all(mine == 1.0))
    with pytest.raises(ValueError, match="at least 7x7"):
        ssim_per_frame(ref[:, :6], out[:, :6])


def test_psnr_equals_scikit_image_and_streaming_changes_nothing(monkeypatch):
    """PSNR per frame is scikit-image's peak_signal_noise_ratio (exact integer sums, so to 1e-9 at any
    error size, the largest included), and quality() gives the same numbers a frame at a time as in one
    chunk: the streaming over frames (what keeps a 4K video's metrics within the device's memory)."""
    import numpy as np
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    import vidtune.search.metrics as metrics

    g = torch.Generator().manual_seed(3)
    ref = torch.randint(0, 256, (5, 40, 56, 3), generator=g, dtype=torch.uint8)
    noise = torch.randint(-9, 10, ref.shape, generator=g)
    out = (ref.int() + noise * torch.arange(1, 6).view(5, 1, 1, 1)).clamp(0, 255).to(torch.uint8)
    out[4] = 255 - ref[4]  # differences up to 255 everywhere
    theirs = np.array([peak_signal_noise_ratio(ref[i].numpy(), out[i].numpy(), data_range=255) for i in range(5)])
    np.testing.assert_allclose(psnr_db(ref, out), theirs, rtol=0, atol=1e-9)
    audio = torch.randn(2, 300, generator=g)
    whole = quality(ref, audio, out, audio * 1.01)
    monkeypatch.setattr(metrics, "_chunk_frames", lambda frames, budget=0: 1)
    assert quality(ref, audio, out, audio * 1.01) == whole
    assert whole.psnr_db == pytest.approx(theirs.mean(), abs=1e-9) and whole.psnr_db_worst == pytest.approx(theirs.min())
    np.testing.assert_allclose(metrics.ssim_per_frame(ref, out), [
        structural_similarity(ref[i].numpy(), out[i].numpy(), channel_axis=-1, data_range=255) for i in range(5)],
        rtol=0, atol=1e-9)


def test_audio_snr_known():
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(2, 4800, generator=g)
    # noise = 0.1 x signal; the product is formed in float32 (relative error 6e-8 -> 1e-6 dB)
    assert audio_snr_db(ref, ref * 1.1) == pytest.approx(20.0, abs=1e-5)
    assert audio_snr_db(ref, ref * 0.9) == pytest.approx(20.0, abs=1e-5)


def test_quality_rejects_non_uint8_and_mismatched_shapes():
    with pytest.raises(ValueError, match="raw uint8"):
        psnr_db(_frames().float(), _frames().float())
    with pytest.raises(ValueError, match="frame shapes differ"):
        psnr_db(_frames(f=3), _frames(f=2))


def test_mp4_has_frames_and_audio(tmp_path, tiny_reference_output, tiny_request):
    out = tiny_reference_output
    path = write_mp4(tmp_path / "v.mp4", out.frames, tiny_request.fps, out.audio, out.sample_rate)
    info = probe_mp4(path)
    assert info["frames"] == tiny_request.frames
    assert (info["width"], info["height"]) == (tiny_request.width, tiny_request.height)
    assert info["audio_streams"] == 1 and info["audio_codec"] == "aac" and info["audio_rate"] == out.sample_rate
    raw = write_raw(tmp_path / "o.safetensors", out.frames, out.audio, out.sample_rate, tiny_request.fps)
    frames, audio, sr, fps = read_raw(raw)
    assert torch.equal(frames, out.frames) and torch.equal(audio, out.audio) and sr == out.sample_rate and fps == 24.0
