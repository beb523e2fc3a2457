"""Tuned deployment configs: export (YAML with provenance and a sign-off field), load and validate.

A tuned config is what ``vidtune generate --config`` applies and ``vidtune bench --config`` re-measures.
It is validated against the registry (unknown technique or bad value: error), against the model it
was made for (another model: error) and the device it was measured on (another GPU: a warning,
since the numbers may not carry over).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from vidtune._io import atomic_write_text, load_user_yaml, strict_json
from vidtune.techniques.registry import KnobError
from vidtune.techniques.setting import check_composition, resolve_values

if TYPE_CHECKING:
    from vidtune.techniques.setting import SettingLike

__all__ = ["TunedConfigError", "export_tuned_config", "load_tuned_config", "sign_off", "FORMAT_VERSION"]

FORMAT_VERSION = 1


class TunedConfigError(ValueError):
    """A tuned config does not apply here; the message names the field."""


def export_tuned_config(spec: Any, knobs: SettingLike, final: dict[str, Any],
                        baseline: dict[str, Any], rejected: dict[str, Any] | None = None,
                        tier: tuple[str, Any] | None = None, verdict: dict[str, Any] | None = None) -> Path:
    """Write ``results/<campaign>/tuned.yaml``, or ``tuned-<tier>.yaml`` for a quality tier (``tier``: its
    name and gate) (``rejected``: a combination that lost to the baseline when re-measured, recorded beside
    the baseline config it gave way to; ``verdict``: the tier's verdict over several clips, vidtune/verdicts.py)."""
    worker = spec.worker
    source = worker.source
    doc = {
        "vidtune_tuned_config": FORMAT_VERSION,
        "campaign": spec.name,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "knobs": resolve_values(knobs),
        "model": source.identity(),
        "request": worker.request.to_dict(),
        "environment": baseline.get("environment"),
        "measured": {
            "method": f"baseline and tuned alternated in one worker ({final.get('order') or 'A B, B A, ...'}), full "
                      "pipeline each run; "
                      "speedup = median(baseline total) / median(tuned total)",
            "speedup": final["speedup"],
            "p_value": final.get("p_value"),  # one-sided Mann-Whitney U, tuned faster than baseline
            "baseline_total_ms": final["baseline_total_ms"],
            "tuned_total_ms": final["tuned_total_ms"],
            "tuned_latency_ms": {k: v["median_ms"] for k, v in final["tuned_latency"].items()},
            "baseline_latency_ms": {k: v["median_ms"] for k, v in final["baseline_latency"].items()},
            "psnr_db": final["quality"]["psnr_db"],
            "psnr_db_worst": final["quality"]["psnr_db_worst"],
            "ssim": final["quality"]["ssim"],
            "audio_snr_db": final["quality"]["audio_snr_db"],
            **{k: final["quality"].get(k) for k in ("ssim_worst", "temporal_psnr_db", "temporal_psnr_db_worst", "flip",
                                                     "flip_worst", "audio_spectral_db", "audio_spectral_snr_db",
                                                     "av_offset_ms")},
            "noise_floor": ((baseline.get("quality_model") or baseline).get("noise_floor") or {}).get("quality"),
        },
        "quality_from": quality_provenance(source, final, baseline),
        **({"tier": tier[0]} if tier else {}),
        "gate": asdict(tier[1] if tier else spec.gate),
        **({"rejected_candidate": rejected} if rejected else {}),
        **({"verdict": {**verdict, "note": "the gate holds on the worst of every metric over these clips (the "
                        "campaign's and the changes' seeds and prompts), on the quality model"}} if verdict else {}),
        "signoff": {"by": None, "verdict": None, "note": None, "at": None},
    }
    path = spec.directory / (f"tuned-{tier[0]}.yaml" if tier else "tuned.yaml")
    # plain types only (torch.__version__ is a str subclass that YAML's safe dumper refuses)
    atomic_write_text(path, yaml.safe_dump(json.loads(strict_json(doc)), sort_keys=False))
    return path


def quality_provenance(source: Any, final: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """Which model the quality numbers of a campaign come from: the quality model (its request, the
    exported setting as mapped to it, the latency model's own numbers beside), or the model itself, with
    ``random_weights`` saying when they mean nothing."""
    from vidtune.model.presets import PRESETS

    qm = baseline.get("quality_model")
    if qm:
        where = final.get("quality_from") or {}
        return {"model": qm["model"], "request": {k: qm["request"][k] for k in ("height", "width", "frames", "seed")},
                "knobs": where.get("knobs", {}), "mapping": where.get("mapping", []), "geometry": qm.get("geometry"),
                "latency_model_quality": final.get("latency_model_quality"),
                "note": "PSNR/SSIM/audio SNR and the gate are the quality model's, at the setting mapped to it; "
                        "latency is the tuned model's own"}
    random = source.preset is not None and not PRESETS[source.preset].extra.get("trained")
    return {"model": source.identity(), "random_weights": random,
            **({"note": "random weights: these quality numbers are not a quality figure"} if random else {})}


def load_tuned_config(path: str | Path, source: Any | None = None, device_name: str | None = None,
                      request: Any | None = None, any_request: bool = False, allow_rejected: bool = False) -> dict[str, Any]:
    """Read and validate a tuned config; returns it with ``knobs`` resolved and ``notes``: what the caller
    must print and record (an unsigned config, a request it was not tuned for).

    Raises ``TunedConfigError`` (bad file, unknown technique, bad value, other model, a request other than
    the stored one unless ``any_request``, a sign-off that rejected it unless ``allow_rejected``); warns
    when it was measured on another device.
    """
    p = Path(path)
    if not p.is_file():
        raise TunedConfigError(f"--config must be an existing tuned config YAML file, got {str(path)!r}")
    doc = _read(p, "--config")
    knobs = doc.get("knobs") or {}
    if not isinstance(knobs, dict) or not all(isinstance(v, dict) for v in knobs.values()):
        raise TunedConfigError(f"{path}: field knobs must map technique names to knob values")
    try:
        doc["knobs"] = resolve_values(knobs)
        check_composition(doc["knobs"])
    except KnobError as exc:
        raise TunedConfigError(f"{path}: knobs: {exc}") from None
    if source is not None and doc.get("model") != source.identity():
        raise TunedConfigError(f"{path}: field model {doc.get('model')} was tuned for another model than "
                               f"{source.identity()}; re-run the campaign for this model")
    notes = []
    signoff = doc.get("signoff") or {}
    if signoff.get("verdict") == "reject":
        if not allow_rejected:
            raise TunedConfigError(f"{path}: signed off verdict: reject by {signoff.get('by')} ({signoff.get('note') or 'no note'}); "
                                   f"pass --allow-rejected to apply it anyway")
        notes.append(f"{path}: applied although {signoff.get('by')} rejected it (--allow-rejected)")
    elif signoff.get("verdict") != "approve":
        notes.append(f"{path}: not signed off yet (vidtune signoff); its measurements are unreviewed")
    stored_request = doc.get("request") or {}
    if not isinstance(stored_request, dict) or not all(
            isinstance(k, str) and (v is None or isinstance(v, (str, int, float, bool)) or
                                    (isinstance(v, list) and len(v) <= 1000 and all(isinstance(x, (int, float)) for x in v)))
            for k, v in stored_request.items()):
        raise TunedConfigError(f"{path}: field request must map request fields to numbers or strings (as vidtune "
                               f"campaign writes it)")
    if request is not None:
        stored, asked = stored_request, request.to_dict()
        differ = {k: (stored.get(k), asked.get(k)) for k in sorted(set(stored) | set(asked)) if stored.get(k) != asked.get(k)}
        if differ:
            said = ", ".join(f"{k} tuned {a!r}, asked {b!r}" for k, (a, b) in differ.items())
            if not any_request:
                raise TunedConfigError(f"{path}: field request: this config was tuned and measured for another request "
                                       f"({said}); pass --any-request to apply it to this one (its speed-up and "
                                       f"quality were not measured there)")
            notes.append(f"{path}: applied to a request it was not tuned for (--any-request): {said}")
    doc["notes"] = notes
    measured_on = (doc.get("environment") or {}).get("device")
    if device_name is not None and measured_on is not None and measured_on != device_name:
        warnings.warn(f"{path}: measured on {measured_on}, running on {device_name}: its speed-up may not carry over",
                      stacklevel=2)
    return doc


def _read(p: Path, what: str) -> dict[str, Any]:
    """A tuned config file as a dict, within the limits on user YAML; ``TunedConfigError`` naming the file."""
    try:
        doc = load_user_yaml(p, what)
    except (ValueError, OSError) as exc:
        raise TunedConfigError(str(exc)) from None
    if not isinstance(doc, dict) or doc.get("vidtune_tuned_config") != FORMAT_VERSION:
        raise TunedConfigError(f"{p}: not a vidtune tuned config (field vidtune_tuned_config must be {FORMAT_VERSION}; "
                               f"an empty file was left by a write an older vidtune did not make atomic: re-run "
                               f"`vidtune campaign` with the same name to export it again)")
    return doc


def sign_off(path: str | Path, by: str, verdict: str, note: str = "") -> dict[str, Any]:
    """Record a person's review in the tuned config (``signoff``: by, verdict, note, at)."""
    if verdict not in ("approve", "reject"):
        raise TunedConfigError(f"--verdict must be one of ['approve', 'reject'], got {verdict!r}")
    if not by.strip():
        raise TunedConfigError("--by must name the reviewer")
    p = Path(path)
    if not p.is_file():
        raise TunedConfigError(f"{p}: no tuned config there (the campaign has not exported one yet)")
    doc = _read(p, "tuned config")
    doc["signoff"] = {"by": by, "verdict": verdict, "note": note,
                      "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    atomic_write_text(p, yaml.safe_dump(doc, sort_keys=False))
    return doc["signoff"]
