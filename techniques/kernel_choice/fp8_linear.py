"""FP8 (e4m3) row-wise scaled matmul for the transformer blocks' linear layers.

docs/architecture.md: the 24576x4096x16384 feed-forward GEMM runs at 698 TFLOP/s in bf16 and 1279 TFLOP/s
with FP8 row-wise scales (1.83x), 1.36x when the activation quantisation is a separate unfused pass;
GEMMs are 41% of a 1536x1024 pass. Weights are quantised once here (per output row), activations per
row at run time by the fused Triton quantiser (``kernels/fp8.py``). Input/output projections
(``patchify_proj``, ``proj_out``) and the AdaLN layers live outside the blocks and stay bf16.
On a CPU the same rounding runs as a PyTorch reference, so the numerics are testable without a GPU.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from vidtune.kernels.fp8 import fp8_linear, quantize_weight
from vidtune.model.generation import ATTENTION_KINDS
from vidtune.techniques.registry import Knob, Patch, Technique, register

LAYER_GROUPS = ("off", "attention", "feed_forward", "all")
_ATTENTION_PROJECTIONS = ("to_q", "to_k", "to_v", "to_out.0")


def target_linears(transformer: torch.nn.Module, group: str) -> list[tuple[str, torch.nn.Linear]]:
    """(name, Linear) of the blocks' layers in ``group`` (attention projections, feed-forward, all)."""
    out = []
    for i, block in enumerate(transformer.velocity_model.transformer_blocks):
        if group in ("attention", "all"):
            for attrs in ATTENTION_KINDS.values():
                for attr in attrs:
                    attn = getattr(block, attr, None)
                    if attn is None:
                        continue
                    for proj in _ATTENTION_PROJECTIONS:
                        out.append((f"blocks.{i}.{attr}.{proj}", attn.get_submodule(proj)))
        if group in ("feed_forward", "all"):
            for ff in ("ff", "audio_ff"):
                mod = getattr(block, ff, None)
                if mod is not None:
                    out += [(f"blocks.{i}.{ff}.net.0.proj", mod.net[0].proj), (f"blocks.{i}.{ff}.net.2", mod.net[2])]
    return out


def _fp8_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A patched ``Linear.forward``. The quantised weight and the quantiser's choice are attributes of the
    module, not a closure's or a lambda's defaults: Dynamo reaches a default through a ``DefaultsSource``,
    which torch 2.11's FX graph cache pickles with its derived fields and then cannot unpickle
    (``DefaultsSource.__init__() takes from 3 to 4 positional arguments but 6 were given``), so every
    process compiled every graph anew, the persisted compile cache included (seen on the H200 image and
    reproduced on the CPU with torch 2.11; tests/test_compile_cache.py)."""
    return fp8_linear(x, self.vt_fp8_weight, traced=self.vt_fp8_traced)


@register("kernel_choice.fp8_linear")
class FP8Linear(Technique):
    """Run the blocks' linear layers as FP8 row-wise scaled matmuls."""

    knobs = (Knob("layers", "categorical", off="off", choices=LAYER_GROUPS,
                  help="which block linears run in FP8: attention projections, feed-forward, or all"),
             # "traced" acts only inside torch.compile (kernel_choice.compile): the activation
             # quantiser becomes tensor ops Inductor fuses into their producer; eager runs use the
             # Triton kernel with either value, so without compile the two are the same run.
             Knob("quantiser", "categorical", off="kernel", choices=("kernel", "traced"),
                  help="activation quantiser under torch.compile: the opaque Triton kernel, or traced "
                       "tensor ops that Inductor fuses into the producing kernel"))
    switch = "layers"
    stages = ("stage1", "stage2")
    uniform_passes = True
    seams = ("linear.blocks",)
    description = "FP8 e4m3 row-wise scaled matmul (torch._scaled_mm, fused Triton activation quantiser)"

    inexact = "FP8 rounds every weight and activation of the chosen linears (tiny preset: 41.7 dB)"

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        patch = Patch(self.name)
        layers = [lin for t in pipeline.transformers() for lin in target_linears(t, values["layers"])]
        traced = values["quantiser"] == "traced"
        for _, linear in layers:
            weight = quantize_weight(linear)
            patch.set_attr(linear, "vt_fp8_weight", weight)
            patch.set_attr(linear, "vt_fp8_traced", traced)
            patch.set_attr(linear, "forward", types.MethodType(_fp8_forward, linear))
        pipeline.applied_info[self.name] = {"layers": values["layers"], "linears": len(layers),
                                            "quantiser": values["quantiser"]}
        patch.on_undo(lambda: pipeline.applied_info.pop(self.name, None))
        return patch
