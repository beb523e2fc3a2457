"""The campaign's pool of Ray actors: one per GPU (or one on the CPU), each keeping the pipeline built; a
timed-out or dead actor is killed and replaced; trials that compile go to the actor holding their graphs."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any, Callable

from vidtune._compat import usable_cores
from vidtune.search.campaign import CampaignSpec, check_stop
from vidtune._compat import actor_threads

__all__ = ["ActorPool", "actor_key", "pick_actor"]


class ActorPool:
    """Ray actors evaluating trials; a timed-out or dead actor is killed and replaced."""

    def __init__(self, spec: CampaignSpec) -> None:
        # docs/environment.md: with this variable a local Ray binds 127.0.0.1 only; no auth token file. Ray reads
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

        gpus = torch.cuda.device_count() if str(spec.worker.device).startswith("cuda") else 0
        ranks = spec.ranks_per_actor
        if gpus and ranks > gpus:
            raise ValueError(f"ray.ranks_per_actor={ranks} needs {ranks} GPUs per actor; this machine has {gpus}")
        self.num_gpus_per_actor = ranks if gpus else 0
        n = spec.num_actors or max(1, gpus // ranks)
        # torch's CPU threads in each actor (Ray starts one of num_cpus=1 with 1): a local Ray's actors share this
        # host's cores; on a cluster each actor takes its node's share (its cores over its GPUs)
        self.threads = actor_threads(n) if not spec.ray_address else -1
        self.actors = [self._new_actor() for _ in range(n)]

    def _init_ray(self) -> None:
        ray = self.ray
        self.owns_ray = not ray.is_initialized()
        if not self.owns_ray:
            return
        if self.spec.ray_address:
            ray.init(address=self.spec.ray_address, logging_level="ERROR", log_to_driver=False)
        else:
            init_local_ray(ray)

    def _new_actor(self) -> Any:
        from vidtune.search.worker import TrialWorker

        ranks = self.spec.ranks_per_actor
        if ranks > 1:  # rank 0 of a process group of ``ranks`` (helpers are its child processes)
            from vidtune.search.parallel_worker import ParallelTrialWorker

            cls = self.ray.remote(num_gpus=self.num_gpus_per_actor, num_cpus=1, max_restarts=0)(ParallelTrialWorker)
            return cls.remote(dataclasses.replace(self.spec.worker, progress_file=str(self.progress_file)), ranks,
                              self.spec.trial_timeout_s)
        cls = self.ray.remote(num_gpus=self.num_gpus_per_actor, num_cpus=1, max_restarts=0)(TrialWorker)
        return cls.remote(self._worker_spec())

    def _worker_spec(self) -> Any:
        return dataclasses.replace(self.spec.worker, progress_file=str(self.progress_file), threads=self.threads)

    def adopt(self, spec: CampaignSpec) -> "ActorPool":
        """This pool's actors serve ``spec``'s campaign, each worker made anew for it (``TrialWorker.configure``:
        models loaded again, no compiled graph, as in a new process, without a process's start): for a caller
        running several campaigns in one process (the Python API, the test suite), where an actor's start (torch,
        ltx-core and transformers imported) is ~7 s of a small campaign's ~25 s on 2 CPU cores. The campaign
        must fit the pool: the same cluster, device, actor count and ranks (a ValueError says what differs). A
        dead actor is replaced."""
        n = spec.num_actors or len(self.actors)
        mine = (self.spec.ray_address, self.spec.ranks_per_actor, str(self.spec.worker.device), len(self.actors))
        theirs = (spec.ray_address, spec.ranks_per_actor, str(spec.worker.device), n)
        if mine != theirs or spec.ranks_per_actor > 1:
            raise ValueError(f"this pool (ray.address, ranks_per_actor, device, actors) {mine} cannot serve a "
                             f"campaign of {theirs} (a pool of parallel ranks is not adopted)")
        self.spec = spec
        for actor in list(self.actors):
            try:
                self.ray.get(actor.configure.remote(self._worker_spec()))
            except Exception:  # (dead: its campaign killed it for a timeout, or its process died)
                self.replace(actor)
        return self

    @property
    def progress_file(self) -> Path:
        """Where the actors append their progress lines (the baseline's generations); the driver shows them."""
        return self.spec.directory / "progress.log"

    def get(self, ref: Any, tick: Callable[[], None] | None = None) -> Any:
        """``ray.get`` in half-second polls that a stop signal interrupts (``check_stop``); ``tick`` runs at
        each poll (the baseline's progress lines)."""
        while True:
            ready, _ = self.ray.wait([ref], num_returns=1, timeout=0.5)
            check_stop()
            if tick is not None:
                tick()
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

    def wait_baseline_mp4(self, log: Callable[[str], None]) -> None:
        """At the normal end of a campaign: let the first actor finish the baseline's MP4 (written in the
        background) before the actors are killed. Not on a stop or an error: the wait would queue behind a
        running trial, and the baseline itself is whole without its MP4."""
        try:
            if not self.ray.get(self.actors[0].wait_baseline_files.remote(600.0), timeout=660):
                log("baseline: its MP4 was not finished after 600 s; left out")
        except Exception as exc:  # a dead actor, or the MP4's encode failed
            log(f"baseline: its MP4 is missing ({type(exc).__name__}: {str(exc)[:200]}); the baseline itself is whole")

    def shutdown(self) -> None:
        for a in self.actors:
            self._kill(a)
        if self.owns_ray:
            self.ray.shutdown()


def init_local_ray(ray: Any) -> None:
    """Start the local Ray instance a campaign without ``ray.address`` runs its actors on. A caller that starts it
    first (a test module running many campaigns: 4.5 s of start and 1.2 s of shutdown each on a 2-core CPU) keeps
    it: a pool that did not start Ray leaves it running."""
    # address="local": always a new instance of its own. Without it Ray joins a cluster it finds running on this
    # machine (`ray start`), and with num_cpus given refuses to (seen: a campaign started while the scale-out
    # test's head ran on the same machine failed in ray.init)
    ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             _node_ip_address="127.0.0.1", num_cpus=max(2, usable_cores()))


def actor_key(actor: Any) -> Any:
    actor_id = getattr(actor, "_actor_id", None)
    return actor_id.hex() if actor_id is not None else id(actor)


def pick_actor(free: list[Any], signature: str | None, compiled: dict[Any, str]) -> Any:
    """Take the free actor a job should run on: for a job that compiles (``signature``), the actor that ran
    that compiled configuration last (its graphs are in its process: no compile), else one that holds no
    compiled configuration (keeping the others' for their kind); a job that compiles nothing goes to an
    actor without compiled graphs where there is one. A replaced actor holds nothing (its key is new)."""
    def holds(actor: Any) -> str | None:
        return compiled.get(actor_key(actor))

    choice = None
    if signature is not None:
        choice = next((a for a in free if holds(a) == signature), None)
    if choice is None:
        choice = next((a for a in reversed(free) if holds(a) is None), None)
    if choice is None:
        choice = free[-1]
    free.remove(choice)
    return choice
