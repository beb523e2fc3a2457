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
           "add_residual", "residual", "batch_rows", "row_states", "row", "select_rows", "run_rows", "rows_through"]

PassKey = tuple[str, str, int]


def pass_key(pipeline: Any) -> tuple[PassKey, int, int]:
    """(state key, step, number of steps) of the pass about to run; outside a loop: one-step stage."""
    ctx = pipeline.context
    if ctx is None:
        return ("none", "cond", 0), 0, 1
    return (ctx.stage, ctx.pass_name, ctx.tile), ctx.step, ctx.num_steps


def pass_state(pipeline: Any, states: dict, factory: Callable[[], Any],
               name: str | None = None) -> tuple[PassKey, int, int, Any]:
    """(key, step, number of steps, state) of the coming pass; the state is fresh at a stage's step 0.
    ``name``: a batch row's pass (``batch_rows``), keyed as that pass run alone would be."""
    key, step, num_steps = pass_key(pipeline)
    if name is not None:
        key = (key[0], name, key[2])
    if step == 0 or key not in states:
        states[key] = factory()
    return key, step, num_steps, states[key]


def row_states(pipeline: Any, states: dict, factory: Callable[[], Any], names: list[str]) -> list[tuple[PassKey, Any]]:
    """(key, state) of each batch row ``names``: ``pass_state`` of the row's pass, as that pass alone has it."""
    return [(key, st) for key, _, _, st in (pass_state(pipeline, states, factory, n) for n in names)]


def batch_rows(pipeline: Any) -> list[str] | None:
    """The guidance passes a batched call holds, one per batch row, or None for a call of one pass.

    ``kernel_choice.batched_guidance`` runs a step's passes as one call named after its rows
    (``batch:cond+uncond+stg+modality``). A cache that decides per pass keeps its state per row under the
    row's own pass name, so it decides for each row what it would decide for that pass run alone."""
    ctx = pipeline.context
    if ctx is None or not ctx.pass_name.startswith("batch:"):
        return None
    return ctx.pass_name.split(":", 1)[1].split("+")


def row(x: torch.Tensor | None, i: int) -> torch.Tensor | None:
    """Row ``i`` of a batch of tokens, [1, ...], as its own tensor (a kept row holds no other row's memory)."""
    return None if x is None else x[i:i + 1].clone()


def _rows(value: Any, index: torch.Tensor, batch: int) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch:
        return value.index_select(0, index.to(value.device))
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_rows(v, index, batch) for v in value)
    return value  # (a broadcast [1, ...] tensor, a flag, None)


def select_rows(args: Any, rows: list[int], batch: int) -> Any:
    """``TransformerArgs`` of the batch rows ``rows`` (every batched tensor field; broadcast ones kept)."""
    if args is None:
        return None
    from dataclasses import fields

    index = torch.tensor(rows, dtype=torch.long)
    return replace(args, **{f.name: _rows(getattr(args, f.name), index, batch) for f in fields(args)})


def run_rows(blocks: Any, video: Any, audio: Any, perturbations: Any, rows: list[int], batch: int) -> tuple[Any, Any]:
    """``blocks`` on the batch rows ``rows`` only, with those rows' perturbations: (video, audio) of those rows."""
    if len(rows) == batch:
        return run_blocks(blocks, video, audio, perturbations)
    return run_blocks(blocks, select_rows(video, rows, batch), select_rows(audio, rows, batch),
                      _perturbation_rows(perturbations, rows, batch))


def _perturbation_rows(perturbations: Any, rows: list[int], batch: int) -> Any:
    """The batch's ``BatchedPerturbationConfig`` for the rows ``rows`` only."""
    if perturbations is None or len(rows) == batch:
        return perturbations
    from ltx_core.guidance.perturbations import BatchedPerturbationConfig

    return BatchedPerturbationConfig(perturbations=[perturbations.perturbations[i] for i in rows])


def _with_rows(args: Any, parts: list[torch.Tensor | None]) -> Any:
    """``args`` with its tokens replaced by ``parts`` (one [1, ...] tensor a row) stacked again."""
    if args is None or any(p is None for p in parts):
        return args
    return replace(args, x=torch.cat(parts, dim=0))


def _x(args: Any) -> torch.Tensor | None:
    return None if args is None else args.x


def _sub(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    return None if a is None or b is None else a - b


def _plus(args: Any, i: int, res: torch.Tensor | None) -> torch.Tensor | None:
    return None if args is None else (row(args.x, i) if res is None else args.x[i:i + 1] + res)


def rows_through(blocks: Any, video: Any, audio: Any, perturbations: Any, reuse: list[tuple | None],
                 prefix: tuple[int, int, int] | None = None) -> tuple[Any, Any, dict[int, tuple]]:
    """A batch through ``blocks`` where each row either runs them or reuses a residual.

    ``reuse[i]`` is row i's cached (video, audio) residual over these blocks, or None to compute the row.
    The blocks run on the computed rows only; a reused row is its input plus its residual. Returns the
    batch's (video, audio) and, per computed row, its new residual. With every row computed the output is
    the blocks' own, untouched.

    ``prefix`` (block k, row s, row c; ``caching.stg_prefix``): row s's blocks before k compute what row c's
    do, so when both rows are computed, blocks[:k] run without row s, which enters block k with row c's
    tokens there."""
    n = len(reuse)
    run = [i for i, res in enumerate(reuse) if res is None]
    if prefix is not None and prefix[1] in run and prefix[2] in run and 0 < prefix[0] < len(blocks):
        k, s, c = prefix
        head = [i for i in run if i != s]
        hv, ha = run_rows(blocks[:k], video, audio, perturbations, head, n)
        back = torch.tensor([head.index(c) if i == s else head.index(i) for i in run])
        v0, a0 = select_rows(video, run, n), select_rows(audio, run, n)
        v0 = v0 if v0 is None else replace(v0, x=hv.x.index_select(0, back.to(hv.x.device)))
        a0 = a0 if a0 is None else replace(a0, x=ha.x.index_select(0, back.to(ha.x.device)))
        v, a = run_blocks(blocks[k:], v0, a0, _perturbation_rows(perturbations, run, n))
    else:
        v, a = run_rows(blocks, video, audio, perturbations, run, n) if run else (None, None)
    new: dict[int, tuple] = {}
    parts_v, parts_a = [], []
    for i, res in enumerate(reuse):
        if res is not None:
            parts_v.append(_plus(video, i, res[0]))
            parts_a.append(_plus(audio, i, res[1]))
            continue
        j = run.index(i)
        out_v, out_a = row(_x(v), j), row(_x(a), j)
        new[i] = (_sub(out_v, row(_x(video), i)), _sub(out_a, row(_x(audio), i)))
        parts_v.append(out_v)
        parts_a.append(out_a)
    if len(run) == n:
        return v, a, new
    return _with_rows(video, parts_v), _with_rows(audio, parts_a), new


def patch_block_loop(name: str, pipeline: Any, make_process: Callable[[Any], Callable[..., tuple[Any, Any]]]) -> Any:
    """Undoable patch replacing each transformer's block loop (``LTXModel._process_transformer_blocks``) by
    ``make_process(blocks, velocity_model)`` of its own blocks (stage 2 may have its own transformer)."""
    from vidtune.techniques.registry import Patch

    patch = Patch(name)
    for transformer in pipeline.transformers():
        vm = transformer.velocity_model
        patch.set_attr(vm, "_process_transformer_blocks", make_process(vm.transformer_blocks, vm))
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
