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

With ``caching.first_block`` or ``caching.teacache`` (they replace the block loop too) the sharing runs
inside the cache's loop: this technique leaves its ``StgShare`` on the velocity model (``vt_stg_prefix``),
and a cache that finds it keeps the conditional pass's tokens when it computes that pass and resumes the
STG pass from them when both are computed in the same step. A pass the cache reuses runs no blocks, so
there is nothing to share then: the STG pass goes through the cache as it would without this technique.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from vidtune.techniques.caching._common import batch_rows, rows_through, run_blocks
from vidtune.techniques.registry import Knob, KnobError, Patch, Technique, register

__all__ = ["StgPrefix", "StgShare", "rows_rest", "run_rest", "stg_share", "stg_start"]

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


class StgShare:
    """The conditional pass's tokens at the STG block, kept for the STG pass of the same step.

    Used by this technique's block loop and by the residual caches' (first_block, teacache), which take
    ``start`` as an absolute block index of the transformer's blocks."""

    def __init__(self, pipeline: Any, name: str, start: int) -> None:
        self.pipeline, self.name, self.start = pipeline, name, start
        self.saved: dict[tuple, tuple] = {}  # (stage, tile) -> (step serial, video x, audio x) at block ``start``
        self.counts: dict[str, _Counts] = {}

    def _record(self, ctx: Any, resumed: int = 0, whole: int = 0, skipped: int = 0) -> None:
        c = self.counts.setdefault(ctx.stage, _Counts())
        c.resumed += resumed
        c.whole += whole
        c.blocks_skipped += skipped
        self.pipeline.records[self.name] = {s: vars(v).copy() for s, v in self.counts.items()}

    def stage_starts(self, ctx: Any) -> None:
        """Called on every pass: a stage's first pass resets its counts (they are this run's)."""
        if ctx.step == 0 and ctx.tile == 0 and (ctx.pass_name == "cond" or ctx.pass_name.startswith("batch:")):
            self.counts.pop(ctx.stage, None)

    def run_cond(self, blocks: Any, first: int, video: Any, audio: Any, perturbations: Any) -> tuple[Any, Any]:
        """``blocks[first:]`` for the conditional pass, keeping its tokens as they enter block ``start``."""
        ctx = self.pipeline.context
        if ctx is None or not first < self.start < len(blocks):  # (no block between: nothing to share)
            return run_blocks(blocks[first:], video, audio, perturbations)
        v, a = run_blocks(blocks[first:self.start], video, audio, perturbations)
        self.saved[(ctx.stage, ctx.tile)] = (ctx.serial, _x(v), _x(a))
        return run_blocks(blocks[self.start:], v, a, perturbations)

    def resume(self, blocks: Any, first: int, video: Any, audio: Any, perturbations: Any) -> tuple[Any, Any] | None:
        """``blocks[first:]`` of the STG pass as the blocks from ``start`` on this step's conditional tokens,
        or None (then the caller runs them; counted here as a whole pass)."""
        ctx = self.pipeline.context
        here = self.saved.pop((ctx.stage, ctx.tile), None)  # (one STG pass a step: freed once used)
        configs = list(perturbations.perturbations) if perturbations is not None else []
        if here is None or here[0] != ctx.serial or stg_start(configs) != self.start:
            self._record(ctx, whole=1)
            return None
        self._record(ctx, resumed=1, skipped=self.start - first)
        return run_blocks(blocks[self.start:], _with_x(video, here[1]), _with_x(audio, here[2]), perturbations)

    def batch_prefix(self, names: list[str], perturbations: Any, first: int = 0) -> tuple[int, int, int] | None:
        """For ``rows_through`` over ``blocks[first:]`` of a batch with rows ``names``: (the STG block relative
        to ``first``, the STG row, the conditional row), or None when the batch has nothing to share."""
        if "cond" not in names or "stg" not in names or perturbations is None or not first < self.start:
            return None
        stg = names.index("stg")
        if stg_start([perturbations.perturbations[stg]]) != self.start:
            return None
        return self.start - first, stg, names.index("cond")

    def batch_resumed(self, ctx: Any, names: list[str], prefix: tuple[int, int, int] | None, reuse: list) -> None:
        """Count a computed STG row: resumed by ``rows_through`` (the conditional row computed too) or whole."""
        if "stg" not in names or reuse[names.index("stg")] is not None:
            return
        if prefix is not None and reuse[prefix[2]] is None:
            self._record(ctx, resumed=1, skipped=prefix[0])
        else:
            self._record(ctx, whole=1)


def stg_share(pipeline: Any, vm: Any) -> StgShare | None:
    """The ``StgShare`` ``caching.stg_prefix`` left on a velocity model, for the pass about to run (its
    stage's counts reset at the stage's first pass), or None (not applied, or outside a denoising loop)."""
    share = getattr(vm, "vt_stg_prefix", None)
    if share is None or pipeline.context is None:
        return None
    share.stage_starts(pipeline.context)
    return share


def rows_rest(share: StgShare | None, names: list[str], blocks: Any, first: int, video: Any, audio: Any,
              perturbations: Any, reuse: list) -> tuple[Any, Any, dict[int, tuple]]:
    """``rows_through`` over ``blocks[first:]`` of a batch with rows ``names`` (``reuse``: each row's residual or
    None); with a share the STG row resumes from the conditional row's tokens when both are computed."""
    prefix = share.batch_prefix(names, perturbations, first) if share is not None else None
    v, a, new = rows_through(blocks[first:] if first else blocks, video, audio, perturbations, reuse, prefix)
    if share is not None:
        share.batch_resumed(share.pipeline.context, names, prefix, reuse)
    return v, a, new


def run_rest(share: StgShare | None, name: str, blocks: Any, first: int, video: Any, audio: Any,
             perturbations: Any) -> tuple[Any, Any]:
    """``blocks[first:]`` of a pass a residual cache computes; with a share the conditional pass keeps its
    tokens at the STG block and the STG pass resumes from them (exact: the same result as running it)."""
    if share is not None and name == "cond":
        return share.run_cond(blocks, first, video, audio, perturbations)
    got = share.resume(blocks, first, video, audio, perturbations) if share is not None and name == "stg" else None
    return got if got is not None else run_blocks(blocks[first:], video, audio, perturbations)


@register("caching.stg_prefix")
class StgPrefix(Technique):
    """The STG pass resumes from the conditional pass's tokens at the first block it perturbs."""

    knobs = (Knob("enabled", "bool", off=False,
                  help="the STG guidance pass runs only the blocks from the first one it perturbs, on the "
                       "conditional pass's tokens there (exact)"),)
    switch = "enabled"
    stages = ("stage1",)
    seams = ("transformer.blocks",)
    composes_with = {
        "caching.first_block": "the first-block cache runs the sharing in its own block loop (StgShare on the "
                               "velocity model): the STG pass resumes when the cache computes it and the "
                               "conditional pass of the same step",
        "caching.teacache": "TeaCache runs the sharing in its own block loop, as the first-block cache does",
    }
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
        stg_blocks = tuple(getattr(pipeline.models, "stg_blocks", ()) or ())
        start = min(stg_blocks) if stg_blocks else 0
        patch = Patch(self.name)
        for transformer in pipeline.transformers():
            vm = transformer.velocity_model
            share = StgShare(pipeline, self.name, start)
            patch.set_attr(vm, "vt_stg_prefix", share)
            # a residual cache applied before (first_block: name order) has its loop in place and shares
            # through ``vt_stg_prefix``; one applied after (teacache) replaces this loop and does the same
            if "_process_transformer_blocks" not in vm.__dict__:
                patch.set_attr(vm, "_process_transformer_blocks", _loop(pipeline, share, vm.transformer_blocks))
        return patch


def _loop(pipeline: Any, share: StgShare, blocks: Any) -> Any:
    """The block loop without a residual cache: the conditional pass keeps its tokens, the STG pass resumes."""

    def process(video: Any, audio: Any, perturbations: Any) -> tuple[Any, Any]:
        ctx = pipeline.context
        if ctx is None or share.start == 0:
            return run_blocks(blocks, video, audio, perturbations)
        share.stage_starts(ctx)
        if ctx.pass_name in ("cond", "stg"):
            return run_rest(share, ctx.pass_name, blocks, 0, video, audio, perturbations)
        if (names := batch_rows(pipeline)) is not None:
            v, a, _ = rows_rest(share, names, blocks, 0, video, audio, perturbations, [None] * len(names))
            return v, a
        return run_blocks(blocks, video, audio, perturbations)

    return process


def _x(args: Any) -> Any:
    return None if args is None else args.x


def _with_x(args: Any, x: Any) -> Any:
    return args if args is None or x is None else replace(args, x=x)
