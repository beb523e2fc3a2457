"""The Python API: run a tuned config in your own service, and read what a campaign found.

    from vidtune.api import Deployment, campaign_results

    with Deployment.load("results/my-run/tuned-high.yaml") as d:   # the model and request the config was tuned for
        clip = d.generate(prompt="a cat on a sofa", seed=7)         # the same shape: the tuned graphs are reused
        d.save(clip, "out/")                                        # out/video.mp4 (with audio), out/output.safetensors
    print(campaign_results("my-run")["tiers"]["high"]["speedup"])

    with apply_to_official(official_pipeline, "results/my-run/tuned-high.yaml"):   # ltx_pipelines' own object:
        video, audio = official_pipeline(prompt=..., ...)                          # its module-level knobs only

A ``Deployment`` applies the config's knobs once, on vidtune's pipeline (the reference two-stage pipeline of
ltx-core; caching and tiling need its seams), and keeps them applied across generations, so a compiled
setting compiles once. The config is validated as ``vidtune generate --config`` validates it: its model, its
request (another shape with ``any_request=True``, noted), its sign-off (a rejected one with
``allow_rejected=True``); the notes are in ``Deployment.notes``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Sequence

from vidtune.official import apply_to_official  # noqa: E402  (a tuned config on an official ltx_pipelines pipeline)

__all__ = ["Deployment", "Generation", "campaign_results", "apply_to_official"]


@dataclasses.dataclass
class Generation:
    """One generated clip: frames uint8 [F, H, W, 3], audio float32 [channels, samples], per-stage latency."""

    frames: Any
    audio: Any
    sample_rate: int
    fps: float
    latency_ms: dict[str, float]
    request: dict[str, Any]


class Deployment:
    """A tuned config applied to a loaded pipeline (``load``); ``generate`` as often as needed, ``close`` (or the
    ``with`` block's end) takes the knobs off again."""

    def __init__(self, settings: Any, knobs: Any, notes: list[str], config: str | None) -> None:
        from vidtune.techniques import compose

        self.settings, self.knobs, self.notes, self.config = settings, knobs, notes, config
        self.pipeline = settings.pipeline()
        self._patch = compose(self.pipeline, knobs)

    @classmethod
    def load(cls, config: str | Path | None = None, overrides: Sequence[str] = (), *, any_request: bool = False,
             allow_rejected: bool = False) -> "Deployment":
        """The config's model and request (``overrides``, Hydra's, change them: ``device=cuda:1``, a checkpoint,
        ``request.seed=3``); no config: vidtune's pipeline with every knob off. A bad config or override raises
        ``ValueError`` naming the field, before the model is built."""
        from vidtune.integrator.tuned import TunedConfigError, load_tuned_config
        from vidtune.settings import CliError, Settings, load_config

        overrides = list(overrides)
        stored: dict[str, Any] = {}
        if config is not None:
            from vidtune._io import load_user_yaml

            try:  # (within the limits on user YAML; the validation proper is load_tuned_config's, below)
                stored = load_user_yaml(Path(config), "config") or {}
            except (OSError, ValueError) as exc:
                raise ValueError(f"config: cannot read {config}: {exc}") from None
            preset = (stored.get("model") or {}).get("preset") if isinstance(stored, dict) else None
            if preset and not any(o.startswith("model=") for o in overrides):
                overrides.insert(0, f"model={preset}")
        try:
            cfg = load_config(overrides)
            given = {o.split("=", 1)[0].removeprefix("request.") for o in overrides if o.startswith("request.")}
            for key, value in ((stored.get("request") or {}) if isinstance(stored, dict) else {}).items():
                if key not in given and key in cfg.request:
                    cfg.request[key] = value
            settings = Settings(cfg)
        except CliError as exc:
            raise ValueError(str(exc)) from None
        if config is None:
            return cls(settings, {}, [], None)
        try:
            doc = load_tuned_config(config, settings.source, None, settings.request, any_request=any_request,
                                    allow_rejected=allow_rejected)
        except TunedConfigError as exc:
            raise ValueError(str(exc)) from None
        return cls(settings, doc["knobs"], doc["notes"], str(config))

    @property
    def request(self) -> Any:
        """The request a plain ``generate()`` runs (``vidtune.model.GenerationRequest``)."""
        return self.settings.request

    def generate(self, **changes: Any) -> Generation:
        """One clip of the deployment's request with ``changes`` (request fields: prompt, seed, ...)."""
        from vidtune.search.stages import run_from

        fields = {f.name for f in dataclasses.fields(self.request)}
        unknown = sorted(set(changes) - fields)
        if unknown:
            raise ValueError(f"generate: {unknown} are not request fields; allowed: {sorted(fields)}")
        request = dataclasses.replace(self.request, **changes) if changes else self.request
        out, times = run_from(self.pipeline, request, "stage1", None)
        return Generation(frames=out.frames, audio=out.audio, sample_rate=out.sample_rate, fps=request.fps,
                          latency_ms={k: round(v, 3) for k, v in times.items()}, request=request.to_dict())

    def save(self, clip: Generation, folder: str | Path) -> dict[str, str]:
        """``folder``/video.mp4 (H.264 with the audio) and ``folder``/output.safetensors (the raw frames and audio)."""
        from vidtune.model.media import write_mp4, write_raw

        folder = Path(folder)
        mp4 = write_mp4(folder / "video.mp4", clip.frames, clip.fps, clip.audio, clip.sample_rate)
        raw = write_raw(folder / "output.safetensors", clip.frames, clip.audio, clip.sample_rate, clip.fps)
        return {"video": str(mp4), "raw": str(raw)}

    def close(self) -> None:
        """Take the knobs off (the pipeline is as loaded again)."""
        if not self._patch.undone:
            self._patch.undo()

    def __enter__(self) -> "Deployment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def campaign_results(name: str, results_dir: str | Path = "results") -> dict[str, Any]:
    """What a finished campaign found: per tier (or for its one gate) the knobs, the speed-up and its p-value,
    the quality, the model the quality comes from, and the tuned config's path; plus its baseline and
    provenance. ``ValueError`` where the campaign has not finished (no campaign.json)."""
    folder = Path(results_dir) / name
    path = folder / "campaign.json"
    if not path.is_file():
        state = "is running or was stopped" if (folder / "trials.jsonl").is_file() else "does not exist"
        raise ValueError(f"campaign {name!r}: no {path}; the campaign {state}")
    doc = json.loads(path.read_text())

    def one(final: dict[str, Any] | None, chosen: Any, config: Any) -> dict[str, Any]:
        final = final or {}
        return {"knobs": chosen, "speedup": final.get("speedup"), "p_value": final.get("p_value"),
                "psnr_db": (final.get("quality") or {}).get("psnr_db"),
                "quality_from": (final.get("quality_from") or {}).get("model"), "tuned_config": config}

    tiers = doc.get("tiers") or {}
    out: dict[str, Any] = {"campaign": doc.get("campaign"), "baseline_ms": (doc.get("baseline") or {}).get("total_ms"),
                           "provenance": doc.get("provenance"), "read": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if tiers:
        out["tiers"] = {t: one(v.get("final"), v.get("chosen"), str(folder / f"tuned-{t}.yaml")) for t, v in tiers.items()}
    else:
        out["chosen"] = one(doc.get("final"), doc.get("chosen"), doc.get("tuned_config"))
    return out
