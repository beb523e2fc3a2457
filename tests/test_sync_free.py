"""No host synchronisation in the hot path, counted on a GPU with ``torch.cuda.set_sync_debug_mode``.

Every technique's whole generation (tiny preset, CUDA) may synchronise no more often than the baseline
does, plus its own allowance: a cache decides with one device-to-host read per step (11 steps: 8 in
stage 1, 3 in stage 2), everything else none (Sol's density, tile weights and the like are read once per
run with the pipeline's other statistics). The CPU counterpart (``tests/test_caching.py``) counts the
host reads per step where no GPU is present.
"""

from __future__ import annotations

import warnings

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


def _syncs(pipe: ReferencePipeline, request: GenerationRequest) -> int:
    pipe.run(request)  # warm (autotuning, allocator) before counting
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            pipe.run(request)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in seen)


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
        if n > baseline + allowed:
            over[name] = (n, baseline, allowed)
    assert not over, f"syncs per generation (setting, baseline, allowed): {over}"


def test_the_settings_counted_are_valid():
    """(On the CPU: the GPU test's settings name real knobs and values, so it cannot fail on a typo.)"""
    from vidtune.techniques.registry import check_composition, resolve_values

    for setting, allowed in SETTINGS.values():
        assert list(check_composition(resolve_values(setting))) and allowed >= 0
