"""Measurement and search: the evaluator (latency, quality, baselines), metrics, workers and studies.

The names below are loaded on first use (PEP 562), as ``vidtune.model``'s are: the evaluator imports the
pipeline (ltx-pipelines, transformers), which a process that only reads specs, records or settings never needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vidtune._compat import lazy_names

if TYPE_CHECKING:
    from vidtune.search.evaluator import Evaluation, ensure_baseline, evaluate
    from vidtune.search.metrics import Quality, audio_snr_db, psnr_db, quality

_WHERE = {"Evaluation": "evaluator", "ensure_baseline": "evaluator", "evaluate": "evaluator",
          "Quality": "metrics", "audio_snr_db": "metrics", "psnr_db": "metrics", "quality": "metrics"}

__all__ = sorted(_WHERE)


__getattr__ = lazy_names(__name__, _WHERE)
