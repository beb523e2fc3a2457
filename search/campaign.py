"""The search campaign: a baseline, one Optuna study per family side by side, trials on Ray actors.

The driver owns the studies (ask/tell): it samples a setting per family, sends it to a free actor (one
per GPU, or one on the CPU, each keeping the pipeline built), and tells the study the result:
objectives latency (total ms, minimise) and PSNR (maximise), the quality gate as constraints (<= 0 is
feasible). A failed trial (exception, NaN, OOM, timeout, dead actor) is told FAIL with its reason and
the campaign goes on. Storage is one Optuna journal file per campaign (or an RDB URL); a killed
campaign resumes from it: finished trials are kept, interrupted ones re-queued with their parameters.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

__all__ = ["Gate", "CampaignSpec", "Campaign", "SearchSpaceError", "sample_family_setting", "ask_effective",
           "check_search_space", "ask_trial", "tell_trial", "load_spec"]

_RESERVED = "vidtune"


@dataclass(frozen=True)
class Gate:
    """Quality floors a setting must meet (against the baseline of the same request and seed)."""

    psnr_db: float = 35.0
    ssim: float = 0.95
    audio_snr_db: float = 10.0

    def constraints(self, quality: dict[str, float]) -> list[float]:
        """Optuna constraints: <= 0 means the floor is met."""
        return [self.psnr_db - quality["psnr_db"], self.ssim - quality["ssim"], self.audio_snr_db - quality["audio_snr_db"]]

    def passes(self, quality: dict[str, float]) -> bool:
        return all(c <= 0 for c in self.constraints(quality))


@dataclass(frozen=True)
class CampaignSpec:
    """A campaign's settings (from Hydra's ``campaign`` config group and the eval/model/request groups)."""

    name: str
    results_dir: str
    families: tuple[str, ...]
    trials_per_family: int
    gate: Gate
    trial_timeout_s: float = 900.0
    storage: str | None = None  # None: results/<name>/optuna.journal; else an RDB URL
    ray_address: str | None = None  # None: a local Ray bound to 127.0.0.1
    num_actors: int = 0  # 0: one per GPU (per ``ranks_per_actor`` GPUs), or one on the CPU
    ranks_per_actor: int = 1  # >1: each actor owns that many ranks (parallelism family), see parallel_worker
    seed: int = 0
    integrator_max_exhaustive: int = 64
    integrator_trials: int = 16
    final_repeats: int = 5
    integrator_max_p: float = 0.05  # the tuned combination must beat the baseline at this significance
    worker: dict[str, Any] = field(default_factory=dict)  # WorkerSpec fields

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
        return optuna.storages.RDBStorage(spec.storage)
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


def sample_family_setting(trial: Any, family: str, request: Any = None) -> dict[str, dict[str, Any]]:
    """Define-by-run sample of one family: per technique a ``use`` flag, then its knobs when used.

    A technique whose seams are already claimed by one chosen earlier in the same trial is not offered
    (e.g. TeaCache after the first-block cache), so trials are not wasted on settings ``compose``
    would reject; nor is one that says it does not apply to the request (``Technique.applicable``).
    A sampled setting that is off, or cannot change anything for the request (``Technique.effective``),
    is left out; an empty result is a no-op the caller skips instead of measuring the baseline again.
    """
    from vidtune.techniques import registered
    from vidtune.techniques.registry import KnobError

    setting: dict[str, dict[str, Any]] = {}
    claimed: set[str] = set()
    for tech in registered(family):
        if tech.name.split(".")[1].startswith("test_") or claimed & set(tech.seams) or not tech.applicable(request):
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
            claimed |= set(tech.seams)
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


def ask_effective(study: Any, family: str, request: Any, limit: int = 50) -> tuple[Any, dict[str, dict[str, Any]] | None, int]:
    """Ask ``study`` until the sampled setting changes something and is new; returns (trial, setting, skipped).

    A no-op sample (every technique left unused, off, or without effect on the request) is told PRUNED
    with reason ``no-op``, and a sample whose parameters an earlier trial of the study already measured, or
    is measuring, with reason ``duplicate`` (its result would only repeat that trial's): neither costs a
    measurement or counts against the budget. Re-queued trials (an interrupted trial's parameters) are
    asked as queued. After ``limit`` such samples in a row the family is taken as exhausted: (None, None,
    limit).
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
            if not seen:
                return trial, setting, skipped
            trial.set_user_attr("reason", "duplicate")
            trial.set_user_attr("duplicate_of", seen[0])
        else:
            trial.set_user_attr("reason", "no-op")
        set_constraints(trial, [1.0, 1.0, 1.0])  # counts as infeasible for the sampler (it gives nothing new)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    return None, None, limit


def set_constraints(trial: Any, values: list[float]) -> None:
    """The quality gate's constraints on an Optuna trial (feasible where all are <= 0), keyed "0", "1", ...:
    the keys Optuna gives a list stored by the ``constraints_func`` of earlier campaigns (deprecated in
    Optuna 5), so a journal that holds both kinds reads the same."""
    for i, value in enumerate(values):
        trial.set_constraint(str(i), value)


class _Pool:
    """Ray actors evaluating trials; a timed-out or dead actor is killed and replaced."""

    def __init__(self, spec: CampaignSpec) -> None:
        # ENVIRONMENT.md: with this variable a local Ray binds 127.0.0.1 only; no auth token file. Ray reads
        # it when it is imported (ray_constants), so it is set before the import: set after, the campaign's
        # Ray listened on [::] and the node's address (seen with a real campaign; the tests, which set it
        # first, never saw it)
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        import ray

        self.ray = ray
        self.spec = spec
        self._init_ray()
        import torch

        gpus = torch.cuda.device_count() if spec.worker.get("device", "cpu").startswith("cuda") else 0
        ranks = spec.ranks_per_actor
        if gpus and ranks > gpus:
            raise ValueError(f"ray.ranks_per_actor={ranks} needs {ranks} GPUs per actor; this machine has {gpus}")
        self.num_gpus_per_actor = ranks if gpus else 0
        n = spec.num_actors or max(1, gpus // ranks)
        self.actors = [self._new_actor() for _ in range(n)]

    def _init_ray(self) -> None:
        ray = self.ray
        self.owns_ray = not ray.is_initialized()
        if not self.owns_ray:
            return
        if self.spec.ray_address:
            ray.init(address=self.spec.ray_address, logging_level="ERROR", log_to_driver=False)
        else:
            ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                     _node_ip_address="127.0.0.1", num_cpus=max(2, os.cpu_count() or 2))

    def _new_actor(self) -> Any:
        from vidtune.search.worker import TrialWorker, WorkerSpec

        ranks = self.spec.ranks_per_actor
        if ranks > 1:  # rank 0 of a process group of ``ranks`` (helpers are its child processes)
            from vidtune.search.parallel_worker import ParallelTrialWorker

            cls = self.ray.remote(num_gpus=self.num_gpus_per_actor, num_cpus=1, max_restarts=0)(ParallelTrialWorker)
            return cls.remote(WorkerSpec(**self.spec.worker), ranks, self.spec.trial_timeout_s)
        cls = self.ray.remote(num_gpus=self.num_gpus_per_actor, num_cpus=1, max_restarts=0)(TrialWorker)
        return cls.remote(WorkerSpec(**self.spec.worker))

    def get(self, ref: Any) -> Any:
        """``ray.get`` in half-second polls that a stop signal interrupts (``check_stop``)."""
        while True:
            ready, _ = self.ray.wait([ref], num_returns=1, timeout=0.5)
            check_stop()
            if ready:
                return self.ray.get(ref)

    def wait(self, refs: list[Any], timeout: float | None = None) -> list[Any]:
        """The refs of ``refs`` ready within ``timeout`` (None: at least one), polled like ``get``."""
        end = None if timeout is None else time.time() + timeout
        while True:
            step = 0.5 if end is None else max(0.0, min(0.5, end - time.time()))
            ready, _ = self.ray.wait(list(refs), num_returns=1, timeout=step)
            check_stop()
            if ready or (end is not None and time.time() >= end):
                return ready

    def _kill(self, actor: Any) -> None:
        try:
            self.ray.kill(actor)
        except Exception:  # already dead (the reason it is being replaced)
            return

    def replace(self, actor: Any) -> Any:
        self._kill(actor)
        new = self._new_actor()
        self.actors[self.actors.index(actor)] = new
        return new

    def shutdown(self) -> None:
        for a in self.actors:
            self._kill(a)
        if self.owns_ray:
            self.ray.shutdown()


class Campaign:
    """Run or resume a campaign: baseline, per-family studies, integrator, export."""

    def __init__(self, spec: CampaignSpec, log: Any = None) -> None:
        self.spec = spec
        # progress goes to stderr: stdout carries the command's JSON result
        self.log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        self.dir = spec.directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.trials_log = self.dir / "trials.jsonl"

    # ------------------------------------------------------------------ studies
    def _studies(self, check_only: bool = False) -> dict[str, Any]:
        import optuna

        from vidtune.model import GenerationRequest

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = storage_for(self.spec, self.log)
        studies = {}
        if check_only:
            existing = {s.study_name for s in optuna.get_all_study_summaries(storage)}
            req = GenerationRequest.from_dict(self.spec.worker["request"])
            for family in self.spec.families:
                name = f"{self.spec.name}:{family}"
                if name in existing:
                    check_search_space(optuna.load_study(study_name=name, storage=storage), family, req)
            return {}
        for family in self.spec.families:
            study = optuna.create_study(study_name=f"{self.spec.name}:{family}", storage=storage,
                                        directions=["minimize", "maximize"], load_if_exists=True)
            # the quality gate reaches the sampler as the trials' constraints (``set_constraints``)
            study.sampler = family_sampler(self.spec.seed, family, len(study.trials))
            study.set_metric_names(["latency_ms", "psnr_db"])
            self._requeue_interrupted(study, family)
            studies[family] = study
        return studies

    def _requeue_interrupted(self, study: Any, family: str) -> None:
        """Trials left RUNNING by a killed campaign: FAIL (interrupted) and queued again, same params."""
        import optuna

        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            lease = t.user_attrs.get("lease_until")
            if isinstance(lease, (int, float)) and lease > time.time():  # an agent's (vidtune ask), still live
                self.log(f"[{family}] trial {t.number} is leased to an agent until "
                         f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(lease))}: left to it")
                continue
            study._storage.set_trial_user_attr(t._trial_id, "reason", "interrupted")
            study._storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
            params = {k: v for k, v in t.params.items()}
            if not params:  # killed between ask and sampling: nothing to repeat, a fresh trial is the same
                self.log(f"[{family}] trial {t.number} was interrupted before its setting was sampled")
                continue
            # (killed while sampling: the sampled part is fixed, the rest is sampled again)
            study.enqueue_trial(params, user_attrs={"requeued_from": t.number}, skip_if_exists=False)
            self.log(f"[{family}] trial {t.number} was interrupted: re-queued")

    def _worker_device(self) -> str | None:
        """The device the trial actors run on (for device-dependent knob checks), when it is known."""
        device = (self.spec.worker or {}).get("device")
        return None if device in (None, "auto") else device

    @staticmethod
    def _counted(study: Any) -> int:
        """Trials that count against the budget: finished ones, not the interrupted."""
        import optuna

        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL))
        return sum(1 for t in done if t.user_attrs.get("reason") != "interrupted")

    # ------------------------------------------------------------------ records
    def _append(self, record: dict[str, Any]) -> None:
        with open(self.trials_log, "a") as f:
            f.write(json.dumps(record, default=str) + "\n")

    def _tell(self, study: Any, trial: Any, family: str, result: dict[str, Any]) -> None:
        import optuna

        base = {"family": family, "trial": trial.number, "params": trial.params, "time": time.time()}
        if result.get("status") == "ok":
            q = result["quality"]
            constraints = self.spec.gate.constraints(q)
            for key in ("latency", "quality", "stats", "knobs", "start_stage", "total_ms"):
                if key in result:  # an externally told result may carry only total_ms and quality
                    trial.set_user_attr(key, result[key])
            trial.set_user_attr("constraints", constraints)
            trial.set_user_attr("feasible", all(c <= 0 for c in constraints))
            set_constraints(trial, constraints)
            study.tell(trial, [result["total_ms"], q["psnr_db"]])
            self._append({**base, **{k: v for k, v in result.items() if k != "traceback"}, "constraints": constraints})
        else:
            trial.set_user_attr("reason", result.get("reason", "error"))
            trial.set_user_attr("message", result.get("message", ""))
            trial.set_user_attr("knobs", result.get("knobs", {}))
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            self._append({**base, **{k: v for k, v in result.items() if k != "traceback"}})

    # ------------------------------------------------------------------ main loop
    def run(self) -> dict[str, Any]:
        """The whole campaign; returns a summary (also written to ``campaign.json``). A second run of the
        same campaign while this one lives raises ``CampaignBusy`` before it touches anything."""
        with campaign_lock(self.spec.directory), _StopOnSignals() as signals, _search_plan(self.spec):
            return self._run(signals)

    def _run(self, signals: _StopOnSignals | None = None) -> dict[str, Any]:
        from vidtune.techniques.registry import check_request

        save_spec(self.spec)
        self._studies(check_only=True)  # a resumed campaign's search space still fits, before any model work
        pool = _Pool(self.spec)
        if signals is not None:
            signals.install()  # (over the handler ray.init installed)
        ray = pool.ray
        try:
            baseline = pool.get(pool.actors[0].ensure_baseline.remote())
            self.log(f"baseline {'reused' if baseline['reused'] else 'computed'}: {baseline['total_ms']:.1f} ms "
                     f"(key {baseline['key'][:12]})")
            for actor in pool.actors[1:]:
                pool.get(actor.ping.remote())
            studies = self._studies()
            request = pool.spec.worker["request"]
            from vidtune.model import GenerationRequest

            req = GenerationRequest.from_dict(request)
            in_flight: dict[Any, tuple] = {}  # ref -> (family, trial, actor, started)
            free = list(pool.actors)
            started_at = time.time()
            durations: list[float] = []

            exhausted: set[str] = set()  # families whose sampler only proposes no-ops

            def budget_left() -> bool:
                return any(self._counted(s) < self.spec.trials_per_family for f, s in studies.items() if f not in exhausted)

            while True:
                # fill free actors, round-robin over families that still have budget
                for family, study in studies.items():
                    if not free:
                        break
                    pending = sum(1 for f, *_ in in_flight.values() if f == family)
                    if family in exhausted or self._counted(study) + pending >= self.spec.trials_per_family:
                        continue
                    trial, setting, skipped = ask_effective(study, family, req)
                    if skipped:
                        self.log(f"[{family}] {skipped} sampled setting(s) changed nothing for this request or were "
                                 f"measured already: skipped")
                    if trial is None:
                        self.log(f"[{family}] the sampler proposes only no-op or measured settings: the family's search stops")
                        exhausted.add(family)
                        continue
                    try:
                        # names, values, seams, request- and device-dependent limits
                        check_request(setting, req, self._worker_device())
                    except Exception as exc:  # invalid before any GPU work
                        from vidtune.search.worker import failure_reason

                        kind, msg = failure_reason(exc)
                        self._tell(study, trial, family, {"status": "fail", "reason": kind, "message": msg, "knobs": setting})
                        continue
                    actor = free.pop()
                    in_flight[actor.evaluate.remote(setting)] = (family, trial, actor, time.time(), setting)
                if not in_flight:
                    if budget_left():
                        continue  # only invalid samples this round: sample again (they count as trials)
                    break
                deadline = min(t0 for _, _, _, t0, _ in in_flight.values()) + self.spec.trial_timeout_s
                ready = pool.wait(list(in_flight), timeout=max(0.0, min(1.0, deadline - time.time())))
                now = time.time()
                for ref in ready:
                    family, trial, actor, t0, setting = in_flight.pop(ref)
                    try:
                        result = ray.get(ref)
                    except Exception as exc:  # the actor died: record, replace
                        result = {"status": "fail", "reason": "actor-died", "message": str(exc)[:500], "knobs": setting}
                        actor = pool.replace(actor)
                    if now - t0 > self.spec.trial_timeout_s:  # finished, but past its time limit
                        result = {"status": "fail", "reason": "timeout", "knobs": setting,
                                  "message": f"took {now - t0:.2f} s, limit {self.spec.trial_timeout_s} s"}
                    self._tell(studies[family], trial, family, result)
                    durations.append(now - t0)
                    free.append(actor)
                    self._progress(studies, durations, len(pool.actors), started_at)
                for ref, (family, trial, actor, t0, setting) in list(in_flight.items()):
                    if now - t0 > self.spec.trial_timeout_s:
                        in_flight.pop(ref)
                        self._tell(studies[family], trial, family, {"status": "fail", "reason": "timeout", "knobs": setting,
                                                                    "message": f"exceeded {self.spec.trial_timeout_s} s"})
                        free.append(pool.replace(actor))
            survivors = {f: self.survivors(s) for f, s in studies.items()}
            from vidtune.integrator.combine import integrate

            outcome = integrate(self, pool, survivors, baseline)
            summary = {"campaign": self.spec.name, "baseline": baseline, "survivors": survivors, **outcome}
            (self.dir / "campaign.json").write_text(json.dumps(summary, indent=2, default=str))
            from vidtune.integrator.report import build_report

            summary["report"] = str(build_report(self.dir))
            self.log(f"report: {summary['report']}")
            return summary
        finally:
            pool.shutdown()

    def survivors(self, study: Any) -> list[dict[str, Any]]:
        """The family's feasible Pareto front (latency down, PSNR up) as knob settings with scores."""
        import optuna

        done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                if t.user_attrs.get("feasible")]
        front = []
        for t in done:
            lat, psnr = t.values
            dominated = any(o.values[0] <= lat and o.values[1] >= psnr and (o.values[0] < lat or o.values[1] > psnr)
                            for o in done)
            if not dominated and t.user_attrs.get("knobs"):
                front.append({"trial": t.number, "knobs": t.user_attrs["knobs"], "total_ms": lat, "psnr_db": psnr})
        return sorted(front, key=lambda x: x["total_ms"])

    def _progress(self, studies: dict[str, Any], durations: list[float], actors: int, started: float) -> None:
        parts, remaining = [], 0
        for family, study in studies.items():
            n = self._counted(study)
            remaining += max(0, self.spec.trials_per_family - n)
            best = self.survivors(study)
            best_txt = f"best {best[0]['total_ms']:.1f} ms @ {best[0]['psnr_db']:.1f} dB" if best else "no feasible yet"
            parts.append(f"{family} {n}/{self.spec.trials_per_family} ({best_txt})")
        eta = (sum(durations) / len(durations)) * remaining / max(1, actors) if durations else float("nan")
        self.log(" | ".join(parts) + f" | ETA {eta:.0f} s, elapsed {time.time() - started:.0f} s")


def spec_summary(spec: CampaignSpec) -> dict[str, Any]:
    d = asdict(spec)
    d["gate"] = asdict(spec.gate)
    return d


# ---------------------------------------------------------------------- agents: ask / tell
def save_spec(spec: CampaignSpec) -> Path:
    """Write ``campaign_spec.json`` so ``vidtune ask``/``tell``/``report`` can find the studies and gate."""
    spec.directory.mkdir(parents=True, exist_ok=True)
    path = spec.directory / "campaign_spec.json"
    path.write_text(json.dumps(spec_summary(spec), indent=2, default=str))
    return path


def load_spec(directory: Path) -> CampaignSpec:
    path = Path(directory) / "campaign_spec.json"
    if not path.is_file():
        raise ValueError(f"campaign {str(directory)!r} has no campaign_spec.json: run `vidtune campaign name=...` first")
    d = json.loads(path.read_text())
    d["gate"] = Gate(**d["gate"])
    d["families"] = tuple(d["families"])
    return CampaignSpec(**d)


def _study(spec: CampaignSpec, family: str) -> Any:
    import optuna

    if family not in spec.families:
        raise ValueError(f"--family must be one of the campaign's families {list(spec.families)}, got {family!r}")
    return optuna.load_study(study_name=f"{spec.name}:{family}", storage=storage_for(spec))


def ask_trial(spec: CampaignSpec, family: str, lease_s: float = 3600.0) -> dict[str, Any]:
    """Ask the family's study for the next setting (the trial stays RUNNING until told). The trial is leased
    for ``lease_s`` seconds: a campaign resumed meanwhile leaves it to the agent (``lease_until``)."""
    from vidtune.model import GenerationRequest

    study = _study(spec, family)
    with _search_plan(spec):  # the same choices as the campaign's own trials
        trial, setting, _ = ask_effective(study, family, GenerationRequest.from_dict(spec.worker["request"]))
    if trial is None:
        raise ValueError(f"family {family!r}: the sampler proposes only settings that change nothing for this request")
    trial.set_user_attr("asked_by", "agent")
    lease_until = time.time() + lease_s
    trial.set_user_attr("lease_until", lease_until)
    return {"campaign": spec.name, "family": family, "trial": trial.number, "knobs": setting,
            "lease_until": time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(lease_until))}


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
    trial = optuna.trial.Trial(study, frozen._trial_id)
    Campaign(spec, log=lambda *_: None)._tell(study, trial, f, {"knobs": result.get("knobs", {}), **result})
    return {"family": f, "trial": number, "state": study.trials[number].state.name}
