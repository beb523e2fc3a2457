"""STG prefix sharing: a multistep step's STG pass starts where it first differs from the conditional pass.

LTX-2's spatio-temporal guidance pass (STG) takes the conditional pass's very inputs (ltx-pipelines'
guided step hands both the same positive ``Modality``) and differs from it only from the first block
whose self-attention it skips: block 29 of ltx2-19b's 48 (the checkpoint's ``stg_blocks``). Its first 29
blocks recompute, bit for bit, what the conditional pass of the same step computed a moment earlier. Here
the conditional pass keeps its tokens as they enter that block, and the STG pass runs only the blocks from
there on: 19 of 48 blocks, 40% of a pass. On the official multistep schedule (four passes a guided step)
that is 15% of stage 1, with nothing approximated: the output is bit-identical.

Only the tokens (``x``) are taken over: a block changes nothing else of its ``TransformerArgs``, so the
STG pass's own inputs (timesteps, context, RoPE tables: the same values, computed by its own preprocessing)
carry them on. The saved tokens are keyed by stage, tile and the step's serial number
(``StepContext.serial``, unique over the pipeline's life), so a pass of another step, another run or
another rank (guidance_parallel puts the STG pass where no conditional pass ran) never resumes from them:
it runs whole.

With ``kernel_choice.batched_guidance`` the step's passes arrive as one batch whose rows are named in the
pass name (``batch:cond+uncond+stg+modality``): the first blocks run on the batch without the STG row, and
the conditional row's tokens are copied into it before the STG block. That changes a GEMM's batch (3 rows,
then 4), which may round a row differently: within the batched passes' own tolerance, not bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from vidtune.techniques.caching._common import run_blocks, run_rows
from vidtune.techniques.registry import Knob, KnobError, Patch, Technique, register

__all__ = ["StgPrefix", "stg_start"]

_SELF = ("skip_video_self_attn", "skip_audio_self_attn")


def stg_start(configs: Any) -> int | None:
    """The first block a list of ``PerturbationConfig`` (one batch row's, or several rows') perturbs, when it
    perturbs only self-attention in listed blocks; None when it perturbs anything else or every block."""
    first = None
    for cfg in configs:
        for p in cfg.perturbations:
            if p.type.value not in _SELF or p.blocks is None or not list(p.blocks):
                return None
            first = min(p.blocks) if first is None else min(first, min(p.blocks))
    return first


@dataclass
class _Counts:
    resumed: int = 0  # STG passes (or batch rows) that started at the STG block
    whole: int = 0  # STG passes that ran every block (no conditional pass of the same step here)
    blocks_skipped: int = 0


@register("caching.stg_prefix")
class StgPrefix(Technique):
    """The STG pass resumes from the conditional pass's tokens at the first block it perturbs."""

    knobs = (Knob("enabled", "bool", off=False,
                  help="the STG guidance pass runs only the blocks from the first one it perturbs, on the "
                       "conditional pass's tokens there (exact)"),)
    switch = "enabled"
    stages = ("stage1",)
    seams = ("transformer.blocks",)
    description = "the STG pass starts at its first perturbed block from the conditional pass's tokens (exact)"

    def applicable(self, request: Any = None) -> bool:
        return request is None or (request.mode == "multistep" and request.stg_scale != 0)

    def check_request(self, values: dict[str, Any], request: Any) -> None:
        if values["enabled"] and request.mode != "multistep":
            raise KnobError(f"{self.name}.enabled=True needs request.mode=multistep (a {request.mode} step runs "
                            f"no STG pass); got mode={request.mode!r}")
        if values["enabled"] and request.stg_scale == 0:
            raise KnobError(f"{self.name}.enabled=True needs an STG pass: request.stg_scale is 0 (allowed: "
                            f"any other value, or enabled=False)")

    def effective(self, values: dict[str, Any], request: Any) -> bool:
        return request.mode == "multistep" and request.stg_scale != 0

    def neutral(self, request: Any, device: Any) -> dict[str, Any]:
        return {"enabled": True}  # exact: the conformance suite holds it to the reference's bits

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        from vidtune.techniques.caching._common import patch_block_loop

        stg_blocks = tuple(getattr(pipeline.models, "stg_blocks", ()) or ())
        start = min(stg_blocks) if stg_blocks else 0
        saved: dict[tuple, tuple] = {}  # (stage, tile) -> (step serial, video x, audio x) at block ``start``
        counts: dict[str, _Counts] = {}

        def record(ctx: Any, resumed: int = 0, whole: int = 0) -> None:
            c = counts.setdefault(ctx.stage, _Counts())
            c.resumed += resumed
            c.whole += whole
            c.blocks_skipped += resumed * start
            pipeline.records[self.name] = {s: vars(v).copy() for s, v in counts.items()}

        def make(blocks: Any) -> Any:
            k = min(start, len(blocks))

            def process(video: Any, audio: Any, perturbations: Any) -> tuple[Any, Any]:
                ctx = pipeline.context
                if ctx is None or k == 0:
                    return run_blocks(blocks, video, audio, perturbations)
                key = (ctx.stage, ctx.tile)
                name = ctx.pass_name
                if ctx.step == 0 and ctx.tile == 0 and (name == "cond" or name.startswith("batch:")):
                    counts.pop(ctx.stage, None)  # a stage starts: its counts are this run's
                if name == "cond":
                    v, a = run_blocks(blocks[:k], video, audio, perturbations)
                    saved[key] = (ctx.serial, v.x if v is not None else None, a.x if a is not None else None)
                    return run_blocks(blocks[k:], v, a, perturbations)
                if name == "stg":
                    here = saved.pop(key, None)  # (one STG pass a step: the tokens are freed once used)
                    configs = list(perturbations.perturbations) if perturbations is not None else []
                    if here is None or here[0] != ctx.serial or stg_start(configs) != start:
                        record(ctx, whole=1)
                        return run_blocks(blocks, video, audio, perturbations)
                    record(ctx, resumed=1)
                    return run_blocks(blocks[k:], _with_x(video, here[1]), _with_x(audio, here[2]), perturbations)
                if name.startswith("batch:"):
                    return batched(name.split(":", 1)[1].split("+"), video, audio, perturbations, ctx)
                return run_blocks(blocks, video, audio, perturbations)

            def batched(rows: list[str], video: Any, audio: Any, perturbations: Any, ctx: Any) -> tuple[Any, Any]:
                configs = list(perturbations.perturbations)
                stg = [i for i, r in enumerate(rows) if r == "stg"]
                if "cond" not in rows or not stg or stg_start([configs[i] for i in stg]) != start:
                    return run_blocks(blocks, video, audio, perturbations)
                keep = [i for i, r in enumerate(rows) if r != "stg"]
                n = len(rows)
                v, a = run_rows(blocks[:k], video, audio, perturbations, keep, n)
                cond = keep.index(rows.index("cond"))
                back = torch.tensor([cond if r == "stg" else keep.index(i) for i, r in enumerate(rows)])
                record(ctx, resumed=len(stg))
                return run_blocks(blocks[k:], _with_x(video, _take(v, back)), _with_x(audio, _take(a, back)),
                                  perturbations)

            return process

        return patch_block_loop(self.name, pipeline, make)


def _take(args: Any, index: torch.Tensor) -> torch.Tensor | None:
    return None if args is None else args.x.index_select(0, index.to(args.x.device))


def _with_x(args: Any, x: torch.Tensor | None) -> Any:
    return args if args is None or x is None else replace(args, x=x)
