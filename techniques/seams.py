"""The seams: every place in the pipeline a technique may patch, declared once, nested.

A seam is a named place (an attribute of the pipeline, of the transformer or of its modules) or a shared
resource (the ranks of the world). Techniques claim seams by these names only (``register`` refuses an
undeclared one). Seams nest: ``attention.video_self`` contains ``attention.video_self.sparse`` (the sparse
wrapper patches the same attribute and falls back to whatever is installed there), so two techniques
overlap when one claims a seam equal to, inside or around one the other claims; ``check_composition``
then needs a rule from one of them (``Technique.composes_with``).

``seam_of`` maps an attribute a patch touched back to its seam; the conformance suite patches a pipeline
with every technique and checks that what it touched is covered by what it declared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["SEAMS", "Seam", "ancestors", "overlap", "seam_of", "check_declared"]


@dataclass(frozen=True)
class Seam:
    """One declared seam.

    Attributes:
        name: dotted name (``attention.video_self.sparse``).
        parent: the seam containing it, or None.
        where: what is patched there (or which resource is held).
    """

    name: str
    parent: str | None
    where: str


_DECLARED = (
    Seam("transformer.pass", None, "ReferencePipeline.transformer_pass: one X0 prediction of a pass"),
    Seam("transformer.blocks", None, "LTXModel._process_transformer_blocks: the block loop inside a pass"),
    Seam("blocks.call", None, "each transformer block's _compiled_call_impl (how the block is called)"),
    Seam("blocks.forward", None, "each transformer block's forward"),
    Seam("linear.blocks", None, "forward of the linear layers inside the transformer blocks"),
    Seam("blocks.weights", None, "where the transformer blocks' weights live (device, or host memory streamed in)"),
    Seam("blocks.feed_forward", None, "forward of the blocks' feed-forward modules (ff, audio_ff)"),
    Seam("attention", None, "attention_function of the blocks' ltx-core Attention modules"),
    Seam("attention.video_self", "attention", "video self-attention (attn1)"),
    Seam("attention.video_self.sparse", "attention.video_self",
         "a wrapper of the video self-attention function that routes some calls elsewhere"),
    Seam("attention.audio_self", "attention", "audio self-attention (audio_attn1)"),
    Seam("attention.text_cross", "attention", "text cross-attention (attn2, audio_attn2)"),
    Seam("attention.a2v", "attention", "video queries over audio keys (audio_to_video_attn)"),
    Seam("attention.v2a", "attention", "audio queries over video keys (video_to_audio_attn)"),
    Seam("compiler.config", None, "process-wide torch._dynamo and torch.compiler settings"),
    Seam("guidance.passes", None, "ReferencePipeline.run_pass and _guided_denoise_fn: the passes of a guided step"),
    Seam("stage2.tiles", None, "ReferencePipeline.stage2_tiling: the stage-2 tile grid"),
    Seam("stage2.tile_map", None, "ReferencePipeline.map_tiles and stage2: who computes the stage-2 tiles"),
    Seam("stage1.schedule", None, "ReferencePipeline.stage1_sigmas: stage 1's sigma schedule"),
    Seam("denoise.loop", None, "ReferencePipeline._denoising_loop: a stage's sampler loop (its update rule)"),
    Seam("upsample", None, "ReferencePipeline.upsample: the latent upsample call"),
    Seam("decode.video", None, "ReferencePipeline.decode_video: the video VAE decode call"),
    Seam("decode.audio", None, "ReferencePipeline.decode_audio: the audio VAE decode and vocoder call"),
    Seam("decoder.modules", None, "the video VAE decoder's modules: their forward and their weights' layout"),
    Seam("vae.tiles", None, "ReferencePipeline.vae_tiling: the video VAE's decode tiles"),
    Seam("parallel.video_shard", None, "ReferencePipeline.video_shard: the video token shard caches reduce over"),
    Seam("parallel.ranks", None, "the ranks of the world (a resource: two techniques cannot both split them)"),
)
SEAMS: dict[str, Seam] = {s.name: s for s in _DECLARED}

# Attributes of the pipeline object and the seam each belongs to.
_PIPELINE_ATTRS = {
    "transformer_pass": "transformer.pass",
    "vt_skipped_steps": "transformer.pass",  # (caching.step_skip's mask, read by the guidance cache)
    "run_pass": "guidance.passes",
    "_guided_denoise_fn": "guidance.passes",
    "guided_phase": "guidance.passes",
    "stage2_tiling": "stage2.tiles",
    "map_tiles": "stage2.tile_map",
    "stage2": "stage2.tile_map",
    "vae_tiling": "vae.tiles",
    "decode_video": "decode.video",
    "upsample": "upsample",
    "decode_audio": "decode.audio",
    "video_shard": "parallel.video_shard",
    "stage1_sigmas": "stage1.schedule",
    "_denoising_loop": "denoise.loop",
}


def check_declared(names: tuple[str, ...], owner: str) -> None:
    """Raise ``ValueError`` naming ``owner`` when a seam name is not declared here."""
    unknown = [n for n in names if n not in SEAMS]
    if unknown:
        raise ValueError(f"{owner} claims undeclared seam(s) {unknown}; declared: {sorted(SEAMS)} "
                         f"(add a new one to techniques/seams.py)")


def ancestors(name: str) -> list[str]:
    """``name`` and every seam containing it, innermost first."""
    out = []
    while name is not None:
        out.append(name)
        name = SEAMS[name].parent
    return out


def overlap(a: str, b: str) -> bool:
    """Whether two seams are the same place or one contains the other."""
    return a in ancestors(b) or b in ancestors(a)


def seam_of(pipeline: Any, obj: Any, attr: str) -> str:
    """The seam an attribute belongs to (``obj.attr`` as a patch set it); an unknown place is returned as
    ``unknown:<type>.<attr>``, which no technique can declare."""
    import torch

    if obj is pipeline:
        return _PIPELINE_ATTRS.get(attr, f"unknown:pipeline.{attr}")
    if attr == "attention_function":
        from vidtune.model.generation import ATTENTION_KINDS

        for kind in ATTENTION_KINDS:
            if any(m is obj for m in pipeline.attention_modules(kind)):
                return f"attention.{kind}"
    for vm in _velocity_models(pipeline):
        if obj is vm and (attr == "_process_transformer_blocks" or attr.startswith("vt_")):
            return "transformer.blocks"  # (vt_*: what the block loops read, e.g. stg_prefix's StgShare)
        for block in vm.transformer_blocks:
            if obj is block:
                if attr == "forward":
                    return "blocks.forward"
                if attr == "_compiled_call_impl":
                    return "blocks.call"
            elif (attr == "forward" or attr.startswith("vt_")) and any(obj is getattr(block, ff, None)
                                                                       for ff in ("ff", "audio_ff")):
                return "blocks.feed_forward"
            elif ((attr == "forward" or attr.startswith("vt_")) and isinstance(obj, torch.nn.Linear)
                  and any(obj is m for m in block.modules())):
                return "linear.blocks"  # (vt_*: what the patched forward reads, e.g. FP8's weight)
    decoder = getattr(getattr(pipeline, "models", None), "video_decoder", None)
    if decoder is not None and any(obj is m for m in decoder.modules()):
        return "decoder.modules"
    if getattr(obj, "__name__", "") in ("torch._dynamo.config", "torch.compiler.config"):
        return "compiler.config"
    return f"unknown:{type(obj).__name__}.{attr}"


def _velocity_models(pipeline: Any) -> list[Any]:
    transformers = getattr(pipeline, "transformers", None)
    models = transformers() if callable(transformers) else [pipeline.models.transformer]
    return [t.velocity_model for t in models]
