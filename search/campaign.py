"""A campaign's studies: its spec and gate, storage, sampling, and the agents' ask/tell.

The driver that runs a campaign (``vidtune.driver.Campaign``, above search/ and the integrator) owns the
studies through these functions: it samples a setting per family (``ask_effective``), sends it to a free
actor, and tells the study the result: objectives latency (total ms, minimise) and PSNR (maximise), the
quality gate as constraints (<= 0 is feasible). Storage is one Optuna journal file per campaign (or an
RDB URL); a killed campaign resumes from it: finished trials are kept, interrupted ones re-queued with
their parameters, nothing measured is proposed again.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

__all__ = ["Gate", "CampaignSpec", "SearchSpaceError", "sample_family_setting", "ask_effective", "family_sampler",
           "check_search_space", "ask_trial", "tell_trial", "load_spec", "set_constraints"]

_RESERVED = "vidtune"
MAX_LEASE_S = 30 * 86400.0  # an agent's lease (vidtune ask --lease-s): at most 30 days


@dataclass(frozen=True)
class Gate:
    """Quality floors and ceilings a setting must meet (against the baseline of the same request and seed);
    a field set to None is not gated."""

    psnr_db: float | None = 35.0
    ssim: float | None = 0.95
    audio_snr_db: float | None = 10.0
    # off by default; search/metrics.py says what each measures, results/calibration/ which follow a degradation
    psnr_db_worst: float | None = None  # floor on the worst frame's PSNR
    temporal_psnr_db: float | None = None  # floor on the mean PSNR of the frame-to-frame change
    temporal_psnr_db_worst: float | None = None
    flip: float | None = None  # ceiling on the mean FLIP of the sampled frames (0 same .. 1)
    flip_worst: float | None = None
    audio_spectral_db: float | None = None  # ceiling on the audio's mean log-spectral difference
    av_offset_ms: float | None = None  # ceiling on |audio-video offset| against the baseline's, ms
    peak_memory_gb: float | None = None  # ceiling on the setting's peak memory (GiB; evaluator.PeakMemory)

    FLOORS = ("psnr_db", "ssim", "audio_snr_db", "psnr_db_worst", "temporal_psnr_db", "temporal_psnr_db_worst")
    CEILINGS = ("flip", "flip_worst", "audio_spectral_db", "av_offset_ms", "peak_memory_gb")
    ABSOLUTE = ("av_offset_ms",)  # signed metrics whose size is the error (gated, and calibrated, as |value|)

    def constraints(self, quality: dict[str, float]) -> list[float]:
        """Optuna constraints: <= 0 means the floor (or ceiling) is met; one per field set, in the order of
        FLOORS then CEILINGS (the first three as campaigns have always stored them). A gated metric the
        record lacks (measured before it existed, or FLIP left out with eval.flip_frames=0) fails its
        constraint: it was not shown to pass."""
        out = []
        for key in self.FLOORS + self.CEILINGS:
            limit = getattr(self, key)
            if limit is None:
                continue
            value = quality.get(key)
            if value is None:
                out.append(1e6)
            elif key in self.ABSOLUTE:
                out.append(abs(value) - limit)
            else:
                out.append(limit - value if key in self.FLOORS else value - limit)
        return out

    def passes(self, quality: dict[str, float]) -> bool:
        return all(c <= 0 for c in self.constraints(quality))


@dataclass(frozen=True)
class AnyTier:
    """The families' gate when a campaign exports quality tiers: feasible when some tier's gate passes (one
    constraint, the smallest over the tiers of each tier's largest), so that each tier's integrator finds
    its candidates among the survivors."""

    tiers: tuple[tuple[str, Gate], ...]

    def constraints(self, quality: dict[str, float]) -> list[float]:
        return [min(max(g.constraints(quality), default=-1.0) for _, g in self.tiers)]

    def passes(self, quality: dict[str, float]) -> bool:
        return self.constraints(quality)[0] <= 0


@dataclass(frozen=True)
class CampaignSpec:
    """A campaign's settings (from Hydra's ``campaign`` config group and the eval/model/request groups)."""

    name: str
    results_dir: str
    families: tuple[str, ...]
    trials_per_family: int
    gate: Gate
    trial_timeout_s: float = 900.0
    time_budget_s: float | None = None  # the measuring phases' time ceiling, summed over resumes (budget.minutes)
    run_limit_s: float | None = None  # this one run's wall-time ceiling (budget.run_minutes): it pauses, resumable
    storage: str | None = None  # None: results/<name>/optuna.journal; else an RDB URL
    ray_address: str | None = None  # None: a local Ray bound to 127.0.0.1
    num_actors: int = 0  # 0: one per GPU (per ``ranks_per_actor`` GPUs), or one on the CPU
    ranks_per_actor: int = 1  # >1: each actor owns that many ranks (parallelism family), see parallel_worker
    seed: int = 0
    integrator_max_exhaustive: int = 64
    integrator_trials: int = 16
    integrator_merge: bool = True  # a family's candidates include merges of two of its survivors (integrator/combine.py)
    final_repeats: int = 5
    integrator_max_p: float = 0.05  # the tuned combination must beat the baseline at this significance
    worker: dict[str, Any] = field(default_factory=dict)  # WorkerSpec fields
    warm_start: tuple[str, ...] = ()  # earlier campaigns (same results_dir, model, device) whose best seed ours
    # settings queued first in the families' studies, each family its part: {"origin": a tuned config's path,
    # "knobs": its knobs mapped to this model and request, "notes": what the mapping changed} (seed_configs)
    seeds: tuple[dict[str, Any], ...] = ()
    catalogue: bool = True  # queue the shipped starting points first and skip known losers (search/catalogue.py)
    knowledge: bool = True  # reuse earlier campaigns of this model and GPU class under results_dir (search/knowledge.py)
    # quality tiers, strictest first: one tuned config each (tuned-<tier>.yaml); the families then search under
    # AnyTier and ``gate`` is not used. Empty: one tuned config under ``gate``
    tiers: tuple[tuple[str, Gate], ...] = ()

    @property
    def search_gate(self) -> Gate | AnyTier:
        """The gate the families' studies and the combinations are measured against."""
        return AnyTier(self.tiers) if self.tiers else self.gate

    @property
    def directory(self) -> Path:
        return Path(self.results_dir) / self.name


class StorageError(RuntimeError):
    """A campaign's storage cannot be read as it is; the message names the file and what to do."""


def repair_journal(path: Path) -> str | None:
    """Make a journal that a crash tore readable again, before Optuna opens it.

    Optuna appends one JSON record per line. A crash mid-write leaves a last line without its newline
    (or half a record); Optuna then fails on every later read ("Expecting ':' delimiter"), and a new run
    appends after the torn bytes. The torn tail is cut back to the last complete record, the file as it
    was is kept beside it (``<name>.torn-<time>``), and a message says so (None when nothing was torn).
    A damaged record before the last is not a crash's doing: ``StorageError`` names its line.
    """
    import json

    if not path.is_file():
        return None
    data = path.read_bytes()
    lines = data.split(b"\n")  # the last element is what follows the last newline (b"" when none is torn)
    good_end = 0
    for number, line in enumerate(lines[:-1], start=1):
        try:
            json.loads(line)
        except ValueError as e:
            if number == len(lines) - 1 and not lines[-1]:
                break  # the last line is complete but garbled: a torn write too (its newline came first)
            raise StorageError(f"{path}: line {number} of {len(lines) - 1} is not a journal record ({e}); "
                               f"it is not the torn tail a crash leaves. Restore the file from a backup, or "
                               f"move it away to start the campaign's studies afresh") from None
        good_end += len(line) + 1
    if good_end == len(data):
        return None
    backup = path.with_name(f"{path.name}.torn-{time.strftime('%Y%m%d-%H%M%S')}")
    backup.write_bytes(data)
    with open(path, "r+b") as f:
        f.truncate(good_end)
        f.flush()
        os.fsync(f.fileno())
    return (f"{path}: cut a torn last record ({len(data) - good_end} bytes, a write a crash interrupted) back to "
            f"the last complete one; the file as it was is kept in {backup.name}")


class CampaignStopped(Exception):
    """SIGTERM or SIGINT reached the campaign: it stops, its actors ended, its running trials resumable."""

    def __init__(self, signum: int) -> None:
        import signal

        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


class CampaignPaused(Exception):
    """``budget.run_minutes`` reached: the run stopped before starting what would not end within it (nothing
    in flight was cut); the same command resumes it where it paused."""

    def __init__(self, what: str, limit_s: float) -> None:
        self.what, self.limit_s = what, limit_s
        super().__init__(f"paused before {what}: budget.run_minutes ({limit_s / 60:g} min) would be exceeded")


_STOP: list[int] = []  # the signal that asked the running campaign to stop (set by _StopOnSignals)


def check_stop() -> None:
    """Raise ``CampaignStopped`` if a stop signal arrived (the driver's waits call it every half second)."""
    if _STOP:
        raise CampaignStopped(_STOP[0])


class _StopOnSignals:
    """SIGTERM and SIGINT stop the campaign through its cleanup (the pool kills its actors and ends the Ray
    it started): by default SIGTERM ended the driver on the spot, Ray printed its stack dump, and actors
    (in their own process groups) lived on for seconds. The handler only records the signal; the driver
    waits on Ray in half-second polls (``_Pool.get``/``wait``) and raises ``CampaignStopped`` there, in
    Python (raised from inside the handler, it landed in Ray's C++ wait: "SystemError: CoreWorker.wait
    returned a result with an exception set"). Later signals are ignored; SIGKILL still ends everything.

    ``ray.init`` installs Ray's own SIGTERM handler over this one (seen: "*** SIGTERM received ***" and
    the driver gone), so the pool calls ``install`` again once Ray is up."""

    def __enter__(self) -> "_StopOnSignals":
        import signal
        import threading

        _STOP.clear()
        self.active = threading.current_thread() is threading.main_thread()
        self.previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)} if self.active else {}
        self.install()
        return self

    def install(self) -> None:
        import signal

        def stop(signum: int, frame: Any) -> None:
            if not _STOP:
                _STOP.append(signum)

        for s in self.previous:
            signal.signal(s, stop)

    def __exit__(self, *exc: Any) -> None:
        import signal

        for s, handler in self.previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        _STOP.clear()


class CampaignBusy(RuntimeError):
    """Another live process runs this campaign (it holds the campaign directory's lock)."""


@contextmanager
def campaign_lock(directory: Path) -> Iterator[None]:
    """One campaign, one owner: an exclusive ``flock`` on ``<directory>/campaign.lock`` for the whole run.

    The kernel drops the lock when its process ends, however it ends, so a killed campaign leaves no stale
    lock to clean up; the file says who holds it (pid, host, since) for the refusal of a second run.
    """
    import fcntl
    import socket

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "campaign.lock"
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process (no details written yet)"
        f.close()
        raise CampaignBusy(f"campaign {directory.name!r} is running already: {holder} holds {path}; wait for it to "
                           f"end, or stop it (a killed campaign resumes where it stopped)") from None
    try:
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S %z')}\n")
        f.flush()
        yield
    finally:
        f.truncate(0)
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


def storage_for(spec: CampaignSpec, log: Any = None) -> Any:
    """The Optuna storage: a journal file per campaign by default, or an RDB URL (PostgreSQL). A torn
    journal is repaired first (``repair_journal``; ``log`` gets the message, else stderr)."""
    import optuna

    if spec.storage:
        return rdb_storage(spec.storage)
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    spec.directory.mkdir(parents=True, exist_ok=True)
    path = spec.directory / "optuna.journal"
    message = repair_journal(path)
    if message:
        (log or (lambda m: print(m, file=sys.stderr)))(message)
    try:
        return JournalStorage(JournalFileBackend(str(path)))
    except ValueError as e:  # (json's errors are ValueErrors) a record Optuna cannot replay
        raise StorageError(f"{path}: Optuna cannot replay this journal ({e}); restore it from a backup, or move "
                           f"it away to start the campaign's studies afresh") from None


def _rdb_url(url: str) -> str:
    """``postgresql://`` with the driver ``[postgres]`` installs: SQLAlchemy 2.1 reads a bare ``postgresql://`` as
    psycopg 3, and with only psycopg2 installed the README's own URL failed with an ImportError."""
    import importlib.util

    scheme, sep, rest = url.partition("://")
    if scheme == "postgresql" and importlib.util.find_spec("psycopg") is None and \
            importlib.util.find_spec("psycopg2") is not None:
        return f"postgresql+psycopg2{sep}{rest}"
    return url


def _hide_password(url: str) -> str:
    import re

    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url)


def rdb_storage(url: str) -> Any:
    """Optuna's RDB storage on ``url``; a missing driver, an unreachable server or an unwritable database file is
    a ``StorageError`` of one line naming the URL (password hidden) and what to do."""
    import optuna

    shown = _hide_password(url)
    try:
        return optuna.storages.RDBStorage(_rdb_url(url))
    except ImportError as exc:
        raise StorageError(f"storage={shown}: its database driver is not installed ({exc}); for PostgreSQL install "
                           f"vidtune's extra: pip install 'vidtune[postgres]'") from None
    except Exception as exc:  # sqlalchemy's OperationalError, ArgumentError, ... (not imported here: optional)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise StorageError(f"storage={shown}: cannot open the study storage ({type(exc).__name__}: {first}); check "
                           f"that the server is running and reachable, or the database file's folder is writable") from None


def sample_family_setting(trial: Any, family: str, request: Any = None) -> dict[str, dict[str, Any]]:
    """Define-by-run sample of one family: per technique a ``use`` flag, then its knobs when used.

    A technique whose seams overlap those of one chosen earlier in the same trial, with no composition rule
    between the two, is not offered (e.g. TeaCache after the first-block cache; the STG prefix after either
    is, by its rule), so trials are not wasted on settings ``compose`` would reject; nor is one that says it
    does not apply to the request (``Technique.applicable``).
    A sampled setting that is off, or cannot change anything for the request (``Technique.effective``),
    is left out; an empty result is a no-op the caller skips instead of measuring the baseline again.
    """
    from vidtune.techniques import registered
    from vidtune.techniques.registry import KnobError, composition_rule, overlapping_seams

    setting: dict[str, dict[str, Any]] = {}
    chosen: list[Any] = []
    for tech in registered(family):
        clash = any(overlapping_seams(tech, c) and composition_rule(tech, c) is None for c in chosen)
        if tech.name.split(".")[1].startswith("test_") or clash or not tech.applicable(request):
            continue
        if trial.suggest_categorical(f"{tech.name}.use", [False, True]):
            values = tech.suggest(trial, request)
            try:
                full = tech.validate(values)
            except KnobError:  # invalid for a cross-knob reason: kept, so the caller records why it failed
                full = None
            if full is not None and (tech.is_off(full) or (request is not None and not tech.effective(full, request))):
                continue
            setting[tech.name] = values
            chosen.append(tech)
    return setting


class SearchSpaceError(ValueError):
    """An existing campaign's studies were sampled from a search space this vidtune no longer has."""


def family_distributions(family: str, request: Any) -> dict[str, Any]:
    """Every Optuna distribution a family's sampling can use here (each technique sampled alone, so that
    seam claims hide none), by parameter name."""
    import optuna

    from vidtune.techniques import registered
    from vidtune.techniques.registry import KnobError

    found: dict[str, Any] = {}
    names = [t.name for t in registered(family)]
    for name in names:
        probe = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        probe.enqueue_trial({f"{n}.use": n == name for n in names})
        trial = probe.ask()
        try:
            sample_family_setting(trial, family, request)
        except KnobError:  # a technique that cannot be offered here has no distributions to compare
            continue
        found.update(trial.distributions)
    return found


def check_search_space(study: Any, family: str, request: Any) -> None:
    """Raise ``SearchSpaceError`` when a resumed study holds a categorical parameter whose choices this
    version samples differently (Optuna refuses a categorical's choices to change inside a study; e.g.
    a technique's switch no longer offers its off value). Numeric ranges may change: Optuna allows it."""
    from optuna.distributions import check_distribution_compatibility

    now = family_distributions(family, request)
    for trial in study.get_trials(deepcopy=False):
        for param, old in trial.distributions.items():
            if param not in now:
                continue
            try:  # raises for a changed categorical's choices or another kind of distribution
                check_distribution_compatibility(old, now[param])
            except ValueError:
                raise SearchSpaceError(
                    f"campaign study {study.study_name!r} was sampled with {param} in {_domain(old)}; this vidtune "
                    f"samples it in {_domain(now[param])}, and an Optuna study cannot change that. Start a new "
                    f"campaign (another name=) or delete its folder to search again from scratch") from None


def _domain(d: Any) -> str:
    return f"{list(d.choices)}" if hasattr(d, "choices") else f"[{d.low}, {d.high}]"


@contextmanager
def _search_plan(spec: CampaignSpec) -> Iterator[None]:
    """While a campaign samples: the actors' world (parallelism degrees are sampled and checked against it)
    and their stage-2 tiling (tile_parallel settings with one tile to share are skipped as no-ops). Both
    plans are process-wide; the earlier ones come back afterwards."""
    from vidtune.model.tiles import Stage2Tiling
    from vidtune.techniques.parallelism._dist import planned_world
    from vidtune.techniques.parallelism.tile_parallel import planned_stage2_tiling

    with planned_world(spec.ranks_per_actor), \
            planned_stage2_tiling(Stage2Tiling(**spec.worker.get("stage2_tiling", {}))):
        yield


def family_sampler(seed: int, family: str, trials_so_far: int) -> Any:
    """The family's TPE sampler, seeded by the campaign's seed, the family and how many trials its study
    already holds. A sampler seeded by the campaign's seed alone starts its random stream over at every
    resume and proposes the first trials' parameters again (the committed one-GPU campaign's kernel_choice
    trial 4 repeated trial 0's); TPE's guided trials read the study's history, so only the stream moves."""
    import optuna

    mix = int.from_bytes(hashlib.sha256(f"{seed}:{family}:{trials_so_far}".encode()).digest()[:4], "big")
    return optuna.samplers.TPESampler(seed=mix, n_startup_trials=4, multivariate=False)


def _param_key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def ask_effective(study: Any, family: str, request: Any, limit: int = 50,
                  reject: Any = None) -> tuple[Any, dict[str, dict[str, Any]] | None, int]:
    """Ask ``study`` until the sampled setting changes something and is new; returns (trial, setting, skipped).

    A no-op sample (every technique left unused, off, or without effect on the request) is told PRUNED
    with reason ``no-op``, and a sample whose parameters an earlier trial of the study already measured, or
    is measuring, with reason ``duplicate`` (its result would only repeat that trial's): neither costs a
    measurement or counts against the budget. Re-queued trials (an interrupted trial's parameters) are
    asked as queued. ``reject(setting)`` may give a reason not to measure a setting (a known loser on this GPU
    class): such a sample is pruned with reason ``known-loser`` and the reason in ``why``. After ``limit`` such
    samples in a row the family is taken as exhausted: (None, None, limit).
    """
    import optuna

    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.RUNNING)
    for skipped in range(limit):
        trial = study.ask()
        setting = sample_family_setting(trial, family, request)
        if setting:
            key = _param_key(trial.params)
            seen = [t.number for t in study.get_trials(deepcopy=False, states=states)
                    if t.number != trial.number and t.user_attrs.get("reason") != "interrupted" and t.params
                    and _param_key(t.params) == key]
            why = reject(setting) if reject is not None and not seen else None
            if not seen and why is None:
                return trial, setting, skipped
            if seen:
                trial.set_user_attr("reason", "duplicate")
                trial.set_user_attr("duplicate_of", seen[0])
            else:
                trial.set_user_attr("reason", "known-loser")
                trial.set_user_attr("why", why)
        else:
            trial.set_user_attr("reason", "no-op")
        set_constraints(trial, [1.0, 1.0, 1.0])  # counts as infeasible for the sampler (it gives nothing new)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    return None, None, limit


def warm_start_params(spec: CampaignSpec, family: str, best: int = 2) -> list[tuple[str, dict[str, Any]]]:
    """The parameters of the ``best`` fastest feasible trials of ``family`` in each earlier campaign of
    ``spec.warm_start`` (faster than its baseline beyond the noise where measured paired), as (origin,
    params): a new study of the same model and device on another request starts from them (the driver
    enqueues them), so that its first trials are the earlier campaign's findings instead of random ones."""
    import optuna

    out = []
    for other in spec.warm_start:
        earlier = load_spec(Path(spec.results_dir) / other)
        try:
            study = optuna.load_study(study_name=f"{earlier.name}:{family}", storage=storage_for(earlier))
        except KeyError:  # that campaign did not search this family
            continue
        done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                if t.user_attrs.get("feasible") and (t.user_attrs.get("paired") or {}).get("faster", True) and t.params]
        for t in sorted(done, key=lambda t: t.values[0])[:best]:
            out.append((f"{earlier.name}:{family}#{t.number}", dict(t.params)))
    return out


def seed_params(family: str, knobs: dict[str, dict[str, Any]], request: Any) -> tuple[dict[str, Any] | None, str]:
    """The Optuna parameters of ``family``'s sampling that give exactly the family's part of ``knobs`` (a
    seed config's setting), and what that part is; ``(None, why)`` when the family's search space cannot
    express it (a value outside what its ``suggest`` offers here, a knob it does not sample, a technique
    not offered for the request) or ``knobs`` has no part in the family (why: "").

    Found by running the family's sampling on a probe study with the candidate parameters queued: every
    parameter the sampling asked must have been given and lie in the distribution it was asked with, and
    the setting it built must equal the seed's part (both with their knobs' defaults filled in)."""
    import warnings

    import optuna

    from vidtune.techniques import registered
    from vidtune.techniques.registry import KnobError, get, resolve_values

    part = {n: get(n).canonical(v, request) for n, v in resolve_values(knobs).items() if get(n).family == family}
    if not part:
        return None, ""
    names = [t.name for t in registered(family)]
    given: dict[str, Any] = {f"{n}.use": n in part for n in names}
    for name, values in part.items():
        given.update({f"{name}.{k}": v for k, v in values.items()})
    probe = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a fixed value outside its distribution is checked below)
        probe.enqueue_trial(given)
        trial = probe.ask()
        try:
            built = resolve_values(sample_family_setting(trial, family, request))
        except (KnobError, ValueError) as exc:
            return None, f"its {family} knobs {part} cannot be sampled here ({exc}: a technique or value the family does not offer on this device or request)"
    asked = trial.params
    not_given = sorted(set(asked) - set(given))
    outside = sorted(p for p in asked if p in given and not _contains(trial.distributions[p], asked[p]))
    if not_given or outside or built != part:
        why = (f"the family samples {not_given}, which the seed does not set" if not_given else
               f"{outside} lie outside what the family samples for this request" if outside else
               f"the family's sampling builds {built} from it (a technique not offered here, one that changes nothing "
               f"for this request, or a knob the family fixes)")
        return None, f"its {family} knobs {part} are not in the family's search space: {why}"
    return dict(asked), f"{part}"


def _contains(distribution: Any, value: Any) -> bool:
    try:
        return bool(distribution._contains(distribution.to_internal_repr(value)))
    except ValueError:  # a categorical's value not among its choices
        return False


def overhead_summary(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The campaign's per-trial framework overhead, over the measured trials and combinations: the share
    of each evaluation's wall time outside its generations (applying and undoing the setting, the quality
    metrics, what runs between stages), its median and worst, and the warm-up generations' share beside
    it (a compile lands there). None when no record carries its timing."""
    import statistics

    timed = [r["timing"] for r in records if r.get("status") == "ok" and (r.get("timing") or {}).get("wall_s")]
    if not timed:
        return None
    fractions = [t["framework_fraction"] for t in timed]
    warm = [t["warmup_runs_s"] / t["wall_s"] for t in timed]
    return {"evaluations": len(timed), "framework_fraction_median": round(statistics.median(fractions), 4),
            "framework_fraction_max": round(max(fractions), 4),
            "warmup_fraction_median": round(statistics.median(warm), 4),
            "quality_s_median": round(statistics.median(t["quality_s"] for t in timed), 3),
            "what": "share of each evaluation's wall time outside its generations (apply/undo, metrics, between "
                    "stages); the warm-up generations' share beside it"}


def set_constraints(trial: Any, values: list[float]) -> None:
    """The quality gate's constraints on an Optuna trial (feasible where all are <= 0), keyed "0", "1", ...:
    the keys Optuna gives a list stored by the ``constraints_func`` of earlier campaigns (deprecated in
    Optuna 5), so a journal that holds both kinds reads the same."""
    for i, value in enumerate(values):
        trial.set_constraint(str(i), value)


def append_record(spec: CampaignSpec, record: dict[str, Any]) -> None:
    """One finished trial or combination appended to the campaign's ``trials.jsonl`` as it finishes (what the
    report and a resume read)."""
    from vidtune.search.records import RecordLog

    message = RecordLog(spec.directory / "trials.jsonl").append(record)
    if message:
        print(message, file=sys.stderr)


def tell_result(spec: CampaignSpec, study: Any, trial: Any, family: str, result: dict[str, Any]) -> None:
    """Tell ``study`` a trial's result (objectives, the gate's constraints, or FAIL with its reason) and
    record it in ``trials.jsonl``: for the driver's trials and an agent's ``tell`` alike.

    When the trial was finished meanwhile by someone else (an outside ``tell`` on a lease that had expired),
    this measurement is not lost and the caller does not crash: it is added as a new trial with the same
    parameters (``measured_for``: the number it was measured for)."""
    number = trial.number
    base = {"family": family, "trial": number, "params": trial.params, "time": time.time()}
    attrs = getattr(trial, "user_attrs", None) or {}
    origin = attrs.get("seeded_from") or attrs.get("warm_start_from")
    if origin:  # queued by seed_configs or warm_start: the report says where the setting came from
        base["queued_from"] = ("seed " if attrs.get("seeded_from") else "warm start ") + str(origin)
    if result.get("status") == "ok":
        q = result["quality"]
        constraints = spec.search_gate.constraints(q)
        user = {key: result[key] for key in ("latency", "quality", "stats", "knobs", "start_stage", "total_ms",
                                             "timing", "paired") if key in result}  # (a told result: total_ms, quality)
        user.update(constraints=constraints, feasible=all(c <= 0 for c in constraints))
        told = _tell(study, trial, user, values=[result["total_ms"], q["psnr_db"]], constraints=constraints)
        record = {**base, **{k: v for k, v in result.items() if k != "traceback"}, "constraints": constraints}
    else:
        user = {"reason": result.get("reason", "error"), "message": result.get("message", ""),
                "knobs": result.get("knobs", {})}
        told = _tell(study, trial, user, values=None, constraints=None)
        record = {**base, **{k: v for k, v in result.items() if k != "traceback"}}
    if told != number:
        record.update(trial=told, measured_for=number)
    append_record(spec, record)


def _tell(study: Any, trial: Any, user_attrs: dict[str, Any], values: list[float] | None,
          constraints: list[float] | None) -> int:
    """Finish ``trial`` (COMPLETE with ``values``, or FAIL); returns the number the result was stored under:
    the trial's own, or a new trial's when someone else finished this one meanwhile."""
    import optuna

    from vidtune._io import strict_json

    user_attrs = json.loads(strict_json(user_attrs))  # standard JSON in the journal (NaN -> null)
    state = optuna.trial.TrialState.COMPLETE if values is not None else optuna.trial.TrialState.FAIL
    if not study.get_trials(deepcopy=False)[trial.number].state.is_finished():
        try:
            for key, value in user_attrs.items():
                trial.set_user_attr(key, value)
            if constraints is not None:
                set_constraints(trial, constraints)
            study.tell(trial, values, state=None if values is not None else state)
            return trial.number
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # finished by another process between the check and the tell
    frozen = study.get_trials(deepcopy=False)[trial.number]
    study.add_trial(optuna.trial.create_trial(
        state=state, values=values, params=frozen.params, distributions=frozen.distributions,
        user_attrs={**user_attrs, "measured_for": trial.number},
        constraints=None if constraints is None else {str(i): c for i, c in enumerate(constraints)}))
    return max(t.number for t in study.get_trials(deepcopy=False) if t.user_attrs.get("measured_for") == trial.number)


def spec_summary(spec: CampaignSpec) -> dict[str, Any]:
    d = asdict(spec)
    d["gate"] = asdict(spec.gate)
    d["tiers"] = [[name, asdict(g)] for name, g in spec.tiers]
    return d


# ---------------------------------------------------------------------- agents: ask / tell
def save_spec(spec: CampaignSpec) -> Path:
    """Write ``campaign_spec.json`` so ``vidtune ask``/``tell``/``report`` can find the studies and gate."""
    from vidtune._io import atomic_write_text, strict_json

    path = spec.directory / "campaign_spec.json"
    atomic_write_text(path, strict_json(spec_summary(spec), indent=2))
    return path


def check_resumed_quality(spec: CampaignSpec) -> None:
    """Raise ``SearchSpaceError`` when a campaign folder's stored spec measured quality on another model or
    request than ``spec`` would (``quality_model.*``, or their ``auto`` values of another vidtune): its trials'
    numbers and the new ones would not compare. Names the stored values, to pass them explicitly."""
    path = spec.directory / "campaign_spec.json"
    if not path.is_file():
        return
    def where(q: dict[str, Any] | None) -> Any:
        if not q:
            return None
        r = q["request"]
        return {"model": q["source"].get("preset") or q["source"], "height": r["height"], "width": r["width"],
                "frames": r["frames"], "prompt": r["prompt"]}
    stored = where((_read_spec_json(path).get("worker") or {}).get("quality"))
    asked = where((spec.worker or {}).get("quality"))
    if stored != asked:
        how = ("quality_model.model=self" if stored is None else
               f"quality_model.model={stored['model']} quality_model.height={stored['height']} "
               f"quality_model.width={stored['width']} quality_model.frames={stored['frames']}")
        raise SearchSpaceError(f"campaign {spec.name!r} measured its trials' quality on {stored}; this run would measure "
                               f"it on {asked}, and the numbers would not compare. Resume with {how}, or start a new "
                               f"campaign (another name=)")


def load_spec(directory: Path) -> CampaignSpec:
    path = Path(directory) / "campaign_spec.json"
    if not path.is_file():
        raise ValueError(f"campaign {str(directory)!r} has no campaign_spec.json: run `vidtune campaign name=...` first")
    d = _read_spec_json(path)
    try:
        d["gate"] = Gate(**d["gate"])
        d["tiers"] = tuple((name, Gate(**g)) for name, g in d.get("tiers") or ())
        d["families"] = tuple(d["families"])
        d["warm_start"] = tuple(d.get("warm_start") or ())
        d["seeds"] = tuple(d.get("seeds") or ())
        return CampaignSpec(**d)
    except (KeyError, TypeError, ValueError) as exc:
        raise StorageError(f"{path}: not a campaign spec vidtune can read ({type(exc).__name__}: {exc}); restore it from "
                           f"a backup, or run `vidtune campaign name=...` again with the campaign's settings") from None


def _read_spec_json(path: Path) -> dict[str, Any]:
    """``campaign_spec.json`` as a dict; ``StorageError`` naming the file when it is not one."""
    try:
        d = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise StorageError(f"{path}: cannot be read as a campaign spec ({exc}); restore it from a backup, or move it "
                           f"away and run `vidtune campaign name=...` again with the campaign's settings") from None
    if not isinstance(d, dict):
        raise StorageError(f"{path}: a campaign spec is a JSON object, this holds {type(d).__name__}")
    return d


def _study(spec: CampaignSpec, family: str) -> Any:
    import optuna

    if family not in spec.families:
        raise ValueError(f"--family must be one of the campaign's families {list(spec.families)}, got {family!r}")
    return optuna.load_study(study_name=f"{spec.name}:{family}", storage=storage_for(spec))


def ask_trial(spec: CampaignSpec, family: str, lease_s: float = 3600.0) -> dict[str, Any]:
    """Ask the family's study for the next setting (the trial stays RUNNING until told). The trial is leased
    for ``lease_s`` seconds: a campaign resumed meanwhile leaves it to the agent (``lease_until``)."""
    from vidtune.model import GenerationRequest

    if not (isinstance(lease_s, (int, float)) and math.isfinite(lease_s) and 0 < lease_s <= MAX_LEASE_S):
        raise ValueError(f"--lease-s must be a number of seconds in (0, {MAX_LEASE_S:.0f}], got {lease_s!r}")
    study = _study(spec, family)
    with _search_plan(spec):  # the same choices as the campaign's own trials
        trial, setting, _ = ask_effective(study, family, GenerationRequest.from_dict(spec.worker["request"]))
    if trial is None:
        raise ValueError(f"family {family!r}: the sampler proposes only settings that change nothing for this request")
    trial.set_user_attr("asked_by", "agent")
    lease_until = time.time() + lease_s
    trial.set_user_attr("lease_until", lease_until)
    return {"campaign": spec.name, "family": family, "trial": trial.number, "knobs": setting,
            "lease_until": when(lease_until)}


def live_lease(user_attrs: dict[str, Any], now: float | None = None) -> float | None:
    """A running trial's lease end (``lease_until``) when it is live, else None. A lease further away than
    ``MAX_LEASE_S`` (or not a finite number) is one no vidtune writes now (an older ``ask --lease-s inf`` wrote
    1e300, and every resume then failed formatting it): it counts as expired, so the trial is taken over."""
    lease = user_attrs.get("lease_until")
    now = time.time() if now is None else now
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not math.isfinite(lease):
        return None
    return float(lease) if now < lease <= now + MAX_LEASE_S + 3600 else None


def when(timestamp: float) -> str:
    """A local date and time for messages."""
    return time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(timestamp))


def check_told_result(result: Any) -> None:
    """Refuse a told result before anything is recorded (ValueError naming the field): ``tell`` with
    ``total_ms: NaN`` left trials.jsonl saying ok while the study said FAIL, and strings crashed with the
    trial left RUNNING."""
    import math

    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    if not isinstance(result, dict):
        raise ValueError(f"--result must hold a JSON object, got {type(result).__name__}")
    status = result.get("status")
    if status not in ("ok", "fail"):
        raise ValueError(f"--result: field status must be one of ['ok', 'fail'], got {status!r}")
    if "knobs" in result and not isinstance(result["knobs"], dict):
        raise ValueError(f"--result: field knobs must be an object of technique -> knob values, got {result['knobs']!r}")
    if status == "fail":
        if not isinstance(result.get("reason", ""), str):
            raise ValueError(f"--result: field reason must be a string, got {result['reason']!r}")
        return
    if not number(result.get("total_ms")) or result["total_ms"] <= 0:
        raise ValueError(f"--result: an ok result needs field total_ms, a finite number of milliseconds > 0, got "
                         f"{result.get('total_ms')!r}")
    quality = result.get("quality")
    if not isinstance(quality, dict):
        raise ValueError(f"--result: an ok result needs field quality, an object, got {quality!r}")
    for key in ("psnr_db", "ssim", "audio_snr_db"):
        if not number(quality.get(key)):
            raise ValueError(f"--result: field quality.{key} must be a finite number, got {quality.get(key)!r}")
    for key, value in quality.items():  # optional metrics: a finite number or null (the records stay standard JSON)
        if value is not None and not number(value):
            raise ValueError(f"--result: field quality.{key} must be a finite number or null, got {value!r}")


def tell_trial(spec: CampaignSpec, number: int, result: dict[str, Any], family: str | None = None) -> dict[str, Any]:
    """Record an externally measured result (``status`` ok with ``total_ms`` and ``quality``, or fail)."""
    import optuna

    families = [family] if family else list(spec.families)
    matches = []
    for f in families:
        study = _study(spec, f)
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            if t.number == number:
                matches.append((f, study, t))
    if len(matches) != 1:
        raise ValueError(f"--trial {number}: {len(matches)} running trials with that number in {families}; "
                         f"give --family to choose" if matches else f"--trial {number}: no running trial with that number")
    f, study, frozen = matches[0]
    check_told_result(result)
    lease, owner = live_lease(frozen.user_attrs), frozen.user_attrs.get("lease_owner")
    if owner and lease is not None:
        # a driver is measuring it (its lease renewed every 30 s): its own result would be lost, or worse
        raise ValueError(f"--trial {number}: the campaign's driver {owner} (pid {frozen.user_attrs.get('lease_pid')}) is "
                         f"measuring it, leased until {when(lease)}; "
                         f"tell only a trial you asked (vidtune ask)")
    trial = optuna.trial.Trial(study, frozen._trial_id)
    tell_result(spec, study, trial, f, {"knobs": result.get("knobs", {}), **result})
    return {"family": f, "trial": number, "state": study.trials[number].state.name}
