"""Every kernel a technique installs composes with kernel_choice.compile: a transformer block holding it is
traced by Dynamo as one graph (0 graph breaks), on the CPU, with the PyTorch reference or Triton's
interpreter where the kernel cannot run. Kernels are custom operators with fake implementations
(kernels/sol_ops.py, kernels/fp8.py, kernels/fused_norms.py), so Dynamo never meets a kernel launcher.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import pytest
import torch

from vidtune.kernels.triton_runtime import triton_available
from vidtune.model import GenerationRequest, ReferencePipeline
from vidtune.model.pipeline import StepContext
from vidtune.techniques import Patch, compose, get


@pytest.fixture(scope="module")
def block_inputs(tiny_models, tiny_request):
    """The inputs of block 0 in the first stage-2 pass of the tiny request, and that pass's context."""
    pipe = ReferencePipeline(tiny_models)
    block = tiny_models.transformer.velocity_model.transformer_blocks[0]
    seen: dict = {}

    def hook(module, args, kwargs):
        ctx = pipe.context
        if ctx is not None and ctx.stage == "stage2" and "kwargs" not in seen:
            seen.update(kwargs=dict(kwargs), ctx=ctx)

    handle = block.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        pipe.run(tiny_request)
    finally:
        handle.remove()
    return seen["kwargs"], seen["ctx"]


SETTINGS = {
    "sol_reference": {"sparse_attention.sol": {"beta": 1.0, "backend": "reference", "token_order": "tiles"}},
    "sol_triton": {"sparse_attention.sol": {"beta": 1.0, "backend": "triton"}},
    "block_sparse_triton": {"sparse_attention.block_sparse": {"beta": 0.5, "backend": "triton"}},
    "fp8_all": {"kernel_choice.fp8_linear": {"layers": "all", "quantiser": "kernel"}},
    "fp8_traced": {"kernel_choice.fp8_linear": {"layers": "all", "quantiser": "traced"}},
    "fused_norms_triton": {"kernel_choice.fused_norms": {"ops": "norms+gates", "backend": "triton"}},
    "sdpa_flash": {"kernel_choice.sdpa_backend": {"video_self": "flash", "text_cross": "math"}},
    "sol_fp8_fused": {"sparse_attention.sol": {"beta": 1.0, "backend": "triton"},
                      "kernel_choice.fp8_linear": {"layers": "all"},
                      "kernel_choice.fused_norms": {"ops": "norms+gates", "backend": "triton"}},
}


@contextmanager
def _in_stage2(pipe: ReferencePipeline, ctx: StepContext):
    """Block 0 of ``pipe`` with the recorded stage-2 context set, in inference mode, between two Dynamo resets."""
    pipe.context = ctx
    try:
        torch._dynamo.reset()
        with torch.inference_mode():
            yield pipe.models.transformer.velocity_model.transformer_blocks[0]
    finally:
        pipe.context = None
        torch._dynamo.reset()


def _explain(pipe: ReferencePipeline, kwargs: dict, ctx: StepContext):
    with _in_stage2(pipe, ctx) as block:
        return torch._dynamo.explain(block)(**kwargs)


def _needs_triton_on_cpu(setting: dict) -> bool:
    return any(v.get("backend") == "triton" for v in setting.values())


# the tiny preset runs on the CPU: Triton kernels there need Triton's interpreter (set by conftest.py only
# where no GPU is present; on a GPU machine tests/test_gpu.py and test_sparse_attention's GPU tests cover them)
CPU_TRITON = triton_available(torch.device("cpu"))


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_a_block_with_the_technique_is_one_graph(name, tiny_models, block_inputs):
    if _needs_triton_on_cpu(SETTINGS[name]) and not CPU_TRITON:
        pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1")
    kwargs, ctx = block_inputs
    pipe = ReferencePipeline(tiny_models)
    with compose(pipe, SETTINGS[name]), Patch("test") as patch:
        # the compile technique's own preparation: ltx-core's default attention enum replaced by its callable
        get("kernel_choice.compile")._install_traceable_attention(pipe, patch)
        explained = _explain(pipe, kwargs, ctx)
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
    assert explained.graph_count == 1
    # nothing is reached through a function's defaults: torch 2.11's FX graph cache pickles that source
    # (DefaultsSource) and cannot unpickle it, so no compiled graph of such a block is ever reused
    # across processes (FP8's forward was ``lambda x, w=weight, t=traced``)
    # (a graph input's name spells its source: l_self_modules_ff_..._vt_fp8_weight_q)
    inputs = [n.name for g in explained.graphs for n in g.graph.nodes if n.op == "placeholder"]
    assert inputs and not [name for name in inputs if "defaults" in name]


def test_a_block_with_sol_fp8_and_fused_norms_is_one_graph_with_dynamic_shapes(tiny_models, block_inputs):
    """kernel_choice.compile's dynamic=True (a knob for hand-set deployments) on the benchmarked stack: the block
    traces whole (fullgraph) with symbolic shapes, the custom operators' fake implementations included, and
    computes what the block computes eagerly. (The whole-pipeline test below compiles static shapes: the same
    check over every step of the pipeline with symbolic shapes spent ~60 s of the suite in sympy.)"""
    if not CPU_TRITON:
        pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1")
    kwargs, ctx = block_inputs
    pipe = ReferencePipeline(tiny_models)
    with compose(pipe, SETTINGS["sol_fp8_fused"]), Patch("test") as patch:
        get("kernel_choice.compile")._install_traceable_attention(pipe, patch)
        with _in_stage2(pipe, ctx) as block:
            want = block(**kwargs)
            got = torch.compile(block, backend="eager", dynamic=True, fullgraph=True)(**kwargs)
    for w, g in zip(torch.utils._pytree.tree_leaves(want), torch.utils._pytree.tree_leaves(got)):
        if isinstance(w, torch.Tensor):
            assert torch.allclose(w.float(), g.float(), atol=1e-2, rtol=1e-2)


def test_the_check_sees_a_graph_break(tiny_models, block_inputs):
    """A kernel launched outside an operator (what Sol did before kernels/sol_ops.py) breaks the graph."""
    from vidtune.kernels.sol_attention import sol_attention_reference

    kwargs, ctx = block_inputs
    pipe = ReferencePipeline(tiny_models)

    def opaque(q, k, v, heads, mask=None):
        b, n, hd = q.shape
        qh, kh, vh = (t.reshape(b, n, heads, hd // heads).transpose(1, 2) for t in (q, k, v))
        out, density = sol_attention_reference(qh, kh, vh, 1.0)  # the float() density is a host read
        return out.transpose(1, 2).reshape(b, n, hd)

    patch = Patch("test")
    for module in pipe.attention_modules("video_self"):
        patch.set_attr(module, "attention_function", opaque)
    get("kernel_choice.compile")._install_traceable_attention(pipe, patch)
    try:
        explained = _explain(pipe, kwargs, ctx)
    finally:
        patch.undo()
    assert explained.graph_break_count >= 1


def test_sol_records_density_on_the_device_and_reads_it_once(tiny_models, tiny_request, monkeypatch):
    """The density is accumulated in device tensors in the hot path; run_stats reads them in one transfer,
    and the next run starts from zero."""
    import vidtune.model.pipeline as pipeline_module

    reads = []
    real = pipeline_module.read_once
    monkeypatch.setattr(pipeline_module, "read_once", lambda ts: reads.append(len(ts)) or real(ts))
    pipe = ReferencePipeline(tiny_models)
    with get("sparse_attention.sol").apply(pipe, {"beta": 1.0}) as patch:
        wrappers = [obj.attention_function for obj, _ in patch.touched]
        out = pipe.run(tiny_request)
        assert all(w.density_sum.dim() == 0 and float(w.sparse_calls) == 3 for w in wrappers)
        again = pipe.run(tiny_request)
    assert reads == [2 * len(wrappers)] * 2  # one read of every accumulator per run
    rec = out.stats["sparse_attention.sol"]
    assert rec == again.stats["sparse_attention.sol"]  # reset between runs
    assert rec["sparse_calls"] == 3 * len(wrappers) and all(0 < d <= 1 for d in rec["density"].values())
    assert pipe.recorders == []  # undo removes the recorder


def test_compiled_pipeline_has_no_graph_break_and_one_graph_per_stage(tiny_models, compile_backend):
    """The whole tiny pipeline under kernel_choice.compile (Dynamo with the eager backend: the graph
    capture is what is tested, not Inductor's code) with Sol, FP8 and fused norms together: no graph
    break, and the stage-2 graph serves every step (nothing in the hot path specialises on the step: with
    static shapes, as the search compiles, an int that changed per step would be a recompile)."""
    import torch._dynamo.utils as dynamo_utils

    if not CPU_TRITON:
        pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1")
    compile_backend("eager")
    dynamo_utils.counters.clear()
    pipe = ReferencePipeline(tiny_models)
    # a small request: the Triton kernels run in Triton's interpreter on the CPU, at a cost that grows with the tokens
    tiny_request = GenerationRequest(prompt="a red circle bouncing", seed=7, height=128, width=192, frames=9, fps=24.0)
    setting = {"kernel_choice.compile": {"mode": "default", "dynamic": False},
               "sparse_attention.sol": {"beta": 1.0, "backend": "triton", "token_order": "tiles"},
               "kernel_choice.fp8_linear": {"layers": "feed_forward"},
               "kernel_choice.fused_norms": {"ops": "norms+gates", "backend": "triton"}}
    with compose(pipe, setting):
        first = pipe.run(tiny_request)
        graphs = dynamo_utils.counters["stats"]["unique_graphs"]
        second = pipe.run(tiny_request)
        assert dynamo_utils.counters["stats"]["unique_graphs"] == graphs  # the second run compiles nothing
    assert not dynamo_utils.counters["graph_break"], dict(dynamo_utils.counters["graph_break"])
    assert graphs <= 3, graphs  # stage 1 (Sol falls back), stage 2 (Sol on); the blocks share one code object
    assert torch.equal(first.frames, second.frames)
    assert first.stats["sparse_attention.sol"]["sparse_calls"] == 3 * 2


def test_sol_operator_matches_its_backends():
    from vidtune.kernels.sol_attention import sol_attention_reference
    from vidtune.kernels.sol_ops import sol_attention_op
    from vidtune.kernels.sol_triton import sol_attention_triton

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 200, 32, generator=g) for _ in range(3))
    for backend, fn in (("reference", sol_attention_reference), ("triton", sol_attention_triton))[:2 if CPU_TRITON else 1]:
        out, density = sol_attention_op(q, k, v, 1.0, backend=backend)
        ref, ref_density = fn(q, k, v, 1.0)
        assert torch.equal(out, ref) and float(density) == ref_density, backend
    # and its fake implementation gives the shapes Dynamo plans with
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        out, density = sol_attention_op(fq, fk, fv, 1.0, backend="triton")
        assert out.shape == q.shape and density.shape == () and density.dtype == torch.float32


@pytest.mark.parametrize("stages", ["stage2", "both"])
def test_stage1_context_traces_as_one_graph(tiny_models, block_inputs, stages):
    """In a stage-1 context the block traces as one graph, with Sol on stage 2 only (the dense path there)
    or on both stages (the routed path)."""
    kwargs, ctx = block_inputs
    pipe = ReferencePipeline(tiny_models)
    sol = {"sparse_attention.sol": {**SETTINGS["sol_reference"]["sparse_attention.sol"], "stages": stages}}
    with compose(pipe, sol):
        explained = _explain(pipe, kwargs, replace(ctx, stage="stage1"))
    assert explained.graph_break_count == 0


@pytest.mark.gpu
def test_compiled_pipeline_with_sol_triton_on_the_gpu():
    """On a GPU, with Inductor: the tiny pipeline with compile + Sol (Triton) + FP8 has no graph break,
    compiles nothing on its second run, and stays close to the same setting run eagerly."""
    import torch._dynamo.utils as dynamo_utils

    from vidtune.model import GenerationRequest, ModelSource, load_models
    from vidtune.search.metrics import psnr_db

    models = load_models(ModelSource(preset="tiny"), device="cuda")
    request = GenerationRequest(prompt="a red circle bouncing", seed=7, height=256, width=384, frames=17)
    sparse = {"sparse_attention.sol": {"beta": 1.0, "backend": "triton", "token_order": "tiles"},
              "kernel_choice.fp8_linear": {"layers": "all"}}
    pipe = ReferencePipeline(models, device="cuda")
    with compose(pipe, sparse):
        eager = pipe.run(request)
    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    # static shapes, as every whole-generation bench compiles (with dynamic=True this test ran past 210 s on
    # the H200 without finishing, 2026-12-01; not diagnosed)
    with compose(pipe, {**sparse, "kernel_choice.compile": {"mode": "default", "dynamic": False}}):
        first = pipe.run(request)
        graphs = dynamo_utils.counters["stats"]["unique_graphs"]
        pipe.run(request)
        assert dynamo_utils.counters["stats"]["unique_graphs"] == graphs
    torch._dynamo.reset()
    assert not dynamo_utils.counters["graph_break"], dict(dynamo_utils.counters["graph_break"])
    assert graphs <= 3
    assert float(psnr_db(eager.frames, first.frames).mean()) > 35.0


class _Indexed(torch.nn.Module):
    """A block-like module whose integer ``idx`` is looked up in a list, as ltx-core's perturbation check
    does (``block in perturbation.blocks``)."""

    def __init__(self, idx: int) -> None:
        super().__init__()
        self.idx = idx

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if self.idx in [99] else x + 1


def _graphs_for_five_blocks() -> int:
    import torch._dynamo.utils as dynamo_utils

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    x = torch.randn(4)
    for block in (_Indexed(i) for i in range(5)):
        torch.compile(block._call_impl, backend="eager", dynamic=False)(x)
    graphs = dynamo_utils.counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    return graphs


def test_static_compile_shares_one_graph_across_block_indices(tiny_models):
    """With static shapes Dynamo specialised each block's idx (torch 2.11 on the H200: a graph per block,
    the recompile limit at the 64th, the rest eager; warm-up 293 s for a 1536x1024 generation). The compile
    technique marks the idx dynamic for as long as it is applied: one graph for all blocks (77 s there)."""
    import torch.compiler.config as compiler_config
    import torch._dynamo.config as dynamo_config

    before = compiler_config.dynamic_sources
    with Patch("x") as p:  # the unfixed state: the flag the technique had set alone
        p.set_value(dynamo_config, "allow_unspec_int_on_nn_module", True)
        assert _graphs_for_five_blocks() == 5
    pipe = ReferencePipeline(tiny_models)
    with get("kernel_choice.compile").apply(pipe, {"mode": "default", "dynamic": False}):
        assert "L['self'].idx" in compiler_config.dynamic_sources.split(",")
        assert _graphs_for_five_blocks() == 1
    assert compiler_config.dynamic_sources == before
