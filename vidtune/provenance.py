"""What made a result: the command, the request, the model, the device and the versions, written into every JSON
vidtune prints or stores (bench, evaluate, generate, baseline, campaign, calibrate), so that a result file can be
quoted on its own. Before, `vidtune bench` printed the knobs and the numbers only."""

from __future__ import annotations

import shlex
import sys
import time
from typing import Any, Sequence

__all__ = ["provenance"]


def provenance(settings: Any, argv: Sequence[str] | None) -> dict[str, Any]:
    """``settings`` (``vidtune.settings.Settings``) and the command's arguments (``vidtune`` excluded; None: this
    process's own)."""
    from vidtune.search.baseline import environment, package_version

    args = list(sys.argv[1:] if argv is None else argv)
    env = environment(settings.device)
    env.update({name: package_version(name) for name in ("optuna", "ray", "triton")})
    return {
        "command": "vidtune " + " ".join(shlex.quote(a) for a in args),
        "request": settings.request.to_dict(),
        "model": settings.source.identity(),
        "device": env.pop("device"),
        "versions": env,
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
