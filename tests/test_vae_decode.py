"""kernel_choice.vae_decode on the tiny preset (CPU): compiled decoder modules, channels-last weights, cuDNN tuning."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from vidtune.model import ReferencePipeline
from vidtune.search.metrics import psnr_db
from vidtune.techniques import compose, get
from vidtune.techniques.kernel_choice.vae_decode import compiled_modules


def test_compiled_channels_last_decode_on_cut_tiles(tiny_models, tiny_request):
    pipe = ReferencePipeline(tiny_models)
    decoder = tiny_models.video_decoder
    # 256 x 384 pixels in 128-px tiles with 32 px of overlap: tiles of several sizes at the edges
    tiles = {"tiling.vae_tiles": {"spatial_px": 128, "spatial_overlap_px": 32}}
    with compose(pipe, tiles):
        reference = pipe.run(tiny_request)
    torch._dynamo.reset()
    counters.clear()
    with compose(pipe, {**tiles, "kernel_choice.vae_decode": {"compile": "default", "channels_last": True}}):
        assert all(p.is_contiguous(memory_format=torch.channels_last_3d) for p in decoder.parameters() if p.dim() == 5)
        first = pipe.run(tiny_request)
        graphs = counters["stats"]["unique_graphs"]
        second = pipe.run(tiny_request)
        # a graph per compiled module whatever the tile sizes (dynamic shapes; measured: 9 modules, 10 graphs,
        # the extra one where duck sizing made a 3 x 3 latent tile its own graph), none added by a rerun
        assert len(compiled_modules(decoder)) == 9 and 9 <= graphs <= 11
        assert counters["stats"]["unique_graphs"] == graphs
    assert torch.equal(first.frames, second.frames)
    assert torch.equal(first.stage2.video, reference.stage2.video)  # the decode is all it changes
    assert 40 < psnr_db(reference.frames, first.frames).mean() < 100  # Inductor's fused norms round differently
    # undone: the eager modules and contiguous weights, the reference output bit for bit
    assert not any("forward" in m.__dict__ for m in decoder.modules())
    assert all(p.is_contiguous() for p in decoder.parameters())
    with compose(pipe, tiles):
        assert torch.equal(pipe.run(tiny_request).frames, reference.frames)


def test_cudnn_benchmark_only_during_the_decode(tiny_models, tiny_request, tiny_reference_output):
    pipe = ReferencePipeline(tiny_models)
    seen = []
    hook = tiny_models.video_decoder.conv_in.register_forward_pre_hook(lambda *_: seen.append(torch.backends.cudnn.benchmark))
    before = torch.backends.cudnn.benchmark
    try:
        with get("kernel_choice.vae_decode").apply(pipe, {"cudnn_benchmark": True}):
            out = pipe.run(tiny_request)
            assert torch.backends.cudnn.benchmark == before
    finally:
        hook.remove()
    assert seen and all(seen) and not before
    assert torch.equal(out.frames, tiny_reference_output.frames)  # no cuDNN on a CPU: unchanged


def test_bench_counts_graphs_compiled_while_timed(tmp_path, capsys):
    """``vidtune bench --no-rewarm`` skips the untimed pair and still says whether a timed run compiled."""
    import json

    from vidtune.cli import main

    args = ["bench", "model=tiny", f"results_dir={tmp_path}", "name=vd", "eval.warmup=0", "eval.repeats=1",
            "--knobs", "kernel_choice.vae_decode.compile=default", "--repeats", "2", "--no-rewarm"]
    torch._dynamo.reset()
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rewarm"] is False and out["warmup_s"] > 0 and len(out["tuned_total_ms"]) == 2
    # re-applied after each baseline run, the decoder's graphs are found again: no compile in a timed run
    assert out["graphs_compiled_while_timed"] == 0
    assert out["stages"]["decode_video"]["tuned_ms"] > 0
    # the warm-up's own account: its first run paid the decoder's compile
    assert out["warmup"]["first_run_ms"]["decode_video"] > 5 * out["stages"]["decode_video"]["tuned_ms"]


@pytest.mark.gpu
def test_vae_decode_knobs_on_the_gpu():
    """On a GPU (cuDNN, Inductor): every knob on stays close to the eager decode and compiles nothing on rerun."""
    from vidtune.model import GenerationRequest, ModelSource, load_models

    models = load_models(ModelSource(preset="tiny"), device="cuda")
    request = GenerationRequest(prompt="a red circle bouncing", seed=7, height=256, width=384, frames=17)
    pipe = ReferencePipeline(models, device="cuda")
    eager = pipe.run(request)
    torch._dynamo.reset()
    counters.clear()
    with get("kernel_choice.vae_decode").apply(pipe, {"compile": "default", "channels_last": True, "cudnn_benchmark": True}):
        first = pipe.run(request)
        graphs = counters["stats"]["unique_graphs"]
        pipe.run(request)
        assert counters["stats"]["unique_graphs"] == graphs
    assert torch.equal(first.stage2.video, eager.stage2.video)
    assert float(psnr_db(eager.frames, first.frames).mean()) > 40.0


def test_bench_reference_run_stores_no_baseline(tmp_path, capsys):
    """``vidtune bench --reference run``: the quality reference is an untimed baseline run of the process;
    no baseline is stored, and a setting that changes nothing scores identical frames against it."""
    import json

    from vidtune.cli import main

    args = ["bench", "model=tiny", f"results_dir={tmp_path}", "name=vd", "eval.warmup=0", "quality_model.model=self",
            "--knobs", "kernel_choice.vae_decode.cudnn_benchmark=true", "--repeats", "1", "--no-rewarm",
            "--reference", "run"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reference"] == "run" and len(out["baseline_total_ms"]) == 1
    assert not (tmp_path / "vd" / "baseline").exists()
    q = out["quality"]
    assert q["psnr_db"] >= 100 and q["psnr_db_worst"] >= 100  # (cuDNN's setting is a no-op on a CPU)
