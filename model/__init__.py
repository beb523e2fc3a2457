"""The reference LTX-2 pipeline (built from ltx-core 1.0.0 components) and its presets.

The names are loaded on first use (PEP 562): ``vidtune.model.pipeline`` imports ltx-pipelines, whose import
(transformers with it) took 4.2 s of the 7.5 s that ``vidtune --help`` spent importing on a 2-core AMD EPYC; a
process that only reads presets, requests or settings (the campaign's driver, the CLI's checks, the report) does
not pay it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vidtune._compat import lazy_names

if TYPE_CHECKING:
    from vidtune.model.loading import ModelSource, Models, load_models
    from vidtune.model.generation import ATTENTION_KINDS, STAGES, GenerationOutput, StageLatents, StepContext
    from vidtune.model.pipeline import ReferencePipeline
    from vidtune.model.presets import PRESETS, Preset, get_preset
    from vidtune.model.request import GenerationRequest, RequestError
    from vidtune.model.tiles import Stage2Tiling

_WHERE = {
    "ModelSource": "loading", "Models": "loading", "load_models": "loading",
    "ATTENTION_KINDS": "generation", "STAGES": "generation", "GenerationOutput": "generation",
    "StageLatents": "generation", "StepContext": "generation", "ReferencePipeline": "pipeline",
    "PRESETS": "presets", "Preset": "presets", "get_preset": "presets",
    "GenerationRequest": "request", "RequestError": "request",
    "Stage2Tiling": "tiles",
}

__all__ = sorted(_WHERE)


__getattr__ = lazy_names(__name__, _WHERE)
