"""Defaults of the evaluation that more than one layer needs, written once.

The configuration's schema (``conf/schema.py``) reads them through ``WorkerSpec``'s defaults; this module imports
nothing.
"""

from __future__ import annotations

__all__ = ["FLIP_FRAMES", "RATIO_TOLERANCE"]

# frames FLIP is computed on by default: the worst by PSNR and evenly spaced ones (search/metrics.py; 0: left out)
FLIP_FRAMES = 4
# evaluate_paired stops adding pairs once the ratio's interval is narrower than +- this (eval.ratio_tolerance)
RATIO_TOLERANCE = 0.02
