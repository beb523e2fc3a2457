"""``vidtune dashboard NAME``: a campaign's Optuna studies (one per family) in optuna-dashboard, served on loopback.

optuna-dashboard is an optional extra (``pip install 'vidtune[dashboard]'``; the Makefile installs it). It reads the
campaign's own storage, the journal file or the PostgreSQL database of ``campaign_spec.json``, so a running
campaign's trials appear as they finish. Each trial's ratio against the baseline, its interval, the tiers it
passes, its quality, peak memory and failure reason are user attributes (search/campaign.py, ``tell_result``)."""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path
from typing import Any

__all__ = ["serve", "campaign_storage"]


def campaign_storage(results_dir: str, name: str) -> tuple[Any, Any]:
    """(spec, the Optuna storage) of campaign ``name`` under ``results_dir``; ``ValueError`` when it is not one."""
    from vidtune.search.campaign import load_spec
    from vidtune.search.storage import storage_for

    spec = load_spec(Path(results_dir) / name)
    return spec, storage_for(spec)


def serve(results_dir: str, name: str, host: str = "127.0.0.1", port: int = 8080, public: bool = False) -> int:
    """Serve campaign ``name``'s studies until interrupted. ``host`` must be a loopback address unless ``public``
    (the dashboard can edit studies and has no authentication)."""
    try:
        import optuna_dashboard
    except ImportError:
        raise RuntimeError("vidtune dashboard needs optuna-dashboard: pip install 'vidtune[dashboard]'") from None
    if not 1 <= port <= 65535:
        raise ValueError(f"--port must be in [1, 65535], got {port}")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        raise ValueError(f"--host must be an IP address or localhost, got {host!r}") from None
    if not loopback and not public:
        raise ValueError(f"--host {host} is not a loopback address: the dashboard can change the studies and asks for "
                         f"no password; pass --public to serve it there anyway")
    spec, storage = campaign_storage(results_dir, name)
    studies = [f"{spec.name}:{family}" for family in spec.families]
    print(f"vidtune dashboard: campaign {spec.name!r} (studies {', '.join(studies)}) at http://{host}:{port}/ "
          f"(Ctrl-C stops it)", file=sys.stderr, flush=True)
    optuna_dashboard.run_server(storage, host=host, port=port)
    return 0
