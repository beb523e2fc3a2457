"""TeaCache: reuse the whole transformer residual while the modulated input has barely moved.

Follows the idea of TeaCache (Liu et al., 2024): the first block's timestep-modulated input
(RMSNorm(x) * (1 + scale) + shift with the first block's AdaLN values) changes across steps much like
the model output does; its relative L1 change is accumulated step by step, and while the sum stays
below ``threshold`` the cached residual of all blocks is added instead of running them. When the sum
passes the threshold the pass is computed and the sum resets. (No polynomial rescaling: the threshold
is searched directly.)

With ``kernel_choice.batched_guidance`` each row of a batched step is decided as its pass alone would be
(its own accumulated change, kept under its pass name), and the blocks run on the rows that need them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

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
)
from vidtune.techniques.registry import Knob, Patch, Technique, register


@dataclass
class _State:
    prev_modulated: tuple | None = None
    cached: tuple | None = None
    accumulated: float = 0.0


def _modulated(block: Any, args: Any) -> torch.Tensor | None:
    """The first block's AdaLN-modulated self-attention input for one modality."""
    from ltx_core.utils import rms_norm

    if args is None:
        return None
    table = block.scale_shift_table if args.x.shape[-1] == block.scale_shift_table.shape[-1] else block.audio_scale_shift_table
    shift, scale, _ = block.get_ada_values(table, args.x.shape[0], args.timesteps, slice(0, 3))
    return rms_norm(args.x, eps=block.norm_eps) * (1 + scale) + shift


@register("caching.teacache")
class TeaCache(Technique):
    """Accumulated modulated-input change decides when to recompute all blocks."""

    knobs = (
        Knob("threshold", "float", off=0.0, low=0.0, high=2.0, fast="high",
             help="accumulated relative L1 of the modulated input that forces a recompute (0: always compute)"),
        Knob("first_kept", "int", off=1, low=0, high=8, help="first steps of each stage always computed", fast="low"),
        Knob("last_kept", "int", off=1, low=1, high=4, help="last steps of each stage always computed", fast="low"),
    )
    stages = ("stage1", "stage2")
    seams = ("transformer.blocks",)
    description = "TeaCache: accumulated modulated-input change gates reuse of the full residual"

    def neutral(self, request: Any, device: Any) -> dict[str, Any]:
        # the modulated inputs are computed and accumulated, but a threshold of 0 never reuses a residual
        return {"threshold": 0.0, "first_kept": 2}

    def effective(self, values: dict[str, Any], request: Any) -> bool:
        from vidtune.model.generation import stage_steps

        # reuse needs a computed step before it (step >= 1), after the first kept and before the last kept
        return any(max(values["first_kept"], 1) < n - values["last_kept"] for n in stage_steps(request).values())

    def cached_pass_cost(self, values: dict[str, Any], blocks: int) -> float | None:
        return 0.0  # (the probe: the first block's modulated input, a small share of one block)

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        states: dict[tuple, _State] = {}  # keyed by stage: a stage-2 transformer never meets stage 1's state
        counter = PassCounter(self.name)
        return patch_block_loop(self.name, pipeline,
                                lambda blocks, vm: self._process(pipeline, blocks, values, states, counter, vm))

    @staticmethod
    def _process(pipeline: Any, blocks: Any, values: dict[str, Any], states: dict, counter: PassCounter,
                 vm: Any) -> Any:
        from vidtune.techniques.caching.stg_prefix import rows_rest, run_rest, stg_share

        def reuse(st: _State, modulated: tuple, step: int, num_steps: int) -> bool:
            if st.prev_modulated is not None:
                st.accumulated += relative_l1(pipeline, modulated, st.prev_modulated)
            st.prev_modulated = modulated
            kept = step < values["first_kept"] or step >= num_steps - values["last_kept"]
            return not kept and st.cached is not None and st.accumulated < values["threshold"]

        def batched(names: list[str], video: Any, audio: Any, perturbations: Any, share: Any) -> tuple[Any, Any]:
            ctx = pipeline.context
            mv, ma = _modulated(blocks[0], video), _modulated(blocks[0], audio)
            rows = row_states(pipeline, states, _State, names)
            cached = [reuse(st, (row(mv, i), row(ma, i)), ctx.step, ctx.num_steps) for i, (_, st) in enumerate(rows)]
            reused = [st.cached if c else None for (_, st), c in zip(rows, cached)]
            v, a, new = rows_rest(share, names, blocks, 0, video, audio, perturbations, reused)
            for i, (key, st) in enumerate(rows):
                counter.add(pipeline, key[0], cached=cached[i])
                if not cached[i]:
                    st.cached, st.accumulated = new[i], 0.0
            return v, a

        def process(video: Any, audio: Any, perturbations: Any) -> tuple[Any, Any]:
            share = stg_share(pipeline, vm)
            if (names := batch_rows(pipeline)) is not None:  # (a batch: each row decided as its pass alone)
                return batched(names, video, audio, perturbations, share)
            key, step, num_steps, st = pass_state(pipeline, states, _State)
            modulated = (_modulated(blocks[0], video), _modulated(blocks[0], audio))
            if reuse(st, modulated, step, num_steps):
                counter.add(pipeline, key[0], cached=True)
                return add_residual(video, st.cached[0]), add_residual(audio, st.cached[1])
            v, a = run_rest(share, key[1], blocks, 0, video, audio, perturbations)
            st.cached, st.accumulated = (residual(v, video), residual(a, audio)), 0.0
            counter.add(pipeline, key[0], cached=False)
            return v, a

        return process
