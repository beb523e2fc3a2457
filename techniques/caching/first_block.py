"""First-block residual cache (FBCache, as in ParaAttention / cache-dit).

Each step runs the first ``fn_blocks`` blocks; their residual is compared with the one of the last
fully computed step of the same pass by relative L1 (sum |delta| / sum |prev|). Below ``threshold``
the remaining blocks are skipped and their cached residual is added instead. Warm-up steps and the
last step are always computed, and at most ``max_consecutive`` steps in a row are cached.

With ``kernel_choice.batched_guidance`` a step's passes arrive as one batch. The probe runs on the whole
batch, and each row is decided as its pass alone would be (its state kept under its own pass name): the
remaining blocks run on the rows that need them, the others take their cached residual. Decided for the
batch as a whole, a row's change would be compared with a batch of another make-up (the guidance cache
alternates it), and on ltx2-mini multistep that reused 3 of 40 steps where the passes alone reused 67 of 160.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vidtune.techniques.caching._common import (
    PassCounter,
    add_residual,
    batch_rows,
    pass_state,
    patch_block_loop,
    relative_l1,
    residual,
    row,
    row_states,
    run_blocks,
)
from vidtune.techniques.registry import Knob, Patch, Technique, register


@dataclass
class _State:
    first_residual: tuple | None = None  # residual of the first blocks at the last computed step
    rest_residual: tuple | None = None  # residual of the remaining blocks at the last computed step
    consecutive: int = 0


@register("caching.first_block")
class FirstBlockCache(Technique):
    """Skip the remaining blocks when the first blocks' residual barely changed since the last step."""

    knobs = (
        Knob("threshold", "float", off=0.0, low=0.0, high=1.0, fast="high",
             help="relative L1 change of the first blocks' residual below which the rest is reused (0: never)"),
        Knob("fn_blocks", "int", off=1, low=1, high=4, help="blocks always computed (the probe)", scales="depth",
             fast="low"),
        Knob("warmup_steps", "int", off=1, low=0, high=8, help="first steps of each stage always computed", fast="low"),
        Knob("max_consecutive", "int", off=2, low=1, high=8, help="most steps in a row that may be cached", fast="high"),
    )
    stages = ("stage1", "stage2")
    seams = ("transformer.blocks",)
    description = "first-block residual cache with relative-L1 threshold, per guidance pass"

    def neutral(self, request: Any, device: Any) -> dict[str, Any]:
        # the loop split after fn_blocks and the probe run, but a threshold of 0 never caches a step
        return {"threshold": 0.0, "fn_blocks": 2}

    def effective(self, values: dict[str, Any], request: Any) -> bool:
        from vidtune.model.generation import stage_steps

        # a step may be cached from step 1 (step 0 has nothing to reuse), after warm-up, before the last
        return any(max(values["warmup_steps"], 1) < n - 1 for n in stage_steps(request).values())

    def cached_pass_cost(self, values: dict[str, Any], blocks: int) -> float | None:
        return min(values["fn_blocks"], blocks) / blocks  # (the probe blocks run on every pass)

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        states: dict[tuple, _State] = {}  # keyed by stage: a stage-2 transformer never meets stage 1's state
        counter = PassCounter(self.name)
        return patch_block_loop(self.name, pipeline,
                                lambda blocks, vm: self._process(pipeline, blocks, values, states, counter, vm))

    @staticmethod
    def _process(pipeline: Any, blocks: Any, values: dict[str, Any], states: dict, counter: PassCounter,
                 vm: Any) -> Any:
        from vidtune.techniques.caching.stg_prefix import rows_rest, run_rest, stg_share

        fn = min(values["fn_blocks"], len(blocks))

        def reuse(st: _State, first: tuple, step: int, num_steps: int) -> bool:
            may_cache = (
                st.rest_residual is not None
                and step >= values["warmup_steps"]
                and step < num_steps - 1
                and st.consecutive < values["max_consecutive"]
            )
            # the statistic is computed (and reduced across ranks) before any rank decides
            return may_cache and relative_l1(pipeline, first, st.first_residual) < values["threshold"]

        def process(video: Any, audio: Any, perturbations: Any) -> tuple[Any, Any]:
            share = stg_share(pipeline, vm)
            if (names := batch_rows(pipeline)) is not None:  # (a batch: each row decided as its pass alone)
                return batched(names, video, audio, perturbations, share)
            key, step, num_steps, st = pass_state(pipeline, states, _State)
            v1, a1 = run_blocks(blocks[:fn], video, audio, perturbations)
            first = (residual(v1, video), residual(a1, audio))
            if reuse(st, first, step, num_steps):
                st.consecutive += 1
                counter.add(pipeline, key[0], cached=True)
                return add_residual(v1, st.rest_residual[0]), add_residual(a1, st.rest_residual[1])
            v, a = run_rest(share, key[1], blocks, fn, v1, a1, perturbations)
            st.first_residual, st.rest_residual, st.consecutive = first, (residual(v, v1), residual(a, a1)), 0
            counter.add(pipeline, key[0], cached=False)
            return v, a

        def batched(names: list[str], video: Any, audio: Any, perturbations: Any, share: Any) -> tuple[Any, Any]:
            ctx = pipeline.context
            v1, a1 = run_blocks(blocks[:fn], video, audio, perturbations)
            dv, da = residual(v1, video), residual(a1, audio)
            probes = [(row(dv, i), row(da, i)) for i in range(len(names))]
            rows = list(zip(row_states(pipeline, states, _State, names), probes))  # ((key, state), probe)
            cached = [reuse(st, first, ctx.step, ctx.num_steps) for (_, st), first in rows]
            reused = [st.rest_residual if c else None for ((_, st), _), c in zip(rows, cached)]
            v, a, new = rows_rest(share, names, blocks, fn, v1, a1, perturbations, reused)
            for i, ((key, st), first) in enumerate(rows):
                counter.add(pipeline, key[0], cached=cached[i])
                if cached[i]:
                    st.consecutive += 1
                else:
                    st.first_residual, st.rest_residual, st.consecutive = first, new[i], 0
            return v, a

        return process

