"""The memory family: FP8 weight storage (techniques/memory/fp8_weights.py), on the CPU with the tiny preset."""

from __future__ import annotations

import pytest
import torch

from vidtune.kernels.fp8 import quantize_weight
from vidtune.model import ReferencePipeline
from vidtune.search.metrics import psnr_db
from vidtune.techniques import compose
from vidtune.techniques.kernel_choice.fp8_linear import target_linears
from vidtune.techniques.memory.fp8_weights import weight_bytes


def _linears(pipe):
    return [lin for t in pipe.transformers() for _, lin in target_linears(t, "all")]


def test_fp8_weights_halve_the_linear_weights_and_compute_with_their_upcast(tiny_models, tiny_request,
                                                                            tiny_reference_output):
    """Stored as FP8: the block linears' weights hold <= 55% of their bf16 bytes (no bf16 copy left on the
    device), and the generation equals, bit for bit, the model whose weights were replaced by hand with
    their FP8 rounding upcast to bf16; undo restores every weight bit for bit."""
    pipe = ReferencePipeline(tiny_models)
    layers = _linears(pipe)
    originals = [lin.weight.detach().clone() for lin in layers]
    bf16 = sum(weight_bytes(lin) for lin in layers)
    with compose(pipe, {"memory.fp8_weights": {"layers": "all"}}):
        stored = sum(weight_bytes(lin) for lin in layers)
        assert all(lin.weight.numel() == 0 for lin in layers)
        info = pipe.applied_info["memory.fp8_weights"]
        assert info["weight_bytes_before"] == bf16 and info["weight_bytes_after"] == stored
        out = pipe.run(tiny_request)
    assert stored <= 0.55 * bf16
    assert all(torch.equal(lin.weight, w) for lin, w in zip(layers, originals))
    # the same generation with the weights rounded by hand
    for lin in layers:
        q = quantize_weight(lin)
        lin.weight.data = (q.q.float() * q.scale).to(lin.weight.dtype)
    try:
        hand = pipe.run(tiny_request)
    finally:
        for lin, w in zip(layers, originals):
            lin.weight.data = w.clone()
    assert torch.equal(out.frames, hand.frames) and torch.equal(out.audio, hand.audio)
    assert torch.equal(pipe.run(tiny_request).frames, tiny_reference_output.frames)
    assert 20 < psnr_db(tiny_reference_output.frames, out.frames).mean() < 100


def test_fp8_weights_with_fp8_matmuls_store_one_copy_and_change_nothing_else(tiny_models, tiny_request):
    """With kernel_choice.fp8_linear, the FP8 matmuls read the weight it quantised (nothing quantised twice):
    the output is bit for bit fp8_linear's alone, with the bf16 copies gone."""
    pipe = ReferencePipeline(tiny_models)
    with compose(pipe, {"kernel_choice.fp8_linear": {"layers": "all"}}):
        alone = pipe.run(tiny_request)
        with_copies = sum(weight_bytes(lin) for lin in _linears(pipe))
    with compose(pipe, {"kernel_choice.fp8_linear": {"layers": "all"}, "memory.fp8_weights": {"layers": "all"}}):
        both = pipe.run(tiny_request)
        without = sum(weight_bytes(lin) for lin in _linears(pipe))
        assert pipe.applied_info["memory.fp8_weights"]["shared_with_fp8_linear"] == len(_linears(pipe))
    assert torch.equal(alone.frames, both.frames) and torch.equal(alone.audio, both.audio)
    assert without <= 0.37 * with_copies  # (fp8_linear alone keeps bf16 + FP8: 3 bytes a weight; now ~1)


def test_chunked_ffn_feeds_at_most_a_chunk_of_tokens_and_computes_the_same(tiny_models, tiny_request,
                                                                          tiny_reference_output):
    """Chunked feed-forward (64 tokens a chunk, below the knob's grid, applied directly): no feed-forward linear
    sees more than 64 tokens at once, and the video matches the reference within rounding (>= 60 dB; the
    function is per token, the GEMMs of fewer rows may round differently)."""
    from vidtune.techniques import get

    pipe = ReferencePipeline(tiny_models)
    widest = []
    ff_linears = [b.ff.net[0].proj for b in pipe.transformer_blocks()]
    hooks = [lin.register_forward_hook(lambda m, args, out: widest.append(args[0].shape[-2])) for lin in ff_linears]
    tech = get("memory.chunked_ffn")
    try:
        with tech.apply_active(pipe, {"chunk_tokens": 64}):
            out = pipe.run(tiny_request)
        chunked = max(widest)
        widest.clear()
        pipe.run(tiny_request)
        whole = max(widest)
    finally:
        for h in hooks:
            h.remove()
    assert chunked == 64 < whole
    assert psnr_db(tiny_reference_output.frames, out.frames).min() >= 60
    assert tech.validate({"chunk_tokens": 4096})["chunk_tokens"] == 4096


def test_offloaded_blocks_are_spread_over_the_depth():
    from vidtune.techniques.memory.block_offload import offloaded_indices

    assert offloaded_indices(48, 0) == [] and offloaded_indices(48, 48) == list(range(48))
    assert offloaded_indices(48, 4) == [11, 23, 35, 47] and offloaded_indices(3, 9) == [0, 1, 2]
    assert offloaded_indices(48, 24) == list(range(1, 48, 2))  # every other block: a resident one between


@pytest.mark.parametrize("offloaded,prefetch", [(2, 1), (48, 2)])
def test_block_offload_streams_the_weights_in_and_out_and_changes_no_bit(tiny_models, tiny_request,
                                                                         tiny_reference_output, offloaded, prefetch):
    """Offloaded blocks hold no weights between their runs (host copies only), get them back just before they
    run (the copy path runs: every pass copies each offloaded block once, the prefetched ones ahead), and the
    generation is bit-identical to the resident model's; undo restores every weight bit for bit."""
    from vidtune.techniques.memory.block_offload import offloaded_indices

    pipe = ReferencePipeline(tiny_models)
    blocks = pipe.transformer_blocks()
    chosen = offloaded_indices(len(blocks), offloaded)
    weights = {i: [p.detach().clone() for p in blocks[i].parameters()] for i in range(len(blocks))}
    seen_inside: list[tuple[int, bool]] = []  # (block, its weights present while it ran)
    hooks = [b.register_forward_hook(lambda m, args, out, i=i: seen_inside.append(
        (i, all(p.numel() for p in m.parameters())))) for i, b in enumerate(blocks)]
    try:
        with compose(pipe, {"memory.block_offload": {"offloaded_blocks": offloaded, "prefetch": prefetch}}):
            info = pipe.applied_info["memory.block_offload"]
            assert info["offloaded_blocks"] == [chosen]
            assert all(p.numel() == 0 for i in chosen for p in blocks[i].parameters())
            out = pipe.run(tiny_request)
            rec = pipe.run_stats()["block_offload_copies"]
            # between runs, what is left loaded is at most the prefetch window
            present = [i for i in chosen if all(p.numel() for p in blocks[i].parameters())]
    finally:
        for h in hooks:
            h.remove()
    assert len(present) <= min(prefetch, len(chosen) - 1)
    assert seen_inside and all(ok for _, ok in seen_inside)  # every block ran with its weights
    runs = sum(1 for i, _ in seen_inside if i == chosen[0])  # the passes the transformer made
    assert rec["blocks_copied"] >= runs * len(chosen) - len(present)
    assert rec["bytes_copied"] > 0 and rec["not_prefetched"] <= runs + 1  # later blocks came prefetched
    assert torch.equal(out.frames, tiny_reference_output.frames) and torch.equal(out.audio, tiny_reference_output.audio)
    # (the latents too: tiny's random weights barely move the decoded frames)
    assert torch.equal(out.stage2.video, tiny_reference_output.stage2.video)
    assert torch.equal(out.stage1.audio, tiny_reference_output.stage1.audio)
    for i, b in enumerate(blocks):
        assert all(torch.equal(p, w) and p.device == w.device for p, w in zip(b.parameters(), weights[i]))
    assert "memory.block_offload" not in pipe.applied_info


def test_block_offload_streams_stored_fp8_weights_and_refuses_compile(tiny_models, tiny_request):
    """With FP8 weights stored (fp8_linear + fp8_weights), the streamed blocks carry their FP8 tensors too (none
    left on the device between runs) and the output is bit for bit the FP8 model's; a compiled block would
    trace the weight swaps, so compile with block offload is refused before any work."""
    from vidtune.techniques.setting import CompositionError

    pipe = ReferencePipeline(tiny_models)
    fp8 = {"kernel_choice.fp8_linear": {"layers": "all"}, "memory.fp8_weights": {"layers": "all"}}
    with compose(pipe, fp8):
        alone = pipe.run(tiny_request)
    with compose(pipe, {**fp8, "memory.block_offload": {"offloaded_blocks": 48, "prefetch": 1}}):
        stored = [lin.vt_fp8_weight for lin in _linears(pipe)]
        assert all(w.q.numel() == w.q_t.numel() == w.scale.numel() == w.scale_row.numel() == 0 for w in stored)
        both = pipe.run(tiny_request)
    assert torch.equal(alone.frames, both.frames) and torch.equal(alone.audio, both.audio)
    with pytest.raises(CompositionError, match="memory.block_offload"):
        with compose(pipe, {"kernel_choice.compile": {"mode": "default", "dynamic": False},
                            "memory.block_offload": {"offloaded_blocks": 2}}):
            pass  # (never reached: compose refuses the pair)


def test_stage_placement_holds_the_decoders_only_during_their_stage_and_changes_no_bit(tiny_models, tiny_request,
                                                                                      tiny_reference_output):
    """The upsampler (with the encoder's statistics) and the decoders hold no weights outside their stage and all
    of them inside it; the generation is bit-identical; with vae_decode's layout and cuDNN knobs it equals
    vae_decode alone; undo restores every weight; a setting that places nothing and cleans nothing is off."""
    from vidtune.techniques import get

    pipe = ReferencePipeline(tiny_models)
    m = pipe.models
    placed = {"upsampler": m.upsampler, "video_encoder": m.video_encoder, "video_decoder": m.video_decoder,
              "audio_decoder": m.audio_decoder, "vocoder": m.vocoder}
    weights = {n: [p.detach().clone() for p in mod.parameters()] for n, mod in placed.items()}
    seen: dict[str, bool] = {}

    def probe(name):
        def hook(mod, args):  # (a pre-hook's return value would replace the arguments)
            seen.setdefault(name, all(p.numel() for p in placed[name].parameters()))
        return hook

    def first_leaf(mod):  # (the decoder is called through ltx-core's decode functions, not its forward)
        return next(c for c in mod.modules() if not list(c.children()) and list(c.parameters(recurse=False)))

    hooks = [first_leaf(placed[n]).register_forward_pre_hook(probe(n)) for n in ("upsampler", "video_decoder", "vocoder")]
    try:
        with compose(pipe, {"memory.stage_placement": {"upsampler": True, "decoders": True, "cleanup": True}}):
            assert all(p.numel() == 0 for mod in placed.values() for p in mod.parameters())
            out = pipe.run(tiny_request)
            assert all(p.numel() == 0 for mod in placed.values() for p in mod.parameters())  # (dropped again)
            info = pipe.applied_info["memory.stage_placement"]
    finally:
        for h in hooks:
            h.remove()
    assert seen == {"upsampler": True, "video_decoder": True, "vocoder": True}
    assert sorted(info["components"]) == sorted(placed) and info["placed_bytes"] > 0
    assert torch.equal(out.frames, tiny_reference_output.frames) and torch.equal(out.audio, tiny_reference_output.audio)
    assert torch.equal(out.upsampled, tiny_reference_output.upsampled)
    for n, mod in placed.items():
        assert all(torch.equal(p, w) for p, w in zip(mod.parameters(), weights[n]))
    vae = {"kernel_choice.vae_decode": {"channels_last": True, "cudnn_benchmark": True}}
    with compose(pipe, vae):
        alone = pipe.run(tiny_request)
    with compose(pipe, {**vae, "memory.stage_placement": {"decoders": True}}):
        both = pipe.run(tiny_request)
    assert torch.equal(alone.frames, both.frames)
    tech = get("memory.stage_placement")
    assert tech.is_off({}) and tech.stages_for(tech.validate({"decoders": True})) == ("decode_video", "decode_audio")


@pytest.mark.gpu
def test_peak_memory_budget_and_fp8_weights_on_the_gpu():
    """On CUDA: an evaluation's peak is the allocator's, at least every stage's; a budget turns an allocation
    above it into an OOM the worker records as such; FP8 weight storage frees at least 40% of the block
    linears' bf16 bytes from the device."""
    from vidtune.model import GenerationRequest, ModelSource, load_models
    from vidtune.search.evaluator import ensure_baseline, evaluate
    from vidtune.search.records import failure_reason
    from vidtune.search.worker import enforce_memory_budget

    models = load_models(ModelSource(preset="tiny"), device="cuda")
    pipe = ReferencePipeline(models, device="cuda")
    r = GenerationRequest(prompt="a red circle bouncing", seed=7, height=256, width=384, frames=17)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        base, _ = ensure_baseline(pipe, r, ModelSource(preset="tiny"), __import__("pathlib").Path(d), repeats=1, warmup=0,
                                  mp4=False)
        rec = evaluate(pipe, r, {}, baseline=base, repeats=1, warmup=0).record()
    assert rec["peak_memory_kind"] == "cuda_allocated"
    assert rec["peak_memory_bytes"] >= max(rec["stats"]["peak_memory_bytes"].values()) > 0
    linears = _linears(pipe)
    bf16 = sum(lin.weight.numel() * lin.weight.element_size() for lin in linears)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with compose(pipe, {"memory.fp8_weights": {"layers": "all"}}):
        torch.cuda.synchronize()
        saved = before - torch.cuda.memory_allocated()
    assert saved >= 0.4 * bf16
    enforce_memory_budget(0.25, "cuda")
    try:
        with pytest.raises(torch.OutOfMemoryError) as err:
            torch.empty(2**30, dtype=torch.uint8, device="cuda")
        assert failure_reason(err.value)[0] == "oom"
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


@pytest.mark.gpu
def test_block_offload_on_the_gpu_is_exact_and_holds_fewer_blocks():
    """On CUDA (side stream, pinned host copies, events): the generation is bit-identical to the resident
    model's, the device holds the offloaded blocks' weights only while they run (the allocated memory drops
    by at least 80% of their bytes), and with prefetch only each pass's first offloaded block waits."""
    from vidtune.model import GenerationRequest, ModelSource, load_models

    models = load_models(ModelSource(preset="tiny"), device="cuda")
    pipe = ReferencePipeline(models, device="cuda")
    r = GenerationRequest(prompt="a red circle bouncing", seed=7, height=256, width=384, frames=17)
    ref = pipe.run(r)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with compose(pipe, {"memory.block_offload": {"offloaded_blocks": 48, "prefetch": 1}}):
        torch.cuda.synchronize()
        freed = before - torch.cuda.memory_allocated()
        host = pipe.applied_info["memory.block_offload"]["host_bytes"]
        out = pipe.run(r)
        rec = pipe.run_stats()["block_offload_copies"]
    assert freed >= 0.8 * host > 0
    assert torch.equal(out.stage2.video, ref.stage2.video) and torch.equal(out.frames, ref.frames)
    assert rec["blocks_copied"] > 2 * rec["not_prefetched"]


def test_bench_memory_runs_its_settings_between_two_baselines(tmp_path, monkeypatch):
    """The H200 memory benchmark's script on the CPU (tiny): baseline, each setting after its warm-up, the baseline
    again; the streamed setting's frames equal the resident FP8 setting's, and what it copied is recorded."""
    import json
    import sys

    from vidtune.benchmarks import bench_memory

    out = tmp_path / "memory.json"
    monkeypatch.setattr(sys, "argv", ["bench_memory", "--preset", "tiny", "--size", "384x256x17", "--settings",
                                      "fp8_stored", "fp8_stored_offload48_prefetch2@16", "fp8_stored_offload48_placed",
                                      "--out", str(out)])
    bench_memory.main()
    runs = {r["setting"]: r for r in json.loads(out.read_text())["runs"]}
    assert list(runs) == ["baseline", "fp8_stored", "fp8_stored_offload48_prefetch2", "fp8_stored_offload48_placed",
                          "baseline_again"]
    assert runs["fp8_stored"]["frames_sum"] == runs["fp8_stored_offload48_prefetch2"]["frames_sum"]
    assert runs["fp8_stored"]["frames_sum"] == runs["fp8_stored_offload48_placed"]["frames_sum"]
    assert runs["baseline"]["frames_sum"] == runs["baseline_again"]["frames_sum"]
    assert runs["fp8_stored_offload48_prefetch2"]["copies"]["bytes_copied"] > 0 and runs["fp8_stored"]["copies"] is None


@pytest.mark.parametrize("text, needle", [("fp8_stord", "'fp8_stord' is not a setting; the settings are"),
                                          ("fp8_stored@0", "must be a number of GiB > 0"),
                                          ("fp8_stored@lots", "must be a number of GiB > 0")])
def test_bench_memory_names_a_bad_setting_before_any_work(text, needle):
    from vidtune.benchmarks.bench_memory import parse_setting

    def error(message):
        raise ValueError(message)

    assert parse_setting("fp8_stored@24", None, error) == ("fp8_stored", 24.0)
    assert parse_setting("fp8_stored", 16.0, error) == ("fp8_stored", 16.0)
    with pytest.raises(ValueError, match=needle):
        parse_setting(text, None, error)


def test_copy_alone_streams_every_block_once_a_pass():
    """bench_memory --copy-alone: the copies of block offload timed with nothing between them, through the
    technique's own streamer; each pass copies every block once (the prefetch window wraps round to the next
    pass), so the bandwidth it states is bytes a pass over a pass's time."""
    from vidtune.benchmarks.bench_memory import copy_alone

    res = copy_alone(blocks=5, block_mb=2.0, prefetch=2, passes=3, device="cpu")
    assert res["blocks_copied_per_pass"] == 5
    assert res["bytes_per_pass"] == 5 * 2_000_000
    assert len(res["pass_s"]) == 3 and res["pass_s"] == sorted(res["pass_s"]) and res["pass_s"][0] > 0
    assert res["gb_per_s"] == pytest.approx(res["bytes_per_pass"] / res["pass_s_median"] / 1e9, rel=0.01, abs=0.01)
