"""The CuTe DSL backend of Sol (kernels/sol_cute.py): the kept blocks on Hopper, Triton's correction after.

On the CPU: the kernel compiles to sm_90a PTX (where nvidia-cutlass-dsl is installed), and the split it
relies on (kept blocks first, then the correction started from their output and log-sum-exp) equals
the fused reference, in Triton's interpreter. On a Hopper GPU: the kernel against the references.
"""

from __future__ import annotations

import pytest
import torch

from vidtune.kernels.sol_attention import kept_attention_reference, sol_attention_reference
from vidtune.kernels.sol_cute import cute_importable

from test_sparse_attention import _structured, triton_interpreter  # noqa: F401  (the fixture)


def _hopper_with_cute() -> None:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a Hopper GPU (compute capability 9.0)")
    if not cute_importable():
        pytest.skip("nvidia-cutlass-dsl is not installed")


@pytest.mark.parametrize("n,beta", [(256, 1.0), (300, 0.5), (130, 2.0)])
def test_kept_reference_is_sol_without_correction(n, beta):
    from vidtune.kernels.sol_triton import route

    q, k, v = _structured(n)
    r = route(q, k, v, beta, 64, "exact", 1, fused=False)
    out, lse2 = kept_attention_reference(q, k, v, r["keep"])
    ref, _ = sol_attention_reference(q, k, v, beta, correction=False)
    torch.testing.assert_close(out.reshape(ref.shape), ref, atol=1e-5, rtol=1e-5)
    # log-sum-exp in base 2 of the kept logits, row by row (a row keeps at least its own block)
    s = (q.reshape(-1, n, q.shape[-1]) @ k.reshape(-1, n, k.shape[-1]).transpose(1, 2)) / q.shape[-1] ** 0.5
    mask = r["keep"].bool().repeat_interleave(64, 1).repeat_interleave(64, 2)[:, :n, :n]
    want = torch.logsumexp(s.masked_fill(~mask, float("-inf")), -1) / torch.log(torch.tensor(2.0))
    torch.testing.assert_close(lse2, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n,beta", [(256, 1.0), (330, 0.5), (130, 2.0), (512, 1.5)])
def test_correction_from_the_kept_state_equals_the_fused_kernel(triton_interpreter, n, beta):
    """What the CuTe backend does (kept blocks elsewhere, then ``launch(init=...)``) gives the reference:
    starting the online softmax at (m = lse, l = 1, acc = O) is the kept blocks' state up to a factor."""
    q, k, v = _structured(n)
    r = triton_interpreter.route(q, k, v, beta, 64, "exact", 1)
    state = kept_attention_reference(q, k, v, r["keep"])
    got = triton_interpreter.launch(q, k, v, r, 64, True, init=state)
    ref, _ = sol_attention_reference(q, k, v, beta, correction=True)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    # and the state matters: from a wrong log-sum-exp the result is off
    bad = triton_interpreter.launch(q, k, v, r, 64, True, init=(state[0], state[1] + 3.0))
    assert (bad - ref).abs().max() > 1e-2


def test_init_needs_the_correction_and_single_query_blocks(triton_interpreter):
    q, k, v = _structured(256)
    r = triton_interpreter.route(q, k, v, 1.0, 64, "exact", 1)
    state = kept_attention_reference(q, k, v, r["keep"])
    for kwargs in ({"correction": False}, {"query_blocks": 2}):
        with pytest.raises(ValueError, match="init .* needs correction=True and query_blocks=1"):
            triton_interpreter.launch(q, k, v, r, 64, init=state, **kwargs)


def test_cute_kernel_compiles_for_hopper_without_a_gpu():
    """nvidia-cutlass-dsl lowers the kernel to sm_90a PTX on the CPU: warpgroup MMAs of both products
    (QK^T m64n64, PV m64n128 with P from registers), TMA bulk copies, and the register hand-over."""
    if not cute_importable():
        pytest.skip("nvidia-cutlass-dsl is not installed")
    from vidtune.kernels.sol_cute import compile_ptx

    ptx = compile_ptx(128, correction=False)
    assert ".target sm_90a" in ptx
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in ptx
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in ptx
    assert "cp.async.bulk.tensor" in ptx and "mbarrier" in ptx
    assert "setmaxnreg.dec" in ptx and "setmaxnreg.inc" in ptx
    ptx64 = compile_ptx(64, n=1000, heads=3, correction=False)
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in ptx64 and "m64n128k16" not in ptx64
    # the fused correction: per consumer and chunk of 64 block means, Q K^T against their lo and hi
    # parts (8 + 8 MMAs of k16 at d = 128) and P V against the value sums (4): 40 more in the PTX
    fused = compile_ptx(128, correction=True)
    assert fused.count("wgmma.mma_async") == ptx.count("wgmma.mma_async") + 40


def test_cute_backend_is_refused_off_hopper(tiny_models, monkeypatch):
    from vidtune.model import ReferencePipeline
    from vidtune.techniques import get

    pipe = ReferencePipeline(tiny_models)  # on the CPU
    with pytest.raises(Exception, match=r"backend=cute needs a Hopper GPU"):
        get("sparse_attention.sol").apply(pipe, {"beta": 1.0, "backend": "cute"})
    # a head dim the kernel is not built for is refused before any GPU work, naming the dims it takes
    from vidtune.techniques.registry import KnobError
    from vidtune.techniques.sparse_attention import sol as sol_mod

    dims = {m.dim_head for m in pipe.attention_modules("video_self")}
    monkeypatch.setattr(sol_mod, "cute_available", lambda device: True)
    if not dims <= {64, 128}:
        with pytest.raises(KnobError, match=r"backend=cute takes video self-attention head dims 64 and 128"):
            get("sparse_attention.sol").apply(pipe, {"beta": 1.0, "backend": "cute"})
    monkeypatch.undo()
    if torch.cuda.is_available():
        return  # the sampler offers what this process's device runs: on a GPU machine that may include cute
    optuna = pytest.importorskip("optuna")

    study = optuna.create_study()
    tech = get("sparse_attention.sol")
    assert "cute" not in {tech.suggest(study.ask())["backend"] for _ in range(12)}


@pytest.mark.gpu
@pytest.mark.parametrize("n,heads,d", [(4096, 4, 128), (1000, 8, 64), (330, 2, 128), (24576, 2, 128)])
@pytest.mark.parametrize("beta", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("q_regs", [False, True])
def test_cute_kept_blocks_match_reference_on_gpu(n, heads, d, beta, q_regs, monkeypatch):
    _hopper_with_cute()
    from vidtune.kernels import sol_cute
    from vidtune.kernels.sol_cute import kept_attention_cute

    from vidtune.kernels.sol_triton import route

    monkeypatch.setitem(sol_cute.CUTE_LAUNCH, "q_regs", q_regs)

    q, k, v = _structured(n, d, heads, step=8.0, device="cuda", dtype=torch.bfloat16)
    r = route(q, k, v, beta, 64, "exact", 1)
    out, lse2 = kept_attention_cute(q, k, v, r)
    if n * n * heads <= 4096 * 4096 * 4:
        ref, ref_lse = kept_attention_reference(q, k, v, r["keep"])
    else:  # too large for the dense masked reference: Triton's kept loop, itself tested against it
        from vidtune.kernels.sol_triton import launch

        ref, ref_lse = launch(q, k, v, r, 64, False).reshape(heads, n, d).float(), None
    assert not out.isnan().any()
    # bf16 tensor-core products (P rounded to bf16 before P V) against float32
    torch.testing.assert_close(out.float(), ref.reshape(out.shape).float(), atol=2e-2, rtol=2e-2)
    if ref_lse is not None:  # float32 softmax statistics: only the bf16 inputs' products differ
        torch.testing.assert_close(lse2, ref_lse, atol=2e-3, rtol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("n,heads,d", [(4096, 4, 128), (1000, 8, 64), (24576, 2, 128)])
@pytest.mark.parametrize("beta,correction", [(1.0, True), (2.0, True), (1.0, False), (0.5, True)])
@pytest.mark.parametrize("where,q_regs", [("fused", False), ("triton", False), ("fused", True)])
def test_cute_backend_matches_reference_on_gpu(n, heads, d, beta, correction, where, q_regs, monkeypatch):
    _hopper_with_cute()
    from vidtune.kernels import sol_cute
    from vidtune.kernels.sol_cute import sol_attention_cute

    monkeypatch.setitem(sol_cute.CUTE_LAUNCH, "correction", where)
    monkeypatch.setitem(sol_cute.CUTE_LAUNCH, "q_regs", q_regs)
    q, k, v = _structured(n, d, heads, step=8.0, device="cuda", dtype=torch.bfloat16)
    out, dens = sol_attention_cute(q, k, v, beta, correction=correction)
    ref, ref_dens = sol_attention_reference(q, k, v, beta, correction=correction)
    assert dens == pytest.approx(ref_dens)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_cute_backend_rounds_float32_inputs_to_bf16_on_gpu():
    _hopper_with_cute()
    from vidtune.kernels.sol_cute import sol_attention_cute

    q, k, v = _structured(4096, 128, 2, step=8.0, device="cuda", dtype=torch.float32)
    out, dens = sol_attention_cute(q, k, v, 1.0)
    # the routing sees the rounded inputs too (a few blocks on the threshold flip against float32's)
    ref, ref_dens = sol_attention_reference(q.bfloat16(), k.bfloat16(), v.bfloat16(), 1.0)
    assert out.dtype == torch.float32 and dens == pytest.approx(ref_dens)
    torch.testing.assert_close(out, ref.float(), atol=2e-2, rtol=2e-2)
