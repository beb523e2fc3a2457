"""Validated settings from the composed Hydra config (``conf/``): the model source, the request, the pipeline and
eval options, the campaign's spec. Every number from a user is finite and bounded; a bad field raises
``CliError`` naming it and its allowed values, before any model is built."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from vidtune.search.quality_model import quality_size

if TYPE_CHECKING:
    from vidtune.techniques.setting import Setting

__all__ = ["CliError", "Settings", "load_config", "quality_size", "knob_values", "MAX_REPEATS", "MAX_SECONDS"]

# Bounds on numbers from users and agents: a NaN gate or an infinite limit was accepted, saved in the campaign's
# spec and failed every later run (a deadline of time.time() + inf, a constraint of NaN)
MAX_REPEATS = 10_000
MAX_SECONDS = 30 * 86400.0
GATE_RANGES = {"ssim": (-1.0, 1.0), "flip": (0.0, 1.0), "flip_worst": (0.0, 1.0), "av_offset_ms": (0.0, 1e6),
               "peak_memory_gb": (0.0, 1e6), "psnr_db": (-1e3, 1e3), "psnr_db_worst": (-1e3, 1e3),
               "temporal_psnr_db": (-1e3, 1e3), "temporal_psnr_db_worst": (-1e3, 1e3), "audio_snr_db": (-1e3, 1e3),
               "audio_spectral_db": (0.0, 1e3), "audio_spectral_snr_db": (-1e3, 1e3)}


def _finite_in(value: Any, low: float, high: float, low_open: bool = False) -> bool:
    """Whether ``value`` is a real number (not a bool), finite, in [low, high] (``low_open``: (low, high])."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return (low < value if low_open else low <= value) and value <= high


class CliError(Exception):
    """A user error: printed as ``vidtune: error: ...`` with exit status 2."""


def load_config(overrides: Sequence[str]) -> Any:
    """Compose ``conf/config.yaml`` onto its schema (``conf/schema.py``) with Hydra overrides (no Hydra run dir, no
    logging takeover). A field the schema lacks or a value of the wrong type raises ``CliError`` naming the field
    and what it takes."""
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from vidtune.conf.schema import composition_error, not_a_field, register, unknown_fields

    register()
    # (tiers=null, the spelling of a null elsewhere, picks the group's `none`: Hydra takes no null for a group)
    overrides = ["tiers=none" if o.replace(" ", "") in ("tiers=null", "tiers=~") else o for o in overrides]
    try:
        with initialize_config_module(config_module="vidtune.conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise CliError(composition_error(exc)) from None
    extra = unknown_fields(cfg)  # (Hydra's `+` adds a key even where the schema has no such field)
    if extra:
        raise CliError(not_a_field(extra[0]))
    return cfg


class Settings:
    """Validated settings from a composed config: model source, request, pipeline and eval options."""

    def __init__(self, cfg: Any) -> None:
        from omegaconf import OmegaConf

        from vidtune.model import GenerationRequest, ModelSource, Stage2Tiling

        self.cfg = cfg
        model = OmegaConf.to_container(cfg.model, resolve=True, throw_on_missing=False)
        for key in ("checkpoint", "upsampler"):  # (model=checkpoint sets no preset and leaves both to the user)
            if model["preset"] is None and model[key] in (None, "???"):
                raise CliError(f"model.{key} is required with model=checkpoint (a .safetensors path)")
        stg = model.get("stg_blocks")
        try:
            self.source = ModelSource(**{**model, "stg_blocks": tuple(stg) if stg is not None else None})
            self.request = GenerationRequest.from_dict(OmegaConf.to_container(cfg.request, resolve=True))
        except ValueError as exc:
            raise CliError(str(exc)) from None
        ev = cfg.eval
        for key in ("repeats", "warmup"):
            value = ev[key]
            low = 1 if key == "repeats" else 0
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_REPEATS:
                raise CliError(f"eval.{key} must be an integer >= {low} (at most {MAX_REPEATS}), got {value!r}")
        self.repeats, self.warmup = int(ev.repeats), int(ev.warmup)
        # campaign trials: a latency ratio paired with interleaved baseline runs (search/evaluator.py)
        self.paired = bool(ev.paired)
        if ev.estimate not in (True, False, "record", "trust"):
            raise CliError(f"eval.estimate must be true, false, trust or record, got {ev.estimate!r}")
        self.estimate = ev.estimate
        most = ev.max_repeats
        most = 2 * self.repeats if most is None else most
        if isinstance(most, bool) or not isinstance(most, int) or not self.repeats <= most <= MAX_REPEATS:
            raise CliError(f"eval.max_repeats must be null (2 x eval.repeats) or an integer >= eval.repeats "
                           f"({self.repeats}) and at most {MAX_REPEATS}, got {ev.max_repeats!r}")
        self.max_repeats = int(most)
        tol = ev.ratio_tolerance
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < tol < 1:
            raise CliError(f"eval.ratio_tolerance must be a number in (0, 1), got {tol!r}")
        self.ratio_tolerance = float(tol)
        self.baseline_mp4 = ev.baseline_mp4
        flips = ev.flip_frames
        if isinstance(flips, bool) or not isinstance(flips, int) or not 0 <= flips <= MAX_REPEATS:
            raise CliError(f"eval.flip_frames must be an integer >= 0 (0: no FLIP metric; at most {MAX_REPEATS}), "
                           f"got {flips!r}")
        self.flip_frames = int(flips)
        budget = ev.memory_budget_gb
        if budget is not None and not _finite_in(budget, 0, 1e6, low_open=True):
            raise CliError(f"eval.memory_budget_gb must be null (the whole GPU) or a number of GiB > 0 (finite, at most "
                           f"1e6), got {budget!r}")
        self.memory_budget_gb = None if budget is None else float(budget)
        tiles = ev.stage2_tiles
        self.stage2_tiling = Stage2Tiling(int(tiles.rows), int(tiles.cols), int(tiles.overlap),
                                          int(tiles.whole_frame_max_tokens))
        if ev.vae_tiling not in ("default", "none", None):
            raise CliError(f"eval.vae_tiling must be one of ['default', 'none'], got {ev.vae_tiling!r}")
        self.vae_tiling = "default" if ev.vae_tiling == "default" else None
        self.device = self._device(cfg.device)
        name = str(cfg.name)
        # a name is one folder inside results_dir (``name=../escape`` wrote outside it)
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name) or ".." in name:
            raise CliError(f"name must be one folder name inside results_dir (letters, digits, '_', '-', '.'; not "
                           f"starting with '.' nor holding '..'), got {name!r}")
        self.results = Path(cfg.results_dir) / name
        self.compile_cache = str(Path(cfg.results_dir) / "compile_cache") if cfg.compile_cache else ""
        self._quality_model(cfg)

    def _quality_model(self, cfg: Any) -> None:
        """``quality_model``: None (this model's own numbers) or (source, request) of the trained model the
        trials' quality is measured on; ``random_weights``: whether this model's own quality numbers mean
        nothing (a preset with random weights)."""
        from vidtune.model import GenerationRequest, ModelSource
        from vidtune.model.presets import PRESETS

        qm = cfg.quality_model
        trained = sorted(n for n, p in PRESETS.items() if p.extra.get("trained"))
        choice = qm.model
        if choice not in ("auto", "self", *trained):
            raise CliError(f"quality_model.model must be one of {['auto', 'self', *trained]}, got {choice!r}")
        preset = self.source.preset
        self.random_weights = preset is not None and not PRESETS[preset].extra.get("trained")
        if choice == "auto":  # (tiny, the test model, stays itself: its numbers are never claims)
            choice = "ltx2-mini" if preset == "ltx2-19b" else "self"
        self.quality_model = None
        if choice != "self" and choice != preset:
            fields = {"prompt": qm.prompt, **quality_size(self.request, qm)}
            try:
                request = GenerationRequest.from_dict({**self.request.to_dict(), **fields, "prompt_embedding": None,
                                                       "negative_prompt": ""})
            except ValueError as exc:
                raise CliError(f"quality_model: {exc}") from None
            self.quality_model = (ModelSource(preset=choice), request)
        concurrent = qm.concurrent
        if concurrent not in ("auto", True, False):
            raise CliError(f"quality_model.concurrent must be one of auto, true, false, got {concurrent!r}")
        self.quality_concurrent = None if concurrent == "auto" else concurrent

    @staticmethod
    def _device(value: str) -> str:
        import torch

        if value == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if value == "cpu" or str(value).startswith("cuda"):
            if str(value).startswith("cuda") and not torch.cuda.is_available():
                raise CliError(f"device={value} but no CUDA GPU is available; use device=cpu or device=auto")
            return str(value)
        raise CliError(f"device must be auto, cpu or cuda[:N], got {value!r}")

    def worker_spec(self) -> dict[str, Any]:
        """Fields of a ``WorkerSpec`` rebuilding this model, request and pipeline in another process."""
        from dataclasses import asdict

        src = asdict(self.source)
        if src.get("stg_blocks") is not None:
            src["stg_blocks"] = list(src["stg_blocks"])
        t = self.stage2_tiling
        return {"source": src, "request": self.request.to_dict(), "device": self.device,
                "stage2_tiling": {"rows": t.rows, "cols": t.cols, "overlap": t.overlap,
                                  "whole_frame_max_tokens": t.whole_frame_max_tokens},
                "vae_tiling": "default" if self.vae_tiling == "default" else "none",
                "repeats": self.repeats, "warmup": self.warmup, "baseline_dir": str(self.results / "baseline"),
                "compile_cache_dir": self.compile_cache, "paired": self.paired, "max_repeats": self.max_repeats,
                "ratio_tolerance": self.ratio_tolerance, "baseline_mp4": self.baseline_mp4,
                "flip_frames": self.flip_frames, "memory_budget_gb": self.memory_budget_gb,
                "estimate": self.estimate, "quality": self.quality_spec()}

    def quality_spec(self) -> dict[str, Any] | None:
        """``WorkerSpec.quality``: the quality model, its request, its baseline folder and the geometries a
        setting is mapped between (None: this model's own quality)."""
        from dataclasses import asdict

        from vidtune.search.quality_model import geometry

        if self.quality_model is None:
            return None
        source, request = self.quality_model
        return {"source": asdict(source), "request": request.to_dict(), "baseline_dir": str(self.results / "quality_baseline"),
                "geometry": {"source": geometry(self.source, self.request), "target": geometry(source, request)},
                "concurrent": self.quality_concurrent}

    def campaign_spec(self):
        """The campaign settings, validated (families, budget, gate) before anything runs."""
        from vidtune.search.campaign import CampaignSpec
        from vidtune.techniques import FAMILIES

        cfg = self.cfg
        families = list(cfg.families)
        bad = [f for f in families if f not in FAMILIES]
        if bad or not families:
            raise CliError(f"families must be a non-empty list from {list(FAMILIES)}, got {families}")
        ranks = cfg.ray.ranks_per_actor
        if isinstance(ranks, bool) or not isinstance(ranks, int) or not 1 <= ranks <= 1024:
            raise CliError(f"ray.ranks_per_actor must be an integer >= 1 (at most 1024), got {ranks!r}")
        if "parallelism" in families and ranks == 1:
            raise CliError("families: parallelism needs ray.ranks_per_actor >= 2 (each actor then owns that many "
                           "ranks: GPUs, or gloo processes on a CPU)")
        n = cfg.budget.trials_per_family
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 100_000:
            raise CliError(f"budget.trials_per_family must be an integer >= 1 (at most 100000), got {n!r}")
        timeout = cfg.budget.trial_timeout_s
        if not _finite_in(timeout, 0, MAX_SECONDS, low_open=True):
            raise CliError(f"budget.trial_timeout_s must be a number of seconds > 0 (finite, at most {MAX_SECONDS:.0f}: "
                           f"30 days), got {timeout!r}")
        minutes = cfg.budget.minutes
        if minutes is not None and not _finite_in(minutes, 0, MAX_SECONDS / 60, low_open=True):
            raise CliError(f"budget.minutes must be null or a number of minutes > 0 (finite, at most "
                           f"{MAX_SECONDS / 60:.0f}), got {minutes!r}")
        run_minutes = cfg.budget.run_minutes
        if run_minutes is not None and not _finite_in(run_minutes, 0, MAX_SECONDS / 60, low_open=True):
            raise CliError(f"budget.run_minutes must be null or a number of minutes > 0 (finite, at most "
                           f"{MAX_SECONDS / 60:.0f}), got {run_minutes!r}")
        actors = cfg.ray.num_actors
        if not isinstance(actors, int) or isinstance(actors, bool) or not 0 <= actors <= 4096:
            raise CliError(f"ray.num_actors must be an integer >= 0 (0: one per GPU; at most 4096), got {actors!r}")
        gate = gate_from(cfg.gate, "gate")
        tiers = cfg.tiers
        for tier in tiers:
            if not isinstance(tier, str) or not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", tier):
                raise CliError(f"tiers: a tier name must be lower-case letters, digits, '-' or '_' (it names "
                               f"tuned-<tier>.yaml), got {tier!r}")
        tiers = tuple((str(t), gate_from(g, f"tiers.{t}", unset_off=True)) for t, g in tiers.items())
        repeats, max_p = cfg.integrator.final_repeats, cfg.integrator.max_p_value
        if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= MAX_REPEATS:
            raise CliError(f"integrator.final_repeats must be an integer >= 1 (at most {MAX_REPEATS}), got {repeats!r}")
        if not _finite_in(max_p, 0, 1, low_open=True):
            raise CliError(f"integrator.max_p_value must be a number in (0, 1], got {max_p!r}")
        from vidtune.integrator.combine import smallest_p_value

        if max_p < 1 and smallest_p_value(repeats) > max_p:
            raise CliError(f"integrator.final_repeats={repeats} cannot show a speed-up at integrator.max_p_value={max_p}: "
                           f"the smallest p-value {repeats} repeats each can give is {smallest_p_value(repeats):.3g}; "
                           f"raise final_repeats (3 reach 0.05) or set max_p_value=1 (median ratio alone)")
        if cfg.storage is not None and not str(cfg.storage).split("://")[0] in ("postgresql", "postgresql+psycopg2",
                                                                                 "sqlite", "mysql"):
            raise CliError(f"storage must be null (a journal file) or an RDB URL (postgresql://...), got {cfg.storage!r}")
        warm = cfg.warm_start or []
        warm = [warm] if isinstance(warm, str) else list(warm)
        for other in warm:
            from vidtune.search.campaign import load_spec

            try:
                earlier = load_spec(Path(cfg.results_dir) / str(other))
            except (ValueError, TypeError) as exc:
                raise CliError(f"warm_start: {other!r} is not an earlier campaign under results_dir={cfg.results_dir} "
                               f"({exc})") from None
            here = {"source": self.source, "device": self.worker_spec()["device"]}
            for key in ("source", "device"):  # the same model and the same device; the request may differ
                if getattr(earlier.worker, key) != here[key]:
                    raise CliError(f"warm_start: campaign {other!r} ran another {('model' if key == 'source' else key)} "
                                   f"({getattr(earlier.worker, key)!r}, this one {here[key]!r}): its trials do not carry over")
            if str(other) == str(cfg.name):
                raise CliError(f"warm_start: {other!r} is this campaign itself; name an earlier one")
        seed_configs = cfg.seed_configs or []
        seed_configs = [seed_configs] if isinstance(seed_configs, str) else list(seed_configs)
        from omegaconf import OmegaConf

        from vidtune.search.verdict import check_verdict_config

        try:  # (the quality model's clip is the campaign's own where it has one)
            clips, candidates = check_verdict_config(
                OmegaConf.to_container(cfg.verdict),
                (self.quality_model[1] if self.quality_model else self.request).to_dict())
        except ValueError as exc:
            raise CliError(str(exc)) from None
        return CampaignSpec(
            name=str(cfg.name), results_dir=str(cfg.results_dir), families=tuple(families), trials_per_family=n,
            gate=gate, tiers=tiers,
            trial_timeout_s=float(cfg.budget.trial_timeout_s), storage=cfg.storage, ray_address=cfg.ray.address,
            time_budget_s=None if minutes is None else 60.0 * float(minutes),
            run_limit_s=None if run_minutes is None else 60.0 * float(run_minutes),
            num_actors=int(cfg.ray.num_actors), ranks_per_actor=int(cfg.ray.ranks_per_actor), seed=int(cfg.seed),
            integrator_max_exhaustive=int(cfg.integrator.max_exhaustive), integrator_trials=int(cfg.integrator.trials),
            integrator_merge=bool(cfg.integrator.merge_within_family),
            final_repeats=int(repeats), integrator_max_p=float(max_p), worker=self.worker_spec(),
            warm_start=tuple(str(w) for w in warm), seeds=tuple(self.seed_settings(seed_configs)),
            catalogue=bool(cfg.catalogue), knowledge=bool(cfg.knowledge), probes=bool(cfg.probes),
            screen=bool(cfg.screen), prune=bool(cfg.prune),
            verdict_clips=clips, verdict_candidates=candidates)

    def seed_settings(self, paths: list[Any]) -> list[dict[str, Any]]:
        """``seed_configs``: each tuned config's knobs mapped to this campaign's model and request by depth,
        frame size and frame count (``transfer_setting``, as for the quality model), with its path and what the
        mapping changed. Refused naming the field: a file that is no tuned config, one a reviewer rejected, one
        tuned for a checkpoint other than this campaign's (its depth is unknown), a mapping that breaks a check."""
        from vidtune.integrator.tuned import TunedConfigError, load_tuned_config
        from vidtune.model import GenerationRequest, ModelSource
        from vidtune.search.quality_model import geometry
        from vidtune.techniques.registry import KnobError
        from vidtune.techniques.transfer import transfer_setting

        out = []
        for path in paths:
            try:
                doc = load_tuned_config(str(path))
            except TunedConfigError as exc:
                raise CliError(f"seed_configs: {exc}") from None
            model = doc.get("model") or {}
            if model == self.source.identity():
                source = self.source
            elif isinstance(model, dict) and set(model) == {"preset"}:
                source = ModelSource(preset=str(model["preset"]))
            else:
                raise CliError(f"seed_configs: {path} was tuned for the model {model}, a checkpoint other than this "
                               f"campaign's: its layer-indexed knobs cannot be mapped; use a config of this model or a preset")
            try:
                request = GenerationRequest.from_dict(doc.get("request") or {})
                knobs, notes = transfer_setting(doc["knobs"], geometry(source, request), geometry(self.source, self.request))
            except (KnobError, ValueError, TypeError) as exc:
                raise CliError(f"seed_configs: {path}: {exc}") from None
            out.append({"origin": str(path), "knobs": knobs, "notes": notes})
        return out

    def check_fits(self) -> None:
        """Refuse a request that cannot fit this machine's memory, by a lower bound from the model's shape
        (``model/memory.py``), before the model is built."""
        from vidtune.model.memory import device_memory_bytes, host_memory_bytes, lower_bound_bytes, transformer_config

        need = lower_bound_bytes(transformer_config(self.source), self.request)
        r = self.request
        size = f"request.height x request.width x request.frames = {r.height} x {r.width} x {r.frames}"
        have = device_memory_bytes(self.device)
        if need["device"] > have:
            raise CliError(f"{size} needs at least {need['device'] / 2**30:.1f} GiB on {self.device} (weights "
                           f"{need['weights'] / 2**30:.1f} GiB + stage-1 activations {need['stage1_activations'] / 2**30:.1f} "
                           f"GiB, a lower bound from the model's shape); {self.device} has {have / 2**30:.1f} GiB")
        if need["host"] > host_memory_bytes():
            raise CliError(f"{size}: its uint8 frames alone are {need['host'] / 2**30:.1f} GiB, over this host's "
                           f"{host_memory_bytes() / 2**30:.1f} GiB of memory")

    def check_results_dir(self) -> None:
        """Create ``results_dir/<name>`` and write a probe there, before any model is built: an unwritable
        folder failed after the whole generation (output lost), a file in its place with NotADirectoryError."""
        places = [("results_dir", self.results)] + ([("out", Path(self.cfg.out))] if self.cfg.out else [])
        for field, folder in places:
            try:
                folder.mkdir(parents=True, exist_ok=True)
                probe = folder / f".write-probe-{os.getpid()}"
                probe.write_bytes(b"")
                probe.unlink()
            except OSError as e:
                raise CliError(f"{field}: cannot write {folder} ({e.strerror or e}); give a writable folder "
                               f"({field}=...)") from None

    def output_bytes(self, command: str) -> int:
        """About what ``command`` writes under results_dir (or ``out``): the raw uint8 frames, an MP4 bounded by
        half of them, and for a stored baseline its quality model's too; 1 MiB of records and configs."""
        def frames(r: Any) -> int:
            return r.frames * r.height * r.width * 3

        need = int(1.5 * frames(self.request)) + (1 << 20)
        if command in ("campaign", "baseline", "evaluate", "bench") and self.quality_model is not None:
            need += int(1.5 * frames(self.quality_model[1]))
        return need

    def check_free_space(self, command: str) -> None:
        """Refuse a run whose outputs will not fit the free space of results_dir (or ``out``) before the first
        generation: on a full disk the generation ran to its end and then failed writing (a partial MP4)."""
        from vidtune._io import OutputError, check_free_space

        field, folder = ("out", Path(self.cfg.out)) if command == "generate" and self.cfg.out else \
            ("results_dir", self.results)
        try:
            check_free_space(folder, self.output_bytes(command), field)
        except OutputError as exc:
            raise CliError(str(exc)) from None

    def pipeline(self):
        """Build the model and the reference pipeline (the expensive part; call after validation)."""
        from vidtune.model import ReferencePipeline, load_models
        from vidtune.techniques.kernel_choice.compile_cache import set_cache_dir

        set_cache_dir(self.compile_cache or None)
        models = load_models(self.source, device=self.device)
        return ReferencePipeline(models, device=self.device, stage2_tiling=self.stage2_tiling, vae_tiling=self.vae_tiling)


def gate_from(fields: Any, where: str, unset_off: bool = False) -> Any:
    """A ``Gate`` from a config mapping (``gate``, or one tier of ``tiers``, where ``unset_off``: a field left
    out is not gated), naming a bad field."""
    from vidtune.search.campaign import Gate

    names = Gate.FLOORS + Gate.CEILINGS
    if not hasattr(fields, "items"):
        raise CliError(f"{where} must map gate fields to thresholds, got {fields!r}")
    values = {k: None for k in names} if unset_off else {}
    for key, value in fields.items():
        if key not in names:
            raise CliError(f"{where}.{key} is not a gate field; the fields are {', '.join(names)}")
        low, high = GATE_RANGES.get(key, (-1e4, 1e4))
        if value is not None and not _finite_in(value, low, high):
            raise CliError(f"{where}.{key} must be a number or null (not gated), finite and in [{low:g}, {high:g}], "
                           f"got {value!r}")
        values[key] = None if value is None else float(value)
    gate = Gate(**values)
    if not gate.constraints({k: 0.0 for k in names}):
        raise CliError(f"{where} gates nothing: set at least one of {', '.join(names)}")
    return gate


def knob_values(items: Sequence[str]) -> Setting:
    """Parse and validate ``--knobs`` (names, values and seam conflicts) before any model is built."""
    from vidtune.techniques import resolve_values
    from vidtune.techniques.setting import check_composition, parse_knob_assignments

    values = resolve_values(parse_knob_assignments(items))
    check_composition(values)
    return values
