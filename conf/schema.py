"""The configuration's schema: every field of ``vidtune``'s Hydra config, its type, its default and what it means.

Hydra composes ``conf/config.yaml`` (its defaults list), the ``model`` and ``tiers`` groups and the command line's
overrides onto ``Config`` (registered as ``vidtune_schema``), so a field that does not exist or a value of the
wrong type is refused at composition, naming the field. A default that a lower layer also needs (a request's
fields, the gate's floors, the worker's and the campaign's fields) is read from that layer's dataclass, so each is
written once. Ranges and cross-field rules (finite numbers, ``eval.max_repeats >= eval.repeats``, a p-value
that ``integrator.final_repeats`` can reach, ...) are checked after composition by ``vidtune.settings.Settings``.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from vidtune.model.loading import ModelSource
from vidtune.model.request import GenerationRequest
from vidtune.model.tiles import Stage2Tiling
from vidtune.search.spec import CampaignSpec, Gate
from vidtune.search.worker import WorkerSpec

__all__ = ["Config", "EvalConfig", "RequestConfig", "ModelConfig", "GateConfig", "register",
           "field_kind", "unknown_fields", "not_a_field", "composition_error"]


def _default(cls: type, name: str) -> Any:
    """The default of ``cls``'s field ``name`` (a list for a tuple, so that the config can hold it)."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    value = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
    return list(value) if isinstance(value, tuple) else value


def _like(cls: type, name: str) -> Any:
    """A dataclass field whose default is ``cls``'s field ``name``'s (a factory where the value is mutable)."""
    value = _default(cls, name)
    return field(default_factory=lambda: list(value)) if isinstance(value, list) else field(default=value)


# -- the request and the model: the fields of GenerationRequest and ModelSource (model/request.py documents and
# validates each field of a request; model/loading.py each of a model source)

@dataclass
class RequestConfig:
    prompt: str = _like(GenerationRequest, "prompt")  # a scene ltx2-mini was trained on (model/mini/data.py)
    prompt_embedding: Optional[str] = _like(GenerationRequest, "prompt_embedding")
    negative_prompt: str = _like(GenerationRequest, "negative_prompt")
    seed: int = _like(GenerationRequest, "seed")
    height: int = _like(GenerationRequest, "height")  # multiple of 64
    width: int = _like(GenerationRequest, "width")  # multiple of 64
    frames: int = _like(GenerationRequest, "frames")  # 8k+1
    fps: float = _like(GenerationRequest, "fps")
    mode: str = _like(GenerationRequest, "mode")  # distilled | multistep
    steps: int = _like(GenerationRequest, "steps")  # multistep stage-1 steps
    stage1_sigmas: Optional[List[float]] = _like(GenerationRequest, "stage1_sigmas")
    cfg_scale: float = _like(GenerationRequest, "cfg_scale")
    audio_cfg_scale: float = _like(GenerationRequest, "audio_cfg_scale")
    stg_scale: float = _like(GenerationRequest, "stg_scale")
    modality_scale: float = _like(GenerationRequest, "modality_scale")
    rescale_scale: float = _like(GenerationRequest, "rescale_scale")


@dataclass
class ModelConfig:
    """The ``model`` group's options (conf/model/*.yaml) each set ``preset`` or a checkpoint's paths."""

    preset: Optional[str] = None  # tiny | ltx2-mini | ltx2-19b (model/presets.py); null with a checkpoint
    checkpoint: Optional[str] = _like(ModelSource, "checkpoint")  # a .safetensors of the LTX-2 transformer and VAEs
    upsampler: Optional[str] = _like(ModelSource, "upsampler")  # the spatial upsampler's .safetensors
    gemma_root: Optional[str] = _like(ModelSource, "gemma_root")  # the text encoder's folder (null: no prompt encoder)
    stg_blocks: Optional[List[int]] = _like(ModelSource, "stg_blocks")  # blocks STG skips (null: the official [29])
    distilled_lora: Optional[str] = _like(ModelSource, "distilled_lora")  # LoRA fused into stage 2's transformer
    distilled_lora_strength: float = _like(ModelSource, "distilled_lora_strength")


# -- how a setting is measured

@dataclass
class Stage2TilesConfig:
    """The reference stage-2 tiling (0 / -1: automatic; model/tiles.py)."""

    rows: int = _like(Stage2Tiling, "rows")
    cols: int = _like(Stage2Tiling, "cols")
    overlap: int = _like(Stage2Tiling, "overlap")
    whole_frame_max_tokens: int = _like(Stage2Tiling, "whole_frame_max_tokens")


@dataclass
class EvalConfig:
    repeats: int = _like(WorkerSpec, "repeats")  # timed runs per setting (median and spread reported)
    warmup: int = _like(WorkerSpec, "warmup")  # untimed runs first (compile, autotune, allocator)
    # Campaign trials and combinations: a latency ratio against baseline runs interleaved with the setting's in the
    # same worker (A B, B A, ...), so that a drifting machine moves both. At least `repeats` pairs; more, up to
    # max_repeats (null: 2 x repeats), while the ratio's 95% interval straddles 1 and is wider than
    # +-ratio_tolerance. false: the setting's runs alone (twice as cheap, not above the noise).
    paired: bool = _like(WorkerSpec, "paired")
    max_repeats: Optional[int] = None
    ratio_tolerance: float = _like(WorkerSpec, "ratio_tolerance")
    # A family trial that touches the denoising stages is first estimated by the latency model
    # (search/latency_model.py: one replayed transformer pass per stage instead of whole generations) and stops
    # there when even 6% better it could not join its family's survivors (`prune`); otherwise it is measured in
    # full, the estimate recorded beside. trust: a trial it does not stop is recorded at its estimate, without
    # pairs (a survivor is measured in pairs as the integrator's one-family combination; the export always is).
    # record: the estimate is recorded beside every such trial's pairs and stops nothing (validation data). Off by
    # default until the model is validated against whole generations on a GPU (docs/campaigns.md).
    estimate: Any = _like(WorkerSpec, "estimate")  # false | true | trust | record
    # The baseline's MP4 (for a person to watch; the metrics use the raw frames): written in the background when
    # true, left out when false; null: written when its uint8 frames are <= 1 GiB (1536x1024x121: 0.53 GiB), left
    # out above (3840x2176x121: a 602 MB encode of minutes of CPU beside the trials). `vidtune baseline` writes it
    # unless false.
    baseline_mp4: Optional[bool] = _like(WorkerSpec, "baseline_mp4")
    # FLIP (search/metrics.py) is computed on this many frames: the worst by PSNR and evenly spaced ones (0: left
    # out); one 512x768 frame took 0.6 s on a 2-core CPU under load, so only a few frames are measured
    flip_frames: int = _like(WorkerSpec, "flip_frames")
    # GiB a trial's process may allocate on its GPU (torch.cuda.set_per_process_memory_fraction): a setting above
    # it fails as OOM, recorded with its reason; null: the whole card. Pair it with gate.peak_memory_gb.
    memory_budget_gb: Optional[float] = _like(WorkerSpec, "memory_budget_gb")
    stage2_tiles: Stage2TilesConfig = field(default_factory=Stage2TilesConfig)
    vae_tiling: Optional[str] = _like(WorkerSpec, "vae_tiling")  # default (the official TilingConfig.default()) | none


# -- quality floors: the fields of search/spec.py's Gate (search/metrics.py says what each measures,
# docs/quality.md how they were calibrated). The gate's floors and ceilings against the baseline: psnr_db, ssim,
# audio_snr_db; the worst frame's PSNR, the PSNR of the frame-to-frame change (flicker; mean and worst pair), FLIP
# (mean and worst of the sampled frames, 0 same .. 1), the audio's log-spectral difference in dB and the SNR of its
# STFT magnitudes, the size of the audio-video offset against the baseline's (ms), the peak memory (GiB: CUDA
# allocated; on a CPU the resident set). null: not gated.

GateConfig = dataclasses.make_dataclass(
    "GateConfig", [(f.name, Optional[float], field(default=f.default)) for f in dataclasses.fields(Gate)])
GateConfig.__doc__ = "The campaign's gate: Gate's fields and defaults (a field set to null is not gated)."


# -- the campaign

@dataclass
class BudgetConfig:
    trials_per_family: int = 6
    # a trial running longer is recorded FAIL (timeout) and its actor replaced
    trial_timeout_s: float = _like(CampaignSpec, "trial_timeout_s")
    # a ceiling on the campaign's measuring time (its trials, combinations and final bench, summed over resumes):
    # the families stop sampling when the rest is needed for the integrator and the final bench, the integrator
    # when the final bench needs it; null: none
    minutes: Optional[float] = None
    # a ceiling on this one run's wall time (a batch job's or a rented machine's time limit): nothing is started
    # that would end past it (a trial at the upper quartile of those recorded, the final bench at its estimate);
    # the run then exits 75, and the same command goes on from there. Where a limit kills the process, this loses
    # no trial in flight. null: none
    run_minutes: Optional[float] = None


@dataclass
class RayConfig:
    address: Optional[str] = _like(CampaignSpec, "ray_address")  # null: a local Ray on 127.0.0.1; or a cluster's
    num_actors: int = _like(CampaignSpec, "num_actors")  # 0: one per GPU (per ranks_per_actor GPUs), or one on the CPU
    # >1: each actor owns that many ranks (GPUs, or gloo processes on a CPU) so the parallelism family can be
    # searched (degrees above it are never sampled)
    ranks_per_actor: int = _like(CampaignSpec, "ranks_per_actor")


@dataclass
class IntegratorConfig:
    max_exhaustive: int = _like(CampaignSpec, "integrator_max_exhaustive")  # combinations tried exhaustively up to this
    trials: int = _like(CampaignSpec, "integrator_trials")  # otherwise this many
    # a family's candidates include the merges of two of its survivors (one's techniques + the other's it lacks):
    # a front often splits a family's techniques
    merge_within_family: bool = _like(CampaignSpec, "integrator_merge")
    final_repeats: int = _like(CampaignSpec, "final_repeats")  # interleaved baseline/tuned repeats of the chosen config
    # export it only if faster at this significance (one-sided Mann-Whitney U over the repeats; 1: on the median
    # ratio alone). 3 repeats can reach 0.05, 5 reach 0.004
    max_p_value: float = _like(CampaignSpec, "integrator_max_p")


@dataclass
class QualityModelConfig:
    """Where quality numbers come from. A model with random weights says nothing about quality (FP8 alone scores
    33 dB against bf16 on the random 19B), so its campaign measures each trial's quality on a trained model at the
    same setting, layer indices and tile sizes mapped by depth and frame size (techniques/transfer.py), on this
    request (the campaign's seed and mode); latency stays the model's own. The tuned config and the report say
    which model each number comes from."""

    model: str = "auto"  # auto: ltx2-mini for model=ltx2-19b, else the model itself; self; ltx2-mini
    prompt: str = "a red circle and a blue square bouncing"  # (ltx2-mini knows its training scenes' prompts only)
    # auto: the campaign's frame scaled to a long side of at most 768 px (multiples of 64), so that the default
    # 512 px VAE tiles cut it as they cut a 1536 px frame; a smaller frame stays itself. frames auto: at most 33
    height: Any = "auto"
    width: Any = "auto"
    frames: Any = "auto"
    # the quality model in a process of its own, its run overlapping the trial's warm-up: auto (on a GPU; on a CPU
    # both would share the cores), true, false
    concurrent: Any = "auto"


@dataclass
class VerdictConfig:
    """A tier's verdict must hold beyond one clip: before a tier's setting is exported it is measured (on the
    quality model, else this model) on the grid of the campaign's seed and prompt and these, one untimed generation
    each against a stored baseline of that clip, and it keeps the tier only if the worst of every metric over the
    grid passes; else the tier's next-fastest candidate is tried (search/verdict.py). Empty lists: the one clip."""

    seeds: List[int] = field(default_factory=lambda: [1])
    prompts: List[str] = field(default_factory=lambda: ["a yellow triangle and a green circle bouncing, camera "
                                                        "panning left"])
    candidates: int = _like(CampaignSpec, "verdict_candidates")  # of a tier's candidates, fastest first, at most this many


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)  # the `model` group: tiny, ltx2-mini, ltx2-19b, checkpoint
    request: RequestConfig = field(default_factory=RequestConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # quality tiers (the `tiers` group, conf/tiers/): one tuned config per tier (lossless, high, balanced), each
    # verdict over the clips of `verdict`; tiers=none (or null): one tuned config under `gate`. Each tier maps
    # Gate's fields to thresholds, a field left out not gated; the values stay untyped here so that `+tiers.mine.flip_worst=0.1` can add a tier (Hydra cannot add
    # a key to a dict of structured values), and Settings checks each tier's fields (gate_from)
    tiers: Dict[str, Any] = field(default_factory=dict)

    name: str = "default"  # campaign / run name: results go to <results_dir>/<name>/
    results_dir: str = "results"  # where baselines, runs and reports are written
    device: str = "auto"  # auto (cuda if available, else cpu), cpu, cuda, cuda:1 ...
    out: Optional[str] = None  # `vidtune generate`: output folder (default <results_dir>/<name>/generate)
    # keep Inductor's compiled artifacts in <results_dir>/compile_cache (any campaign or run of the same setting,
    # model size, GPU and versions loads them): false to compile afresh
    compile_cache: bool = True

    # `vidtune campaign`: one Optuna study per family, trials on Ray actors, then the integrator
    families: List[str] = field(default_factory=lambda: ["caching", "tiling", "kernel_choice"])
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    gate: GateConfig = field(default_factory=GateConfig)  # the integrator's choice must pass it
    storage: Optional[str] = _like(CampaignSpec, "storage")  # null: results/<name>/optuna.journal; or postgresql://...
    ray: RayConfig = field(default_factory=RayConfig)
    integrator: IntegratorConfig = field(default_factory=IntegratorConfig)
    seed: int = _like(CampaignSpec, "seed")
    quality_model: QualityModelConfig = field(default_factory=QualityModelConfig)
    verdict: VerdictConfig = field(default_factory=VerdictConfig)
    # queue the shipped starting points of this GPU class and mode first in each new family study, exact before
    # approximate, and skip settings known to lose there (search/catalogue.yaml)
    catalogue: bool = _like(CampaignSpec, "catalogue")
    # a new family study then probes each technique alone at its knobs' fast end (a failed quality gate: again
    # halfway), and combines those that passed, before TPE samples
    probes: bool = _like(CampaignSpec, "probes")
    # a trial whose quality (on the quality model) fails the gate after its warm-up run is recorded below the gate
    # without its timed pairs (their latency would not be used)
    screen: bool = _like(CampaignSpec, "screen")
    # a paired trial whose first pair shows it cannot join its family's survivors (slower than the baseline, or
    # than a survivor of at least its PSNR) skips its other pairs
    prune: bool = _like(CampaignSpec, "prune")
    # reuse what earlier campaigns of the same model and GPU class under results_dir measured, on any request: their
    # winners queued early, a technique's losing setting not drawn again
    knowledge: bool = _like(CampaignSpec, "knowledge")
    # earlier campaigns (names under results_dir, same model and device, any request) whose best trials per family
    # are queued first in this campaign's new studies (a name or a list)
    warm_start: Any = field(default_factory=list)
    # tuned configs (a campaign's export, or one written by hand) whose knobs, mapped to this model and request by
    # depth and size, are queued first in the families' studies, each family its part (added to a resumed
    # campaign's studies too; a part measured already is not queued again) (a path or a list)
    seed_configs: Any = field(default_factory=list)


def register() -> None:
    """Store the schema in Hydra's ConfigStore as ``vidtune_schema`` (conf/config.yaml's first default)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="vidtune_schema", node=Config)


def field_kind(path: str) -> str | None:
    """What the schema's field at dotted ``path`` takes, in words (``a number or null``), or None where unknown:
    for an error that names the field and its allowed values."""
    node: Any = Config
    hint: Any = None
    for part in path.split("."):
        if not dataclasses.is_dataclass(node):
            return None
        hint = typing.get_type_hints(node).get(part)
        if hint is None:
            return None
        node = hint
    return _WORDS.get(hint)


def not_a_field(key: str) -> str:
    """The refusal of a key the schema does not have."""
    return f"{key} is not a config field (conf/schema.py lists them)"


def unknown_fields(cfg: Any, node: Any = Config, prefix: str = "") -> list[str]:
    """The dotted keys of a composed config that the schema does not have (those under ``tiers``, whose tier names
    are the user's, are checked by the settings)."""
    hints = typing.get_type_hints(node)
    out = []
    for key in cfg:
        hint = hints.get(key)
        if hint is None:
            out.append(f"{prefix}{key}")
        elif dataclasses.is_dataclass(hint) and cfg[key] is not None:
            out += unknown_fields(cfg[key], hint, f"{prefix}{key}.")
    return out


def composition_error(exc: BaseException) -> str:
    """A composition error in the terms of the field it concerns: ``eval.repeats must be an integer, got 'x'``
    where OmegaConf says which field a value failed to convert for; otherwise Hydra's own message."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    unknown = (ConfigAttributeError, ConfigKeyError)
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, (ValidationError, *unknown)):
        cause = cause.__cause__ or cause.__context__
    key = str(getattr(cause, "full_key", None) or "")
    if isinstance(cause, ValidationError) and key:
        field, _, item = key.partition("[")  # (an item of a list: request.stage1_sigmas[0])
        kind = field_kind(field)
        if kind:
            where = f" (item {item.rstrip(']')})" if item else ""
            return f"{field} must be {kind}, got {getattr(cause, 'value', None)!r}{where}"
    if isinstance(cause, unknown) and key:
        return not_a_field(key)
    return f"bad config override: {exc}"


_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
          Optional[int]: "an integer or null", Optional[float]: "a number or null",
          Optional[bool]: "true, false or null", Optional[str]: "a string or null", List[int]: "a list of integers",
          List[str]: "a list of strings", Optional[List[int]]: "a list of integers or null",
          Optional[List[float]]: "a list of numbers or null"}
