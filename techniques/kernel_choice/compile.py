"""torch.compile of the transformer blocks (Inductor), with dynamic sequence length.

Each block is compiled on its own (``Module.compile`` semantics: the block's call goes through the
compiled function), so techniques that decide between blocks in Python (the caches) keep working:
their decisions are graph breaks between compiled blocks, never inside one. Dynamic shapes keep one
graph for stage 1, stage 2 and every tile size. docs/architecture.md: default mode 48.6 -> 43.4 ms per
block at 1536x1024 on the H200 (1.12x), 34 s to compile 4 blocks.
"""

from __future__ import annotations

import enum
import functools
from typing import Any, Mapping

import torch

from vidtune.kernels.sdpa import traceable_default
from vidtune.techniques.kernel_choice import compile_cache
from vidtune.techniques.registry import Knob, Patch, Technique, register

_MODES = ("off", "default", "max-autotune-no-cudagraphs")


# How Dynamo names a block's ``idx`` (the exact name, and a pattern where regexes are understood)
_IDX_SOURCES = ("L['self'].idx", r".*\.idx$")
_LAST_COMPILED: Any = None  # (mode, dynamic, block_signature) of the graphs Dynamo holds now
_SIMPLE = (bool, int, float, str, type(None), enum.Enum, torch.dtype)


def _simple(values: Any) -> tuple[Any, ...]:
    """The plain values among ``values`` (flags, sizes, names): what a traced graph bakes in."""
    out = []
    for v in values:
        if isinstance(v, _SIMPLE):
            out.append(v)
        elif isinstance(v, (tuple, list)):
            out.append(_simple(v))
    return tuple(out)


def describe_callable(fn: Any) -> tuple[Any, ...]:
    """A callable installed on a module, by what it is and the plain values it carries (a lambda's
    defaults and closure, a partial's arguments, an attention object's settings), not by identity:
    re-applying one configuration must give the same description."""
    if isinstance(fn, functools.partial):
        return ("partial", describe_callable(fn.func), _simple(fn.args), _simple(sorted(fn.keywords.items())))
    fn = getattr(fn, "__func__", fn)
    if hasattr(fn, "__code__"):
        cells = [c.cell_contents for c in (fn.__closure__ or ()) if c.cell_contents is not None]
        return (fn.__module__, fn.__qualname__, _simple(fn.__defaults__ or ()), _simple(cells))
    attrs = sorted((k, v) for k, v in vars(fn).items() if isinstance(v, _SIMPLE)) if hasattr(fn, "__dict__") else []
    return (type(fn).__module__, type(fn).__qualname__, tuple(attrs))


def installed_callables(module: torch.nn.Module) -> tuple[Any, Any]:
    """The two places techniques put their callables on a module: an instance ``forward`` (FP8 linears,
    fused_norms and cuda_graphs blocks) and ``attention_function`` (SDPA backends, sparse attention,
    sequence parallelism). Shared by compile (below) and cuda_graphs' graph fingerprint."""
    return module.__dict__.get("forward"), getattr(module, "attention_function", None)


def _vidtune_values(module: torch.nn.Module) -> tuple[tuple[str, Any], ...]:
    """The plain values techniques set on a module as ``vt_*`` attributes (FP8's ``vt_fp8_traced``: its
    forward reads them from the module, so they are not in any callable's defaults)."""
    return tuple((k, v) for k, v in sorted(vars(module).items())
                 if k.startswith("vt_") and isinstance(v, (bool, int, float, str, type(None))))


def block_signature(blocks: list[torch.nn.Module]) -> tuple[Any, ...]:
    """What the compiled graphs of ``blocks`` depend on besides tensors: every submodule's class, the
    callables that techniques installed on it, described by value (``describe_callable``), and the plain values
    they set on it (``vt_*``)."""
    out = []
    for block in blocks:
        for name, module in block.named_modules():
            entry = (name, type(module).__qualname__,
                     tuple(describe_callable(fn) if fn is not None else None for fn in installed_callables(module)))
            values = _vidtune_values(module)
            out.append(entry + (values,) if values else entry)
    return tuple(out)


@register("kernel_choice.compile")
class Compile(Technique):
    """Compile every transformer block with torch.compile."""

    knobs = (
        Knob("mode", "categorical", off="off", choices=_MODES, help="torch.compile mode for the blocks"),
        Knob("dynamic", "bool", off=True,
             help="symbolic sequence length (one graph for every shape) or static (a graph per shape)"),
    )
    switch = "mode"  # mode=off is off whatever ``dynamic`` says
    stages = ("stage1", "stage2")
    uniform_passes = True
    # blocks.call: the compiled call; attention: ltx-core's default attention enum is replaced by its own
    # callable (PytorchAttention) on every kind, so Dynamo can trace it; compiler.config: Dynamo settings
    seams = ("blocks.call", "attention", "compiler.config")
    _TRACED = ("compile applies first (name order) and replaces only ltx-core's default attention enum, by the "
               "callable it stands for; {what} wraps or replaces that, and the compiled block traces what is installed")
    composes_with = {
        "kernel_choice.sdpa_backend": "compile leaves a chosen SDPA backend alone (it replaces only ltx-core's default "
                                      "attention enum, by the same callable); the compiled block traces the backend",
        "kernel_choice.attention8": "the 8-bit wrapper applies first (name order), holding ltx-core's default attention "
                                    "as the callable it stands for; the compiled block traces it, the kernel one opaque "
                                    "operator",
        "sparse_attention.sol": _TRACED.format(what="the sparse wrapper"),
        "sparse_attention.block_sparse": _TRACED.format(what="the sparse wrapper"),
        "sparse_attention.window": _TRACED.format(what="the window wrapper"),
        "parallelism.sequence_parallel": _TRACED.format(what="sequence parallelism (applied last)"),
    }
    description = "torch.compile (Inductor) of each transformer block, dynamic sequence length"

    inexact = "Inductor fuses and reorders floating-point work (tiny preset: 50.2 dB against eager)"

    def compiles(self, values: Mapping[str, Any]) -> bool:
        return values.get("mode", "off") != "off"

    def suggest(self, trial: Any, request: Any = None) -> dict[str, Any]:
        """A search samples static shapes only. A campaign tunes one request, whose two denoising shapes a
        static compile serves with two graphs; dynamic shapes buy nothing there and cost the most: on the H200
        (ltx2-19b, 1536x1024x121) a dynamic compile trial ran past its 420 s limit (static: ~34 s of warm-up,
        results/campaigns/h200-19b-1536/). A deployment serving many sizes sets ``dynamic`` by hand."""
        return self.suggest_restricted(trial, {"dynamic": [False]})

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        import torch._dynamo.config as dynamo_config

        patch = Patch(self.name)
        # Blocks differ only in their integer ``idx`` (read by the perturbation checks). Dynamo treats
        # integer module attributes as constants, so every block recompiled until the recompile limit
        # (8) sent the rest back to eager: measured on the H200, 1.01x instead of a compiled pass.
        # Treating them as dynamic gives one graph for all blocks.
        patch.set_value(dynamo_config, "allow_unspec_int_on_nn_module", True)
        patch.set_value(dynamo_config, "recompile_limit", max(dynamo_config.recompile_limit, 64))
        # That flag does not hold with static shapes on torch 2.11: a whole 1536x1024 generation on the H200
        # (FP8 + compile static + Sol) recompiled the block for every idx ("self.idx == 15" at the 64th
        # graph) and the rest ran eager; torch 2.13 on the CPU shares one graph (its ints are constants
        # only where used). The dynamic-sources list overrides dynamic=False: the idx is symbolic there.
        import torch.compiler.config as compiler_config

        if hasattr(compiler_config, "dynamic_sources"):
            sources = [s for s in compiler_config.dynamic_sources.split(",") if s]
            patch.set_value(compiler_config, "dynamic_sources", ",".join(sources + [s for s in _IDX_SOURCES if s not in sources]))
        # ltx-core's default attention is an Enum member whose __call__ Dynamo cannot trace: a graph
        # break at each of the 5 attentions of every block (seen in TORCH_LOGS=graph_breaks on the
        # H200). Without xformers, AttentionFunction.DEFAULT/PYTORCH *is* PytorchAttention, so the
        # same callable is installed directly (other callables, e.g. sdpa_backend's, are left alone).
        self._install_traceable_attention(pipeline, patch)
        blocks = pipeline.transformer_blocks()
        checked = [False]

        def fresh_cache_for_new_blocks() -> None:
            # Dynamo keeps compiled graphs per code object (the block's ``forward``) for the whole
            # process, and its guards do not see every change another technique makes inside a block:
            # measured, the graphs compiled with fp8_linear quantiser=traced were replayed after
            # quantiser=kernel was applied, and after a bf16 compile (CPU, tiny preset; on the H200 the
            # second FP8 + compile setting of one bench process warmed up in 6 s instead of ~200 s and
            # profiled as the first). A second configuration in one process also piled guards up to
            # the recompile limit, and the blocks fell back to eager (H200, rounds 7 and 8). A campaign
            # actor applies many configurations in one process, so on the first block call after apply
            # (every technique is applied by then) the caches are dropped when the blocks differ from
            # the ones last compiled; re-applying the same configuration keeps its graphs.
            global _LAST_COMPILED
            checked[0] = True
            key = (values["mode"], values["dynamic"], block_signature(blocks))
            if key != _LAST_COMPILED:
                torch._dynamo.reset()
                _LAST_COMPILED = key

        for block in blocks:
            compiled = torch.compile(block._call_impl, mode=values["mode"], dynamic=values["dynamic"])

            def call(*args: Any, _compiled: Any = compiled, **kwargs: Any) -> Any:
                if not checked[0]:
                    fresh_cache_for_new_blocks()
                return _compiled(*args, **kwargs)

            patch.set_attr(block, "_compiled_call_impl", call)
        pipeline.applied_info[self.name] = {"mode": values["mode"], "dynamic": values["dynamic"]}
        patch.on_undo(lambda: pipeline.applied_info.pop(self.name, None))
        compile_cache.attach(pipeline, self.name, patch)  # Inductor's artifacts kept across processes
        return patch

    @staticmethod
    def _install_traceable_attention(pipeline: Any, patch: Patch) -> None:
        from vidtune.model.generation import ATTENTION_KINDS

        for kind in ATTENTION_KINDS:
            for module in pipeline.attention_modules(kind):
                replacement = traceable_default(module.attention_function)
                if replacement is not None:
                    patch.set_attr(module, "attention_function", replacement)
