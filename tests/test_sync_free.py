"""No host synchronisation in the hot path, counted on a GPU with ``torch.cuda.set_sync_debug_mode``.

Every technique's whole generation (tiny preset, CUDA) may synchronise no more often than the baseline
does, plus its own allowance: a cache decides with one device-to-host read per step (11 steps: 8 in
stage 1, 3 in stage 2), everything else none (Sol's density, tile weights and the like are read once per
run with the pipeline's other statistics). The CPU counterpart (``tests/test_caching.py``) counts the
host reads per step where no GPU is present.
"""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch

from vidtune.model import GenerationRequest, ModelSource, ReferencePipeline, load_models
from vidtune.techniques import compose

STEPS = 8 + 3
SETTINGS = {  # name -> (setting, syncs allowed beyond the baseline's)
    "sol_triton": ({"sparse_attention.sol": {"beta": 1.25, "backend": "triton", "stages": "both"}}, 0),
    "block_sparse_triton": ({"sparse_attention.block_sparse": {"beta": 1.0, "backend": "triton"}}, 0),
    "fp8": ({"kernel_choice.fp8_linear": {"layers": "all"}}, 0),
    "fused_norms": ({"kernel_choice.fused_norms": {"ops": "norms+gates"}}, 0),
    "first_block": ({"caching.first_block": {"threshold": 0.1}}, STEPS),
    "teacache": ({"caching.teacache": {"threshold": 0.3}}, STEPS),
    "stage2_tiles": ({"tiling.stage2_tiles": {"rows": 2, "cols": 2, "overlap": 2}}, 0),
    "vae_decode": ({"kernel_choice.vae_decode": {"channels_last": True, "cudnn_benchmark": True}}, 0),
}


def _syncs(pipe: ReferencePipeline, request: GenerationRequest) -> Counter:
    """The synchronising calls of one warm generation, counted per source line (file:line of the caller)."""
    pipe.run(request)  # warm (autotuning, allocator) before counting
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            pipe.run(request)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return Counter(f"{w.filename}:{w.lineno}" for w in seen if "synchroniz" in str(w.message))


@pytest.mark.gpu
def test_no_technique_adds_host_syncs_on_the_gpu():
    models = load_models(ModelSource(preset="tiny"), device="cuda")
    request = GenerationRequest(prompt="a red circle bouncing", seed=7, height=256, width=384, frames=17)
    pipe = ReferencePipeline(models, device="cuda")
    baseline = _syncs(pipe, request)
    over = {}
    for name, (setting, allowed) in SETTINGS.items():
        with compose(pipe, setting):
            n = _syncs(pipe, request)
        if n.total() > baseline.total() + allowed:
            # where the setting synchronises more often than the baseline: the lines to fix
            over[name] = (n.total(), baseline.total(), allowed, dict(n - baseline))
    assert not over, f"syncs per generation (setting, baseline, allowed, lines with more): {over}"


def test_the_settings_counted_are_valid():
    """(On the CPU: the GPU test's settings name real knobs and values, so it cannot fail on a typo.)"""
    from vidtune.techniques.setting import check_composition, resolve_values

    for setting, allowed in SETTINGS.values():
        assert list(check_composition(resolve_values(setting))) and allowed >= 0


def test_rope_grids_are_served_from_the_device_unchanged(monkeypatch):
    """(On the CPU.) ``rope_grids_on``: ltx-core's frequency grids come from a per-device cache, equal to the
    host's bit for bit, the same tensor on every pass (no copy a pass: on a GPU each copy synchronises);
    installing it twice keeps one host function underneath."""
    from ltx_core.model.transformer import transformer_args

    from vidtune.model.pipeline import rope_grids_on

    host = {n: getattr(transformer_args, n) for n in ("generate_freq_grid_pytorch", "generate_freq_grid_np")}
    for name, fn in host.items():
        monkeypatch.setattr(transformer_args, name, fn)
    rope_grids_on(torch.device("cpu"))
    rope_grids_on(torch.device("cpu"))
    for name, fn in host.items():
        served = getattr(transformer_args, name)
        assert served.vt_host is getattr(fn, "vt_host", fn)
        got = served(10000.0, 3, 96)
        assert got is served(10000.0, 3, 96) and got.device.type == "cpu"
        assert torch.equal(got, served.vt_host(10000.0, 3, 96))


def test_stage2_tile_weights_are_on_the_device_once_per_stage(tiny_models, tiny_request):
    """(On the CPU.) The tiled stage 2 keeps its blend weights on the pipeline's device and its audio shares
    as numbers (no copy or host read per tile and step); the shares sum to one."""
    pipe = ReferencePipeline(tiny_models, device="cpu")
    with compose(pipe, {"tiling.stage2_tiles": {"rows": 2, "cols": 2, "overlap": 2}}):
        pipe.run(tiny_request)
    grid = pipe._stage2_grid
    assert len(grid["weights"]) == len(grid["tiles"]) == 4
    assert all(w.device == pipe.device and torch.equal(w, t.weight) for w, t in zip(grid["weights"], grid["tiles"]))
    assert all(isinstance(s, float) for s in grid["audio_shares"]) and abs(sum(grid["audio_shares"]) - 1) < 1e-6  # (float32 weights)
