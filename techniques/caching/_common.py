"""Shared machinery of the caching family: per-pass state, pass accounting, reduced statistics.

Every cache keeps its state per (stage, guidance pass, stage-2 tile): the conditional, CFG, STG and
modality passes of a step see different inputs and must never reuse each other's work. State is reset
when a stage starts (step 0), so repeated runs never leak a cache across requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

__all__ = ["PassKey", "pass_key", "pass_state", "patch_block_loop", "PassCounter", "relative_l1", "run_blocks",
           "add_residual", "residual"]

PassKey = tuple[str, str, int]


def pass_key(pipeline: Any) -> tuple[PassKey, int, int]:
    """(state key, step, number of steps) of the pass about to run; outside a loop: one-step stage."""
    ctx = pipeline.context
    if ctx is None:
        return ("none", "cond", 0), 0, 1
    return (ctx.stage, ctx.pass_name, ctx.tile), ctx.step, ctx.num_steps


def pass_state(pipeline: Any, states: dict, factory: Callable[[], Any]) -> tuple[PassKey, int, int, Any]:
    """(key, step, number of steps, state) of the coming pass; the state is fresh at a stage's step 0."""
    key, step, num_steps = pass_key(pipeline)
    if step == 0 or key not in states:
        states[key] = factory()
    return key, step, num_steps, states[key]


def patch_block_loop(name: str, pipeline: Any, make_process: Callable[[Any], Callable[..., tuple[Any, Any]]]) -> Any:
    """Undoable patch replacing each transformer's block loop (``LTXModel._process_transformer_blocks``) by
    ``make_process(blocks)`` of its own blocks (stage 2 may have its own transformer)."""
    from vidtune.techniques.registry import Patch

    patch = Patch(name)
    for transformer in pipeline.transformers():
        vm = transformer.velocity_model
        patch.set_attr(vm, "_process_transformer_blocks", make_process(vm.transformer_blocks))
    return patch


@dataclass
class PassCounter:
    """Counts computed and cached passes per stage into ``pipeline.records[name]`` (the trial record)."""

    name: str
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, pipeline: Any, stage: str, cached: bool) -> None:
        rec = pipeline.records.setdefault(self.name, {})
        per_stage = rec.setdefault(stage, {"computed": 0, "cached": 0})
        per_stage["cached" if cached else "computed"] += 1


def relative_l1(pipeline: Any, now: tuple[torch.Tensor | None, ...], prev: tuple[torch.Tensor | None, ...]) -> float:
    """sum|now - prev| / sum|prev| over both modalities (video first, then audio), equal on every rank.

    Under sequence parallelism (``pipeline.video_shard`` is set) each rank holds a shard of the video
    tokens, padded: the video sums drop the padding and are all-reduced over the ranks before anyone
    decides, while the replicated audio sums are not (they would count once per rank).
    """
    shard = getattr(pipeline, "video_shard", None)
    total: torch.Tensor | None = None
    for i, (a, b) in enumerate(zip(now, prev)):
        if a is None or b is None:
            continue
        if i == 0 and shard is not None:
            a, b = shard.valid(a), shard.valid(b)
        part = torch.stack([(a.float() - b.float()).abs().sum(), b.float().abs().sum()])
        if i == 0 and shard is not None:
            part = shard.reduce(part)
        total = part if total is None else total + part
    num, den = total.tolist()  # the step's one device-to-host read (two float() calls were two)
    return num / den if den > 0 else float("inf")


def run_blocks(blocks: Any, video: Any, audio: Any, perturbations: Any) -> tuple[Any, Any]:
    """The transformer block loop, exactly as ``LTXModel._process_transformer_blocks`` (inference)."""
    for block in blocks:
        video, audio = block(video=video, audio=audio, perturbations=perturbations)
    return video, audio


def residual(after: Any, before: Any) -> torch.Tensor | None:
    """x(after) - x(before) of TransformerArgs (None when the modality is absent)."""
    if after is None or before is None:
        return None
    return after.x - before.x


def add_residual(args: Any, res: torch.Tensor | None) -> Any:
    """TransformerArgs with ``res`` added to its tokens."""
    if args is None or res is None:
        return args
    return replace(args, x=args.x + res)
