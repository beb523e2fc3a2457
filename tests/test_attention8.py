"""8-bit video self-attention (kernels/attention8.py, techniques/kernel_choice/attention8.py): the reference's
arithmetic, the Triton kernel against it (Triton's interpreter on a CPU), the technique on tiny."""

from __future__ import annotations

import os

import pytest
import torch

from vidtune.kernels.attention8 import P_SCALE, attention8_op, attention8_reference, attention8_triton, quantize

interpreter = pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="Triton on the CPU needs TRITON_INTERPRET=1 before Triton loads")


def _inputs(b, h, n, d, offset=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=g)
    k = torch.randn(b, h, n, d, generator=g) + offset * torch.randn(1, 1, 1, d, generator=g)  # a shared channel offset
    v = torch.randn(b, h, n, d, generator=g)
    return q, k, v


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_quantisation_smooths_the_keys_and_round_trips_within_its_step():
    q, k, v = _inputs(1, 2, 150, 32)
    z = quantize(q, k, v, block_m=64, block_n=64)
    assert z.q.dtype == torch.int8 and z.k.dtype == torch.int8 and z.v.dtype == torch.float8_e4m3fn
    assert z.q.shape[2] == 192 and z.k.shape[2] == 192 and z.q_scale.shape == (1, 2, 3)  # padded to whole blocks
    q_back = (z.q.float() * z.q_scale.repeat_interleave(64, dim=2)[..., None])[:, :, :150]
    assert (q_back - q).abs().max() <= z.q_scale.max() / 2 + 1e-6  # half an INT8 step
    k_back = (z.k.float() * z.k_scale.repeat_interleave(64, dim=2)[..., None])[:, :, :150]
    smoothed = k - k.mean(dim=2, keepdim=True)
    assert (k_back - smoothed).abs().max() <= z.k_scale.max() / 2 + 1e-6
    # the smoothing is what keeps the keys' range small: the mean offset is gone
    assert k_back.mean(dim=2).abs().max() < 0.05 < k.mean(dim=2).abs().max()
    v_back = z.v.float()[:, :, :150] * z.v_scale[:, :, None, :]
    assert _rel(v_back, v) < 0.05 and z.v.float().abs().max() <= P_SCALE


def test_the_reference_is_close_to_exact_attention_and_smoothing_is_exact_in_the_softmax():
    q, k, v = _inputs(2, 2, 200, 64)
    exact = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    out = attention8_reference(q, k, v, block_m=64)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert _rel(out, exact) < 0.06  # FP8 probabilities and values: ~3.7% on these random inputs
    # a per-row constant added to every score changes nothing: keys shifted by a constant vector give the same
    # smoothed keys, so the same output
    shifted = attention8_reference(q, k + 5.0, v, block_m=64)
    assert _rel(shifted, out) < 1e-5


def test_keys_with_a_large_shared_offset_keep_their_precision_only_with_the_smoothing(monkeypatch):
    """The check above can fail: keys sharing a large channel offset (30 sigma) quantised without the mean taken
    off spend INT8's range on the offset (seen: 12.5% error against 3.6% with the smoothing)."""
    import vidtune.kernels.attention8 as a8

    q, k, v = _inputs(1, 1, 128, 32, offset=30.0)
    exact = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert _rel(a8.attention8_reference(q, k, v, block_m=64), exact) < 0.06
    smoothed = a8.quantize

    def unsmoothed(q, k, v, block_m=a8.BLOCK_M, block_n=a8.BLOCK_N):
        ki, ks = a8._int8_blocks(k.float(), block_n)
        return smoothed(q, k, v, block_m, block_n)._replace(k=ki, k_scale=ks)

    monkeypatch.setattr(a8, "quantize", unsmoothed)
    assert _rel(a8.attention8_reference(q, k, v, block_m=64), exact) > 0.08


@interpreter
@pytest.mark.parametrize("shape,blocks", [((1, 2, 200, 64), (64, 64)), ((2, 1, 130, 32), (64, 32)),
                                          ((1, 1, 64, 16), (64, 64))])
def test_the_triton_kernel_computes_the_references_numbers(shape, blocks):
    q, k, v = _inputs(*shape, seed=1)
    ref = attention8_reference(q, k, v, *blocks)
    tri = attention8_triton(q, k, v, *blocks)
    assert tri.shape == q.shape and _rel(tri, ref) < 1e-5  # float32 out: the same products, summed in another order
    # bf16 in and out, as in the pipeline: one bf16 step apart at most
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    assert _rel(attention8_triton(qb, kb, vb, *blocks), attention8_reference(qb, kb, vb, *blocks)) < 0.01


def test_the_operator_keeps_a_compiled_block_one_graph(compile_backend):
    """``vidtune::attention8`` is opaque to Dynamo (its fake gives the shape): one graph, no break."""
    from torch._dynamo.utils import counters

    compile_backend("aot_eager")
    q, k, v = _inputs(1, 2, 96, 32)

    def f(q, k, v):
        return attention8_op(q * 1.0, k, v, "reference") + 1.0

    counters.clear()
    got = torch.compile(f)(q, k, v)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert torch.allclose(got, attention8_reference(q, k, v) + 1.0, atol=1e-6)


def test_the_technique_on_tiny_changes_stage_two_and_keeps_dense_layers(tiny_models):
    from vidtune.model import GenerationRequest, ReferencePipeline
    from vidtune.techniques import compose
    from vidtune.techniques.kernel_choice.attention8 import VideoAttention8

    pipe = ReferencePipeline(tiny_models)
    req = GenerationRequest(prompt="a red circle bouncing", seed=3, height=128, width=192, frames=9)
    base = pipe.run(req)
    calls: list[str] = []
    real = VideoAttention8.__call__

    def counted(self, q, k, v, heads, mask=None):
        if mask is None and self.pipeline.context.stage in self.stages:
            calls.append(self.pipeline.context.stage)
        return real(self, q, k, v, heads, mask)

    VideoAttention8.__call__ = counted
    try:
        with compose(pipe, {"kernel_choice.attention8": {"stages": "stage2", "backend": "reference"}}):
            out = pipe.run(req)
        acting = set(calls)
        calls.clear()
        with compose(pipe, {"kernel_choice.attention8": {"stages": "both", "dense_layers": 1, "backend": "reference"}}):
            pipe.run(req)
    finally:
        VideoAttention8.__call__ = real
    assert acting == {"stage2"} and not torch.equal(out.frames, base.frames)
    layers = len(pipe.attention_layers("video_self"))
    assert {"stage1", "stage2"} == set(calls) and calls.count("stage2") == (layers - 1) * 3  # (3 stage-2 steps)
    assert torch.equal(pipe.run(req).frames, base.frames)  # undone


def test_the_triton_backend_is_refused_off_a_gpu_without_the_interpreter(tiny_models, monkeypatch):
    from vidtune.model import ReferencePipeline
    from vidtune.techniques import KnobError, compose

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(KnobError, match="kernel_choice.attention8.backend=triton needs a CUDA device"):
        compose(ReferencePipeline(tiny_models), {"kernel_choice.attention8": {"stages": "stage2"}})


def test_it_composes_with_compile_one_graph_a_stage(tiny_models, compile_backend):
    """With compile (applied after it, name order) the blocks trace the wrapper, its fallback (ltx-core's default
    attention, held as the callable it stands for) and the operator without a graph break: a graph per stage's
    shapes, as compile alone. (Dynamo's eager backend: the capture is what is tested.)"""
    from torch._dynamo.utils import counters

    from vidtune.model import GenerationRequest, ReferencePipeline
    from vidtune.techniques import compose

    compile_backend("eager")
    pipe = ReferencePipeline(tiny_models)
    req = GenerationRequest(prompt="a red circle bouncing", seed=3, height=128, width=192, frames=9)
    for dense_layers, graphs in ((0, 2), (1, 4)):  # (a block kept dense computes otherwise: its own graphs)
        counters.clear()
        torch._dynamo.reset()
        with compose(pipe, {"kernel_choice.compile": {"mode": "default", "dynamic": False},
                            "kernel_choice.attention8": {"stages": "stage2", "dense_layers": dense_layers,
                                                         "backend": "reference"}}):
            pipe.run(req)
        assert counters["stats"]["unique_graphs"] == graphs and not counters["graph_break"], dict(counters["graph_break"])
