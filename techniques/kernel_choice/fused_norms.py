"""Kernel choice: fused AdaLN-RMSNorm modulation and gated residual adds in every transformer block.

The block forward is vidtune's transcription of ltx-core 1.0.0's ``BasicAVTransformerBlock.forward``
with the two elementwise patterns routed through ``kernels/fused_norms.py``:
``rms_norm(x) * (1 + scale) + shift`` (self-attention, text cross-attention query, audio-video
cross-attention, feed-forward) and ``x + y * gate`` (after each of them). With ``backend=reference``
the routed functions are the unfused PyTorch expressions and the block is bit-identical to ltx-core's
(tested), which is what pins the transcription; ``backend=triton`` runs the fused kernels (CUDA, or
Triton's interpreter on a CPU). ``ops`` chooses what is fused: the modulated norms, or those and the
gated residuals.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, Callable

import torch

from vidtune.kernels.fused_norms import (
    adaln_rmsnorm_reference,
    adaln_rmsnorm_triton,
    gated_residual_reference,
    gated_residual_triton,
)
from vidtune.kernels.triton_runtime import triton_available
from vidtune.techniques.registry import Knob, KnobError, Patch, Technique, register

__all__ = ["FusedNorms", "fused_block_forward"]


def fused_block_forward(block: Any, norm_mod: Callable, gated_add: Callable, video: Any, audio: Any,
                        perturbations: Any = None) -> tuple[Any, Any]:
    """``BasicAVTransformerBlock.forward`` with the modulated norms and gated adds as given functions."""
    from ltx_core.guidance.perturbations import BatchedPerturbationConfig, PerturbationType
    from ltx_core.utils import rms_norm

    if video is None and audio is None:
        raise ValueError("At least one of video or audio must be provided")
    batch_size = (video or audio).x.shape[0]
    if perturbations is None:
        perturbations = BatchedPerturbationConfig.empty(batch_size)
    vx = video.x if video is not None else None
    ax = audio.x if audio is not None else None
    run_vx = video is not None and video.enabled and vx.numel() > 0
    run_ax = audio is not None and audio.enabled and ax.numel() > 0
    run_a2v = run_vx and (audio is not None and ax.numel() > 0)
    run_v2a = run_ax and (video is not None and vx.numel() > 0)
    eps = block.norm_eps

    def self_attention(x, args, table, attn, skip_type):
        shift, scale, gate = block.get_ada_values(table, x.shape[0], args.timesteps, slice(0, 3))
        normed = norm_mod(x, scale, shift, eps)
        all_p = perturbations.all_in_batch(skip_type, block.idx)
        none_p = not perturbations.any_in_batch(skip_type, block.idx)
        mask = perturbations.mask_like(skip_type, block.idx, x) if not all_p and not none_p else None
        y = attn(normed, pe=args.positional_embeddings, mask=args.self_attention_mask, perturbation_mask=mask,
                 all_perturbed=all_p)
        return gated_add(x, y, gate)

    def text_cross(x, args, attn, table, prompt_table):
        if block.cross_attention_adaln:
            shift_q, scale_q, gate = block.get_ada_values(table, x.shape[0], args.timesteps, slice(6, 9))
            shift_kv, scale_kv = (
                prompt_table[None, None].to(device=x.device, dtype=x.dtype)
                + args.prompt_timestep.reshape(x.shape[0], args.prompt_timestep.shape[1], 2, -1)
            ).unbind(dim=2)
            ctx = args.context * (1 + scale_kv) + shift_kv
            return gated_add(x, attn(norm_mod(x, scale_q, shift_q, eps), context=ctx, mask=args.context_mask), gate)
        return x + attn(rms_norm(x, eps=eps), context=args.context, mask=args.context_mask)

    if run_vx:
        vx = self_attention(vx, video, block.scale_shift_table, block.attn1, PerturbationType.SKIP_VIDEO_SELF_ATTN)
        vx = text_cross(vx, video, block.attn2, block.scale_shift_table, getattr(block, "prompt_scale_shift_table", None))
    if run_ax:
        ax = self_attention(ax, audio, block.audio_scale_shift_table, block.audio_attn1,
                            PerturbationType.SKIP_AUDIO_SELF_ATTN)
        ax = text_cross(ax, audio, block.audio_attn2, block.audio_scale_shift_table,
                        getattr(block, "audio_prompt_scale_shift_table", None))

    if run_a2v or run_v2a:
        # ltx-core normalises both streams once, before either direction updates them; the fused norm
        # recomputes the RMS from the same pre-update tokens, so both directions see the same inputs
        vx_in, ax_in = vx, ax

        def av_cross(x, x_in, args, table, kv_in, kv_args, kv_table, attn, which, skip_type):
            scale, shift, gate = block.get_av_ca_ada_values(table, x.shape[0], args.cross_scale_shift_timestep,
                                                            args.cross_gate_timestep, which)
            kv_scale, kv_shift, _ = block.get_av_ca_ada_values(kv_table, kv_in.shape[0],
                                                               kv_args.cross_scale_shift_timestep,
                                                               kv_args.cross_gate_timestep, which)
            mask = perturbations.mask_like(skip_type, block.idx, x)
            y = attn(norm_mod(x_in, scale, shift, eps), context=norm_mod(kv_in, kv_scale, kv_shift, eps),
                     pe=args.cross_positional_embeddings, k_pe=kv_args.cross_positional_embeddings)
            return gated_add(x, y * gate, mask)

        video_table, audio_table = block.scale_shift_table_a2v_ca_video, block.scale_shift_table_a2v_ca_audio
        if run_a2v and not perturbations.all_in_batch(PerturbationType.SKIP_A2V_CROSS_ATTN, block.idx):
            vx = av_cross(vx, vx_in, video, video_table, ax_in, audio, audio_table, block.audio_to_video_attn,
                          slice(0, 2), PerturbationType.SKIP_A2V_CROSS_ATTN)
        if run_v2a and not perturbations.all_in_batch(PerturbationType.SKIP_V2A_CROSS_ATTN, block.idx):
            ax = av_cross(ax, ax_in, audio, audio_table, vx_in, video, video_table, block.video_to_audio_attn,
                          slice(2, 4), PerturbationType.SKIP_V2A_CROSS_ATTN)

    if run_vx:
        shift, scale, gate = block.get_ada_values(block.scale_shift_table, vx.shape[0], video.timesteps, slice(3, 6))
        vx = gated_add(vx, block.ff(norm_mod(vx, scale, shift, eps)), gate)
    if run_ax:
        shift, scale, gate = block.get_ada_values(block.audio_scale_shift_table, ax.shape[0], audio.timesteps,
                                                  slice(3, 6))
        ax = gated_add(ax, block.audio_ff(norm_mod(ax, scale, shift, eps)), gate)
    return (replace(video, x=vx) if video is not None else None,
            replace(audio, x=ax) if audio is not None else None)


@register("kernel_choice.fused_norms")
class FusedNorms(Technique):
    """AdaLN-modulated RMSNorm and gated residual adds as single fused kernels in every block."""

    knobs = (
        Knob("ops", "categorical", off="off", choices=("off", "norms", "norms+gates"),
             help="what is fused: the modulated norms, or those and the gated residual adds (off: ltx-core's block)"),
        Knob("backend", "categorical", off="triton", choices=("triton", "reference"),
             help="Triton kernels (CUDA; CPU only under TRITON_INTERPRET=1) or the unfused PyTorch reference"),
    )
    switch = "ops"
    stages = ("stage1", "stage2")
    uniform_passes = True
    # Replaces each block's ``forward``, as cuda_graphs' runner does: the two are rejected together.
    # With compile, the compiled call traces this forward (Inductor then fuses the same elementwise work).
    seams = ("blocks.forward",)
    description = "fused AdaLN RMSNorm modulation and gated residuals (Triton) in every transformer block"

    def applicable(self, request: Any = None) -> bool:
        # Searched only where its kernels run (a CUDA GPU here, or Triton's interpreter): the reference
        # backend is ltx-core's own arithmetic, so on a CPU there is nothing to find.
        return triton_available(torch.device("cuda" if torch.cuda.is_available() else "cpu"))

    def neutral(self, request: Any, device: Any) -> dict[str, Any]:
        # vidtune's transcription of ltx-core's block with the unfused expressions: bit-identical
        return {"ops": "norms+gates", "backend": "reference"}

    def check_device(self, values: dict[str, Any], device: Any) -> None:
        if values["ops"] != "off" and values["backend"] == "triton" and not triton_available(device):
            raise KnobError(f"{self.name}.backend=triton needs a CUDA device (the pipeline runs on {device}); "
                            "use backend=reference, or TRITON_INTERPRET=1 to test on a CPU")

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        self.check_device(values, pipeline.device)
        triton = values["backend"] == "triton"
        norm_mod = adaln_rmsnorm_triton if triton else adaln_rmsnorm_reference
        gated = gated_residual_triton if triton and values["ops"] == "norms+gates" else gated_residual_reference
        patch = Patch(self.name)
        for block in pipeline.transformer_blocks():
            patch.set_attr(block, "forward", functools.partial(fused_block_forward, block, norm_mod, gated))
        return patch
