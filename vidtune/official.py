"""A tuned config's module-level techniques on an official ``ltx_pipelines`` pipeline object.

A service that already runs ``ltx_pipelines.distilled.DistilledPipeline`` or
``ltx_pipelines.ti2vid_two_stages.TI2VidTwoStagesPipeline`` can take the part of a tuned config that acts on the
transformer's modules (FP8 linears and weights, torch.compile, CUDA graphs, fused norms, SDPA backends, chunked
feed-forward, block offload) without switching to vidtune's pipeline:

    from ltx_pipelines.distilled import DistilledPipeline
    from vidtune.api import apply_to_official

    pipe = DistilledPipeline(...)
    with apply_to_official(pipe, "results/my-run/tuned-high.yaml"):
        video, audio = pipe(prompt=..., seed=..., ...)

Which techniques qualify is read from the seams each one claims (techniques/seams.py, ``MODULE_SEAMS``): the
others need vidtune's pipeline seams (a step's passes for caching, the stage-2 tile loop for tiling, the decode
call for the VAE decode knobs, the step context for sparse attention, the ranks for parallelism) and are refused
with the technique's name and why, before anything is touched.

The official pipelines build their transformer from the checkpoint at every call (``ModelLedger.transformer``).
Applied, each ledger's transformer is built once, the techniques applied to it, and the same module returned at
every call until ``close``: a compiled graph is compiled once, not at every call (the official ledger frees the
transformer between calls; this keeps it, as vidtune's pipeline does). The outputs are the official pipeline's with
those techniques, equal to vidtune's own pipeline with the same knobs (tests/test_official.py, on tiny).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

__all__ = ["apply_to_official", "OfficialPatch", "module_level"]

# seams that live inside the transformer's modules: a technique whose every seam is one of these needs nothing of
# vidtune's pipeline but its transformers, blocks and attention modules
MODULE_SEAMS = frozenset({"blocks.call", "blocks.forward", "blocks.feed_forward", "blocks.weights", "linear.blocks",
                          "compiler.config", "attention", "attention.video_self", "attention.audio_self",
                          "attention.text_cross", "attention.a2v", "attention.v2a"})


def module_level(tech: Any) -> bool:
    """Whether technique ``tech`` acts on the transformer's modules only (it applies to an official pipeline)."""
    return set(tech.seams) <= MODULE_SEAMS


class _Surface:
    """What the module-level techniques read of vidtune's pipeline, over one transformer an official ledger built."""

    def __init__(self, transformer: torch.nn.Module, device: Any) -> None:
        self._transformer = transformer
        self.device = torch.device(device)
        self.applied_info: dict[str, Any] = {}
        self.records: dict[str, Any] = {}
        self.recorders: list[Any] = []
        self.context = None

    def transformers(self) -> list[torch.nn.Module]:
        return [self._transformer]

    from vidtune.model.pipeline import ReferencePipeline as _Ref

    attention_modules = _Ref.attention_modules
    attention_layers = _Ref.attention_layers
    transformer_blocks = _Ref.transformer_blocks
    del _Ref


class OfficialPatch:
    """The knobs applied to an official pipeline; ``close`` (or the ``with`` block's end) restores it."""

    def __init__(self, pipeline: Any, knobs: Any, notes: list[str]) -> None:
        from vidtune.techniques import compose

        self.pipeline, self.knobs, self.notes = pipeline, knobs, notes
        self._restore: list[tuple[Any, Any]] = []  # (ledger, its own transformer attribute or None)
        self._patches: list[Any] = []
        self.surfaces: list[_Surface] = []
        ledgers = _ledgers(pipeline)
        if not ledgers:
            raise ValueError(f"apply_to_official: {type(pipeline).__name__} has no ModelLedger attribute: not an "
                             f"ltx_pipelines pipeline (DistilledPipeline, TI2VidTwoStagesPipeline)")
        device = getattr(pipeline, "device", "cpu")
        for ledger in ledgers:
            build = ledger.transformer
            built: dict[str, Any] = {}

            def transformer(build=build, built=built) -> torch.nn.Module:
                if "model" not in built:
                    model = build()
                    surface = _Surface(model, device)
                    self._patches.append(compose(surface, knobs))
                    self.surfaces.append(surface)
                    built["model"] = model
                return built["model"]

            self._restore.append((ledger, ledger.__dict__.get("transformer")))
            ledger.transformer = transformer

    def close(self) -> None:
        """Take the techniques off the built transformers and give each ledger its own ``transformer`` back."""
        for patch in reversed(self._patches):
            if not patch.undone:
                patch.undo()
        self._patches.clear()
        for ledger, own in self._restore:
            if own is None:
                ledger.__dict__.pop("transformer", None)
            else:
                ledger.transformer = own
        self._restore.clear()

    def __enter__(self) -> "OfficialPatch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ledgers(pipeline: Any) -> list[Any]:
    """The distinct ``ModelLedger`` objects an official pipeline holds (one, or stage 1's and stage 2's)."""
    from ltx_pipelines.utils.model_ledger import ModelLedger

    out: list[Any] = []
    for value in getattr(pipeline, "__dict__", {}).values():
        if isinstance(value, ModelLedger) and all(value is not o for o in out):
            out.append(value)
    return out


def apply_to_official(pipeline: Any, config: str | Path | dict[str, Any], *, any_request: bool = True) -> OfficialPatch:
    """Apply a tuned config's knobs (a tuned config's path, or knob values ``{technique: {knob: value}}``) to an
    official ``ltx_pipelines`` pipeline. ``ValueError`` naming the technique when one needs vidtune's pipeline
    seams, and for a bad or rejected config, before the pipeline is touched. The config's request is not checked
    (the official pipeline's call decides it; ``notes`` says so)."""
    from vidtune.techniques import get, registered
    from vidtune.techniques.setting import check_composition
    from vidtune.techniques.registry import KnobError
    from vidtune.techniques.setting import CompositionError, Setting  # noqa: E402

    notes: list[str] = []
    if isinstance(config, (str, Path)):
        from vidtune.integrator.tuned import TunedConfigError, load_tuned_config

        try:
            doc = load_tuned_config(config, any_request=any_request)
        except TunedConfigError as exc:
            raise ValueError(str(exc)) from None
        knobs, notes = doc["knobs"], list(doc["notes"])
        notes.append("applied to an official ltx_pipelines pipeline: its request is whatever the call asks; the "
                     "config's measured speed-up is for its own request on vidtune's pipeline")
    else:
        knobs = config
    try:
        knobs = Setting.of(knobs)
        check_composition(knobs)
    except (KnobError, CompositionError, ValueError) as exc:
        raise ValueError(f"apply_to_official: {exc}") from None
    refused = [(name, sorted(set(get(name).seams) - MODULE_SEAMS)) for name, values in knobs.items()
               if not get(name).is_off(values) and not module_level(get(name))]
    if refused:
        raise ValueError("apply_to_official: " + "; ".join(
            f"{name} needs vidtune's pipeline seams ({', '.join(seams)}): use vidtune.api.Deployment for it"
            for name, seams in refused) + f". Techniques that apply to an official pipeline act on the transformer's "
            f"modules: {sorted(t.name for t in registered() if module_level(t))}")
    return OfficialPatch(pipeline, knobs, notes)
