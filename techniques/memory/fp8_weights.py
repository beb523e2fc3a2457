"""FP8 weight storage: the transformer blocks' linear layers keep their weights as FP8 e4m3 with per-row
scales and no bf16 copy on the device (the idea of the official ``fp8-cast`` loading), about half the
bytes of those weights (1 byte a weight plus a 4-byte scale a row, against 2 bytes a weight).

How a layer then computes:
- with ``kernel_choice.fp8_linear`` on the same layer, its FP8 matmul reads the stored FP8 weight (applied
  before this technique, by name order, it quantised the weight already; nothing is quantised twice);
- otherwise each call upcasts the weight to bf16 (``q * scale``) and runs the bf16 matmul: the weights'
  rounding to e4m3 is the only change, the activations stay bf16; the upcast weight lives for one call.
The bf16 weights move to host memory (pinned on CUDA) and undo puts them back bit for bit. The Parameter
objects stay (their storage is emptied), so whatever holds a reference to one still holds it.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F

from vidtune.kernels.fp8 import quantize_weight
from vidtune.techniques.kernel_choice.fp8_linear import LAYER_GROUPS, target_linears
from vidtune.techniques.memory.host_copies import host_copy
from vidtune.techniques.registry import Knob, Patch, Technique, register

__all__ = ["FP8Weights", "weight_bytes"]


def _upcast_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A patched ``Linear.forward``: the bf16 matmul with the stored FP8 weight upcast for this call."""
    w = self.vt_fp8_weight
    return F.linear(x, (w.q.float() * w.scale).to(x.dtype), self.bias)


def weight_bytes(linear: torch.nn.Linear) -> int:
    """Bytes a linear layer's weight holds where it runs: its (bf16) weight storage plus a stored FP8 copy."""
    n = linear.weight.numel() * linear.weight.element_size()
    w = getattr(linear, "vt_fp8_weight", None)
    if w is not None:
        n += w.q.numel() * w.q.element_size() + w.scale.numel() * w.scale.element_size()
    return n


@register("memory.fp8_weights")
class FP8Weights(Technique):
    """Store the blocks' linear weights as FP8 (row scales), without their bf16 copies on the device."""

    knobs = (Knob("layers", "categorical", off="off", choices=LAYER_GROUPS,
                  help="which block linears store FP8 weights: attention projections, feed-forward, or all"),)
    switch = "layers"
    stages = ("stage1", "stage2")
    uniform_passes = True
    seams = ("linear.blocks",)
    composes_with = {"kernel_choice.fp8_linear": "its FP8 matmul reads the stored FP8 weight (it applies first, "
                                                 "by name order, and this one only drops the bf16 copy)"}
    description = "block linear weights stored as FP8 e4m3 with row scales, no bf16 copy on the device"
    inexact = "the weights are rounded to FP8 e4m3 (with kernel_choice.fp8_linear: exactly its rounding)"

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        patch = Patch(self.name)
        layers = [lin for t in pipeline.transformers() for lin in target_linears(t, values["layers"])]
        before = sum(weight_bytes(lin) for _, lin in layers)
        shared = 0
        for _, linear in layers:
            if getattr(linear, "vt_fp8_weight", None) is not None:  # (kernel_choice.fp8_linear's)
                shared += 1
            else:
                patch.set_attr(linear, "vt_fp8_weight", quantize_weight(linear))
                patch.set_attr(linear, "forward", types.MethodType(_upcast_forward, linear))
            param = linear.weight
            device = param.device
            host = host_copy(param.data)
            param.data = torch.empty(0, dtype=param.dtype, device=device)

            def put_back(p: torch.nn.Parameter = param, h: torch.Tensor = host, d: torch.device = device) -> None:
                p.data = h.to(d)

            patch.on_undo(put_back)
        after = sum(weight_bytes(lin) for _, lin in layers)
        pipeline.applied_info[self.name] = {"layers": values["layers"], "linears": len(layers),
                                            "shared_with_fp8_linear": shared, "weight_bytes_before": before,
                                            "weight_bytes_after": after}
        patch.on_undo(lambda: pipeline.applied_info.pop(self.name, None))
        return patch
