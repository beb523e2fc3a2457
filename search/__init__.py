"""Measurement and search: the evaluator (latency, quality, baselines); campaigns land with issue 5."""

from vidtune.search.evaluator import Evaluation, ensure_baseline, evaluate
from vidtune.search.metrics import Quality, audio_snr_db, psnr_db, quality

__all__ = ["Evaluation", "Quality", "audio_snr_db", "ensure_baseline", "evaluate", "psnr_db", "quality"]
