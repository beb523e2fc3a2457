"""FP8 row-wise linear: reference numerics on CPU, the technique on the tiny preset, kernel vs reference on GPU."""

from __future__ import annotations

import pytest
import torch

from vidtune.kernels.fp8 import E4M3_MAX, fp8_linear, fp8_linear_reference, quantize_rowwise, quantize_rowwise_reference, quantize_weight
from vidtune.model import ReferencePipeline
from vidtune.search.metrics import psnr_db
from vidtune.techniques import get


def test_rowwise_quantisation_rounding():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 96, generator=g) * torch.logspace(-3, 3, 64)[:, None]  # rows of very different scale
    q, s = quantize_rowwise_reference(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (64, 1)
    # each row's largest magnitude maps to e4m3's largest finite value
    assert torch.allclose(q.float().abs().amax(1), torch.full((64,), E4M3_MAX))
    # e4m3 keeps 3 mantissa bits: relative rounding error at most 2^-4 for normal values
    deq = q.float() * s
    normal = x.abs() > s * 2**-6
    assert ((deq - x).abs() <= x.abs() * 2**-4 + 1e-12)[normal].all()


def test_fp8_linear_reference_close_to_bf16():
    g = torch.Generator().manual_seed(1)
    lin = torch.nn.Linear(256, 128).bfloat16()
    with torch.no_grad():
        lin.weight.copy_(torch.randn(128, 256, generator=g) * 0.05)
        lin.bias.copy_(torch.randn(128, generator=g) * 0.1)
    x = torch.randn(4, 50, 256, generator=g).bfloat16()
    ref = lin(x).float()
    out = fp8_linear(x, quantize_weight(lin)).float()
    assert out.shape == ref.shape and out.dtype == torch.float32
    rel = (out - ref).norm() / ref.norm()
    # two e4m3 roundings (2^-4 worst case each, ~2^-5.5 rms over random signs): a few percent
    assert 1e-3 < rel < 0.06


@pytest.mark.parametrize("group,count", [("attention", 2 * 6 * 4), ("feed_forward", 2 * 4), ("all", 2 * 6 * 4 + 2 * 4)])
def test_fp8_technique_targets_and_changes_output_a_little(group, count, tiny_models, tiny_request, tiny_reference_output):
    pipe = ReferencePipeline(tiny_models)
    with get("kernel_choice.fp8_linear").apply(pipe, {"layers": group}):
        out = pipe.run(tiny_request)
        assert pipe.applied_info["kernel_choice.fp8_linear"]["linears"] == count
    assert out.stats["kernel_choice.fp8_linear"]["linears"] == count
    assert "kernel_choice.fp8_linear" not in pipe.applied_info  # undone
    psnr = psnr_db(tiny_reference_output.frames, out.frames).mean()
    # tiny's random weights at std 0.2 amplify rounding (docs/environment.md: bf16 vs fp8 cast 31 dB at 0.2)
    assert 15 < psnr < 100


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,n", [(128, 256, 512), (1000, 4096, 4096), (77, 2048, 8192)])
def test_triton_quantiser_and_scaled_mm_match_reference(m, k, n):
    g = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(m, k, generator=g, device="cuda").bfloat16() * 3
    q, s = quantize_rowwise(x)
    q_ref, s_ref = quantize_rowwise_reference(x)
    assert torch.equal(s, s_ref)
    mismatch = (q.float() != q_ref.float()).float().mean()
    assert mismatch < 1e-3  # identical rounding except (rare) ties
    lin = torch.nn.Linear(k, n, device="cuda").bfloat16()
    w = quantize_weight(lin)
    out, ref = fp8_linear(x, w).float(), fp8_linear_reference(x, w).float()
    assert torch.allclose(out, ref, atol=2e-2 * ref.abs().max().item(), rtol=1e-2)


def test_quantiser_is_one_graph_node_under_compile():
    """torch.compile keeps the quantiser in its graph (a custom op), no graph break."""
    import torch._dynamo

    def f(x):
        q, s = quantize_rowwise(x)
        return q.float() * s

    x = torch.randn(8, 64)
    explanation = torch._dynamo.explain(f)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    q, s = quantize_rowwise(x)
    q_ref, s_ref = quantize_rowwise_reference(x)
    assert torch.equal(q.float(), q_ref.float()) and torch.equal(s, s_ref)


def test_traced_quantiser_is_plain_tensor_ops_under_compile():
    """quantiser=traced: inside torch.compile the quantiser is the reference's tensor ops (no custom-op
    node, so Inductor can fuse it with the op that produces x), with no graph break; the compiled result
    equals the reference. Outside compile the flag changes nothing (the kernel path)."""
    import torch._dynamo

    def f(x, traced):
        q, s = quantize_rowwise(torch.nn.functional.gelu(x), traced=traced)
        return q.float() * s

    x = torch.randn(8, 64)
    for traced, custom_nodes in ((True, 0), (False, 1)):
        torch._dynamo.reset()
        explanation = torch._dynamo.explain(f)(x, traced)
        assert explanation.graph_break_count == 0 and explanation.graph_count == 1
        nodes = [n for g in explanation.graphs for n in g.graph.nodes]
        assert sum("quantize_rowwise" in str(n.target) for n in nodes) == custom_nodes
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="inductor")(x, True)
    q_ref, s_ref = quantize_rowwise_reference(torch.nn.functional.gelu(x))
    # Inductor's generated C++ may divide in another order than aten (x / scale, both fp32): a one-ulp
    # difference can flip an e4m3 rounding at a tie, one step of 2^-3 relative at most, so compare with that.
    torch.testing.assert_close(compiled, q_ref.float() * s_ref, rtol=0.125, atol=0.0)
    q_eager, s_eager = quantize_rowwise(x, traced=True)
    assert torch.equal(q_eager.float(), quantize_rowwise_reference(x)[0].float())


@pytest.mark.gpu
def test_traced_quantiser_under_compile_matches_the_kernel_on_the_gpu():
    """On CUDA, an FP8 linear compiled with the traced quantiser (Inductor's own kernel, fused with the
    GELU before it) gives the Triton kernel's result: the same scale per row, e4m3 codes equal but for
    rare ties, and outputs within FP8 rounding of the reference."""
    import torch._dynamo

    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(1000, 2048, generator=g, device="cuda").bfloat16() * 3
    lin = torch.nn.Linear(2048, 1024, device="cuda").bfloat16()
    w = quantize_weight(lin)

    def f(t, traced):
        return fp8_linear(torch.nn.functional.gelu(t), w, traced=traced)

    torch._dynamo.reset()
    traced = torch.compile(f)(x, True)
    kernel = f(x, False)
    ref = fp8_linear_reference(torch.nn.functional.gelu(x), w).float()
    tol = 2e-2 * ref.abs().max().item()
    assert torch.allclose(traced.float(), ref, atol=tol, rtol=1e-2)
    assert torch.allclose(traced.float(), kernel.float(), atol=tol, rtol=1e-2)
    with torch.no_grad():
        q_t, s_t = torch.compile(lambda t: quantize_rowwise(t, traced=True))(x)
    q_k, s_k = quantize_rowwise(x)
    torch.testing.assert_close(s_t, s_k, rtol=1e-6, atol=0)
    assert (q_t.float() != q_k.float()).float().mean() < 1e-3
