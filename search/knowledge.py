"""The local knowledge base: what earlier campaigns under the same ``results_dir`` measured, reused as priors.

Any earlier campaign of the same model on the same GPU class counts, whatever its request: its trials that were
faster than their baseline beyond the noise (and passed its gate) are queued early in a new campaign's studies,
mapped to the new request by depth, frame size and frame count (``transfer_setting``); a single technique's
setting that measured slower than the baseline beyond the noise is not drawn again (pruned as ``known-loser``,
the earlier trial named); nor is a setting that ran out of memory in an earlier campaign whose request was no
larger (pixels of the same mode) under a memory cap no smaller (``oom_settings``). ``warm_start`` and
``seed_configs`` stay for explicit use.

Everything is read from the campaigns' own files (``campaign_spec.json``, ``baseline/meta.json``,
``trials.jsonl``); a folder that cannot be read is skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vidtune.search.catalogue import GpuClass, gpu_class
from vidtune.search.records import Reason, RecordLog, Status

if TYPE_CHECKING:
    from vidtune.techniques.setting import Setting

__all__ = ["Finding", "earlier_findings", "earlier_compiles", "winners", "losers", "losing_knobs", "oom_settings"]


@dataclass(frozen=True)
class Finding:
    """One trial of an earlier campaign, its knobs mapped to the new campaign's model and request."""

    origin: str  # "<campaign>:<family>#<trial>"
    family: str
    knobs: Setting = field(hash=False)
    ratio: float = 1.0  # the setting's latency over the baseline's (paired; < 1 is faster)
    won: bool = False  # faster beyond the noise (its ratio's interval below 1) and inside its campaign's gate
    lost: bool = False  # slower beyond the noise (its ratio's interval above 1)
    # ran out of memory in a record that says what its process held before the run (``memory``: written by workers
    # that free what a failure leaves or are replaced, so the process was not left full by an earlier failure), at
    # ``pixels`` (height x width x frames) of ``mode`` under a cap of ``cap_gib`` GiB (None: a CPU)
    oom: bool = False
    pixels: int = 0
    mode: str = ""
    cap_gib: float | None = None


def _json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _earlier_campaigns(results_dir: str | Path, exclude: str, source: dict[str, Any],
                       cls: GpuClass) -> list[tuple[Path, dict[str, Any]]]:
    """(folder, spec) of every campaign under ``results_dir`` other than ``exclude`` that ran the model ``source``
    (a ``ModelSource`` as a dict) on a GPU of class ``cls``."""
    root, out = Path(results_dir), []
    if not root.is_dir():
        return out
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name != exclude):
        spec = _json(folder / "campaign_spec.json")
        meta = _json(folder / "baseline" / "meta.json")
        if not spec or not meta or (spec.get("worker") or {}).get("source") != source:
            continue
        if gpu_class((meta.get("environment") or {}).get("device") or "cpu") is cls:
            out.append((folder, spec))
    return out


def earlier_compiles(results_dir: str | Path, exclude: str, source: dict[str, Any], cls: GpuClass) -> list[dict[str, Any]]:
    """The measured evaluations of earlier campaigns (as ``earlier_findings`` picks them, any request) that compiled
    graphs, with each stage's first run and timed median: what a new campaign's budget prices its first compile
    at before it has compiled anything itself (vidtune/budget.py). On a new request the graphs are compiled anew
    (their shapes differ), and a compile's time follows the graphs more than their sizes: at 1536x1024x121 stage
    2's first run took 10-13 s beyond warm and the VAE decoder's 130-226 s (H100, H200), at 3840x2176x121 the
    decoder's 190 s uncached (H200)."""
    from vidtune.techniques.setting import compile_signature

    out = []
    for folder, _ in _earlier_campaigns(results_dir, exclude, source, cls):
        for rec in RecordLog(folder / "trials.jsonl").read():
            knobs, timing = rec.get("knobs"), rec.get("timing") or {}
            if (rec.get("status") == Status.OK and isinstance(knobs, dict) and knobs and timing.get("first_run_ms")
                    and rec.get("latency") and compile_signature(knobs) is not None):
                out.append(rec)
    return out


def earlier_findings(results_dir: str | Path, exclude: str, source: dict[str, Any], cls: GpuClass,
                     target_geometry: dict[str, float]) -> list[Finding]:
    """The measured trials of every campaign under ``results_dir`` other than ``exclude`` that ran the model
    ``source`` (a ``ModelSource`` as a dict) on a GPU of class ``cls``, mapped to ``target_geometry``."""
    from vidtune.model import GenerationRequest, ModelSource
    from vidtune.search.quality_model import geometry
    from vidtune.techniques.registry import KnobError
    from vidtune.techniques.transfer import transfer_setting

    out: list[Finding] = []
    for folder, spec in _earlier_campaigns(results_dir, exclude, source, cls):
        try:
            req = GenerationRequest.from_dict(spec["worker"]["request"])
            earlier = geometry(ModelSource(**{k: (tuple(v) if k == "stg_blocks" and v is not None else v)
                                              for k, v in source.items()}), req)
        except (KeyError, TypeError, ValueError):
            continue
        for rec in RecordLog(folder / "trials.jsonl").read():
            finding = _finding(folder.name, rec, earlier, target_geometry, transfer_setting, KnobError, req)
            if finding is not None:
                out.append(finding)
    return out


def _finding(campaign: str, rec: dict[str, Any], source: dict[str, float], target: dict[str, float],
             transfer: Any, knob_error: type, request: Any = None) -> Finding | None:
    family, knobs, paired = rec.get("family"), rec.get("knobs"), rec.get("paired")
    if family in (None, "integrator") or not isinstance(knobs, dict) or not knobs:
        return None
    if (rec.get("status") == Status.FAIL and rec.get("reason") == Reason.OOM and isinstance(rec.get("memory"), dict)
            and request is not None):
        # (only records that say what their process held before the run: an OOM in a process that an earlier
        # failure had left full says nothing about the setting, as the 48 of campaign h100-19b-1536u did not)
        try:
            mapped, _ = transfer(knobs, source, target)
        except (knob_error, KeyError, ValueError, TypeError):
            return None
        cap = rec["memory"].get("cap_gib")
        return Finding(f"{campaign}:{family}#{rec.get('trial')}", str(family), mapped, oom=True,
                       pixels=request.pixels, mode=request.mode, cap_gib=None if cap is None else float(cap))
    if rec.get("status") != Status.OK:
        return None
    if not isinstance(paired, dict) or not isinstance(paired.get("interval"), list) or len(paired["interval"]) != 2:
        return None  # (timed alone, not against interleaved baseline runs: no verdict to carry over)
    if paired.get("repeats") == 0:
        return None  # (stopped by the latency model's estimate: a prediction, not a measurement to carry over)
    try:
        mapped, _ = transfer(knobs, source, target)
    except (knob_error, KeyError, ValueError, TypeError):
        return None
    low, high = paired["interval"]
    feasible = all(c <= 0 for c in rec.get("constraints") or [0.0])
    return Finding(f"{campaign}:{family}#{rec.get('trial')}", str(family), mapped, float(paired.get("ratio", 1.0)),
                   won=high < 1.0 and feasible, lost=low > 1.0)


def winners(findings: list[Finding], family: str, best: int = 2) -> list[Finding]:
    """The ``best`` fastest winning findings of ``family``, one per distinct setting."""
    seen, out = set(), []
    for f in sorted((f for f in findings if f.family == family and f.won), key=lambda f: f.ratio):
        key = json.dumps(f.knobs, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out[:best]


def losers(findings: list[Finding]) -> dict[str, list[tuple[dict[str, Any], str]]]:
    """Per technique, the settings of it that lost when measured alone: (its values, the trial's origin)."""
    out: dict[str, list[tuple[dict[str, Any], str]]] = {}
    for f in findings:
        if f.lost and len(f.knobs) == 1:
            (name, values), = f.knobs.items()
            out.setdefault(name, []).append((values, f.origin))
    return out


def losing_knobs(findings: list[Finding]) -> dict[tuple[str, str], list[tuple[Any, str]]]:
    """Per (technique, knob) of a technique with independent knobs (``Technique.independent_knobs``: the SDPA
    backend per attention kind), the values that lost when measured alone with every other knob of it off: (the
    value, the trial's origin). A setting holding such a value loses that part whatever its other knobs say."""
    from vidtune.techniques.registry import KnobError, get

    out: dict[tuple[str, str], list[tuple[Any, str]]] = {}
    for f in findings:
        if not (f.lost and len(f.knobs) == 1):
            continue
        (name, values), = f.knobs.items()
        try:
            technique = get(name)
            full = technique.validate(values)
        except KnobError:  # (a technique or knob this version no longer has)
            continue
        if not technique.independent_knobs:
            continue
        on = [k for k in technique.knobs if full.get(k.name) != k.off]
        if len(on) == 1:
            out.setdefault((name, on[0].name), []).append((full[on[0].name], f.origin))
    return out


def oom_settings(findings: list[Finding], pixels: int, mode: str, cap_gib: float | None) -> list[Finding]:
    """The findings that ran out of memory where this campaign would too: a request of ``mode`` no larger than
    this one's ``pixels``, under a cap no smaller than this one's ``cap_gib`` (None, a CPU: only another CPU's).

    A setting is matched whole (``Priors.known_loser``), never by a part of it: a technique added to it may
    lower its peak (FP8 weights, tiles), so a superset of what ran out of memory is still worth measuring."""
    def fits_under(earlier: float | None) -> bool:
        if earlier is None or cap_gib is None:
            return earlier is None and cap_gib is None
        return cap_gib <= earlier + 0.5  # (the allocator's rounding)

    return [f for f in findings if f.oom and f.mode == mode and f.pixels <= pixels and fits_under(f.cap_gib)]
