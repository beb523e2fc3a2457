"""Defaults of the evaluation that more than one layer needs, written once.

The configuration's schema (``conf/schema.py``) reads them through ``WorkerSpec``'s defaults; this module imports
nothing.
"""

from __future__ import annotations

__all__ = ["FLIP_FRAMES", "MP4_AUTO_BYTES", "RATIO_TOLERANCE"]

# frames FLIP is computed on by default: the worst by PSNR and evenly spaced ones (search/metrics.py; 0: left out)
FLIP_FRAMES = 4
# evaluate_paired stops adding pairs once the ratio's interval is narrower than +- this (eval.ratio_tolerance)
RATIO_TOLERANCE = 0.02
# eval.baseline_mp4=null writes the baseline's MP4 up to this many bytes of uint8 frames (1536x1024x121 is
# 0.53 GiB); above, the encode (602 MB, minutes of CPU at 3840x2176x121) is left to a request
MP4_AUTO_BYTES = 1 << 30
