"""``vidtune mcp``: the product for coding agents, as a Model Context Protocol server over stdio.

Every tool runs the ``vidtune`` command line in a child process of the same interpreter, so an agent gets the
same validation, the same records and the same errors as a person at a terminal (a bad override is answered
with the command's message, before any model work), and a crash of a measurement never takes the server down.
A campaign runs detached: ``start_campaign`` returns at once, ``campaign_status`` reads its records and log as
it goes, ``stop_campaign`` asks it to stop between evaluations (it resumes with ``start_campaign`` again).

The ``mcp`` SDK is an optional dependency (``pip install 'vidtune[mcp]'``); without it the command says so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from vidtune.api import campaign_results

__all__ = ["build_server", "serve"]

# (seconds) a measurement tool's limit: an evaluate or a bench of the 19B at 4K takes minutes
COMMAND_TIMEOUT_S = 3600.0


def _vidtune(*args: str, timeout: float = COMMAND_TIMEOUT_S) -> dict[str, Any]:
    """``vidtune ARGS`` in a child process: its exit status, its JSON output where it printed one, the tail of
    its messages (stderr)."""
    done = subprocess.run([sys.executable, "-m", "vidtune.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out: dict[str, Any] = {"exit_status": done.returncode, "messages": done.stderr[-4000:]}
    text = done.stdout.strip()
    try:
        out["result"] = json.loads(text) if text else None
    except json.JSONDecodeError:
        out["output"] = text[-4000:]
    return out


class _Campaigns:
    """The campaigns this server started (name -> child process), and what any campaign's folder says."""

    def __init__(self, results_dir: Path) -> None:
        self.results_dir = results_dir
        self.running: dict[str, subprocess.Popen] = {}

    def folder(self, name: str) -> Path:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"campaign name: a folder name under results_dir, got {name!r}")
        return self.results_dir / name

    def start(self, name: str, overrides: list[str]) -> dict[str, Any]:
        proc = self.running.get(name)
        if proc is not None and proc.poll() is None:
            return {"name": name, "started": False, "why": "running already (this server started it)", "pid": proc.pid}
        bad = [o for o in overrides if o.split("=", 1)[0] in ("name", "results_dir")]
        if bad:
            raise ValueError(f"overrides: name and results_dir are the tool's (name=..., the server's --results-dir), "
                             f"got {bad}")
        folder = self.folder(name)
        folder.mkdir(parents=True, exist_ok=True)
        log = folder / "mcp-campaign.log"
        with open(log, "ab") as f:
            proc = subprocess.Popen([sys.executable, "-m", "vidtune.cli", "campaign", f"name={name}",
                                     f"results_dir={self.results_dir}", *overrides], stdout=f, stderr=subprocess.STDOUT,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        self.running[name] = proc
        return {"name": name, "started": True, "pid": proc.pid, "log": str(log)}

    def stop(self, name: str, wait_s: float) -> dict[str, Any]:
        proc = self.running.get(name)
        if proc is None or proc.poll() is not None:
            return {"name": name, "stopped": False, "why": "not running from this server",
                    "exit_status": None if proc is None else proc.returncode}
        proc.send_signal(signal.SIGTERM)  # (the campaign stops between evaluations and keeps what finished)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return {"name": name, "stopped": False, "why": f"still stopping after {wait_s:.0f} s (an evaluation "
                    "in flight ends first)", "pid": proc.pid}
        return {"name": name, "stopped": True, "exit_status": proc.returncode}

    def status(self, name: str, log_lines: int) -> dict[str, Any]:
        from vidtune.search.records import RecordLog
        from vidtune.search.storage import campaign_running

        folder = self.folder(name)
        if not folder.is_dir():
            raise ValueError(f"campaign {name!r}: no folder {folder}")
        proc = self.running.get(name)
        records = RecordLog(folder / "trials.jsonl").read() if (folder / "trials.jsonl").is_file() else []
        counts = Counter(f"{r.get('family')}:{'final' if r.get('phase') == 'final' else r.get('status')}"
                         for r in records)
        out: dict[str, Any] = {
            "name": name, "folder": str(folder),
            "running": (proc is not None and proc.poll() is None) or campaign_running(folder),
            "exit_status": None if proc is None else proc.poll(),
            "records": dict(sorted(counts.items())),
            "finished": (folder / "campaign.json").is_file(),
        }
        for log in ("mcp-campaign.log", "progress.log"):
            if (folder / log).is_file():
                out["log_tail"] = (folder / log).read_text(errors="replace").splitlines()[-log_lines:]
                break
        if out["finished"]:
            out["summary"] = campaign_results(name, self.results_dir)
        return out


def build_server(results_dir: str | Path = "results") -> Any:
    """The MCP server (``mcp.server.mcpserver.MCPServer``) with vidtune's tools, campaigns under ``results_dir``."""
    try:
        from mcp.server.mcpserver import MCPServer
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError as exc:  # (an optional dependency)
        raise RuntimeError("vidtune mcp needs the MCP SDK: pip install 'vidtune[mcp]' (mcp >= 2)") from exc

    results = Path(results_dir).resolve()
    campaigns = _Campaigns(results)

    def anticipated(call: Any, *args: Any) -> Any:
        """A bad argument (a ValueError naming the field) reaches the agent as the tool's error message."""
        try:
            return call(*args)
        except ValueError as exc:
            raise ToolError(str(exc)) from exc
    server = MCPServer("vidtune", instructions=(
        "vidtune finds, by measurement, how to run the LTX-2 video pipeline faster within a quality gate. "
        "Settings are knobs FAMILY.TECHNIQUE.KNOB=VALUE (list_knobs); requests and models are Hydra overrides "
        "(model=ltx2-mini request.height=512 ...). A campaign searches them and exports tuned configs per tier."))

    @server.tool()
    def list_knobs() -> dict[str, Any]:
        """Every registered technique: its family, knobs, their domains and off values."""
        return _vidtune("knobs", "--json")

    @server.tool()
    def start_campaign(name: str, overrides: list[str] | None = None) -> dict[str, Any]:
        """Start (or resume: the same name goes on from its records) a search campaign in the background, e.g.
        overrides ["model=ltx2-mini", "families=[caching,tiling]", "budget.minutes=20", "tiers=calibrated"]."""
        return anticipated(campaigns.start, name, list(overrides or []))

    @server.tool()
    def stop_campaign(name: str, wait_s: float = 60.0) -> dict[str, Any]:
        """Stop a campaign this server started, between evaluations (finished work is kept; start it again to
        resume)."""
        return campaigns.stop(name, wait_s)

    @server.tool()
    def campaign_status(name: str, log_lines: int = 20) -> dict[str, Any]:
        """A campaign's progress: whether it runs, its records per family and status, the last log lines, and
        once finished what it found per tier."""
        return anticipated(campaigns.status, name, log_lines)

    @server.tool()
    def report(name: str) -> dict[str, Any]:
        """Write the campaign's report (report.html) and return its summary: per tier the speed-up, p-value,
        quality and the model the quality comes from."""
        folder = anticipated(campaigns.folder, name)
        made = _vidtune("report", name, "--results-dir", str(results))
        if made["exit_status"] == 0 and (folder / "campaign.json").is_file():
            made["summary"] = campaign_results(name, results)
        made["report"] = str(folder / "report.html")
        return made

    @server.tool()
    def ask(name: str, family: str, lease_s: float = 3600.0) -> dict[str, Any]:
        """The next setting of a family's study to measure (an agent measures it and answers with tell)."""
        return _vidtune("ask", name, "--results-dir", str(results), "--family", family, "--lease-s", str(lease_s))

    @server.tool()
    def tell(name: str, trial: int, result: dict[str, Any], family: str | None = None) -> dict[str, Any]:
        """Record an asked trial's result, as ``vidtune tell --result`` takes it: status ok with total_ms and a
        quality mapping, or status fail with a reason."""
        args = ["tell", name, "--results-dir", str(results), "--trial", str(trial), "--result", json.dumps(result)]
        return _vidtune(*args, *(["--family", family] if family else []))

    @server.tool()
    def evaluate(overrides: list[str] | None = None, knobs: list[str] | None = None) -> dict[str, Any]:
        """Measure a setting (knobs FAMILY.TECHNIQUE.KNOB=VALUE) against the stored baseline of the request the
        overrides give: latency per stage and quality."""
        return _vidtune("evaluate", *(overrides or []), f"results_dir={results}", "--json", "--knobs", *(knobs or []))

    @server.tool()
    def bench(overrides: list[str] | None = None, knobs: list[str] | None = None, config: str | None = None,
              repeats: int = 5, any_request: bool = False) -> dict[str, Any]:
        """Re-measure a tuned config (a path) or knobs against the baseline, interleaved (A B B A), whole
        generations, with the per-stage split."""
        args = ["bench", *(overrides or []), f"results_dir={results}", "--repeats", str(repeats)]
        if config:
            args += ["--config", config]
        if knobs:
            args += ["--knobs", *knobs]
        return _vidtune(*args, *(["--any-request"] if any_request else []))

    @server.tool()
    def signoff(name: str, by: str, verdict: str, note: str = "") -> dict[str, Any]:
        """Record a person's review of the campaign's tuned config: verdict approve or reject."""
        return _vidtune("signoff", name, "--results-dir", str(results), "--by", by, "--verdict", verdict,
                        "--note", note)

    return server


def serve(results_dir: str | Path = "results") -> int:
    """Run the server on stdio until the client closes it. A campaign it started goes on after it (a campaign
    takes longer than an agent's session; another server's ``campaign_status`` sees it from its lock)."""
    build_server(results_dir).run("stdio")
    return 0

