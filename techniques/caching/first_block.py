"""First-block residual cache (FBCache, as in ParaAttention / cache-dit).

Each step runs the first ``fn_blocks`` blocks; their residual is compared with the one of the last
fully computed step of the same pass by relative L1 (sum |delta| / sum |prev|). Below ``threshold``
the remaining blocks are skipped and their cached residual is added instead. Warm-up steps and the
last step are always computed, and at most ``max_consecutive`` steps in a row are cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vidtune.techniques.caching._common import (
    PassCounter,
    add_residual,
    pass_state,
    patch_block_loop,
    relative_l1,
    residual,
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
        Knob("threshold", "float", off=0.0, low=0.0, high=1.0,
             help="relative L1 change of the first blocks' residual below which the rest is reused (0: never)"),
        Knob("fn_blocks", "int", off=1, low=1, high=4, help="blocks always computed (the probe)", scales="depth"),
        Knob("warmup_steps", "int", off=1, low=0, high=8, help="first steps of each stage always computed"),
        Knob("max_consecutive", "int", off=2, low=1, high=8, help="most steps in a row that may be cached"),
    )
    stages = ("stage1", "stage2")
    seams = ("transformer.blocks",)
    description = "first-block residual cache with relative-L1 threshold, per guidance pass"

    def neutral(self, request: Any, device: Any) -> dict[str, Any]:
        # the loop split after fn_blocks and the probe run, but a threshold of 0 never caches a step
        return {"threshold": 0.0, "fn_blocks": 2}

    def effective(self, values: dict[str, Any], request: Any) -> bool:
        from vidtune.model.pipeline import stage_steps

        # a step may be cached from step 1 (step 0 has nothing to reuse), after warm-up, before the last
        return any(max(values["warmup_steps"], 1) < n - 1 for n in stage_steps(request).values())

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        states: dict[tuple, _State] = {}  # keyed by stage: a stage-2 transformer never meets stage 1's state
        counter = PassCounter(self.name)
        return patch_block_loop(self.name, pipeline, lambda blocks: self._process(pipeline, blocks, values, states, counter))

    @staticmethod
    def _process(pipeline: Any, blocks: Any, values: dict[str, Any], states: dict, counter: PassCounter) -> Any:
        fn = min(values["fn_blocks"], len(blocks))

        def process(video: Any, audio: Any, perturbations: Any) -> tuple[Any, Any]:
            key, step, num_steps, st = pass_state(pipeline, states, _State)
            v1, a1 = run_blocks(blocks[:fn], video, audio, perturbations)
            first = (residual(v1, video), residual(a1, audio))
            may_cache = (
                st.rest_residual is not None
                and step >= values["warmup_steps"]
                and step < num_steps - 1
                and st.consecutive < values["max_consecutive"]
            )
            # the statistic is computed (and reduced across ranks) before any rank decides
            if may_cache and relative_l1(pipeline, first, st.first_residual) < values["threshold"]:
                st.consecutive += 1
                counter.add(pipeline, key[0], cached=True)
                return add_residual(v1, st.rest_residual[0]), add_residual(a1, st.rest_residual[1])
            v, a = run_blocks(blocks[fn:], v1, a1, perturbations)
            st.first_residual, st.rest_residual, st.consecutive = first, (residual(v, v1), residual(a, a1)), 0
            counter.add(pipeline, key[0], cached=False)
            return v, a

        return process
