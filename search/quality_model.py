"""The quality model beside a trial: a setting mapped to it (``quality_setting``, ``geometry``), what the mapping
cannot measure there, and the quality model's worker in a process of its own (``QualityProcess``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from vidtune.techniques.setting import Setting, SettingLike

__all__ = ["QualitySpec", "model_source", "quality_size", "geometry", "quality_setting", "unmeasured_on_quality_model", "QualityProcess", "QualityProcessError"]


@dataclass(frozen=True)
class QualitySpec:
    """The trained model a campaign measures its trials' quality on (``WorkerSpec.quality``), as a worker in another
    process rebuilds it. Built by vidtune/settings.py (``Settings.quality_spec``); stored in campaign_spec.json as
    its fields."""

    source: Any  # the quality model's ModelSource (a mapping of its fields is converted)
    request: Any  # its GenerationRequest: the campaign's request at the quality model's size (likewise)
    baseline_dir: str  # where its baselines are kept (shared by the campaigns of one results_dir)
    # the geometries a setting is mapped between (``geometry``): {"source": the campaign model's, "target": this one's}
    geometry: Mapping[str, Mapping[str, float]]
    concurrent: bool | None = None  # in a process of its own beside the trial (None: on a GPU, not on a CPU)

    @classmethod
    def of(cls, value: "QualitySpec | Mapping[str, Any] | None") -> "QualitySpec | None":
        """``value`` as a ``QualitySpec`` (a mapping of its fields, as campaign_spec.json holds it), or None."""
        if value is None or isinstance(value, QualitySpec):
            return value
        unknown = sorted(set(value) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"quality spec: unknown field(s) {unknown}; fields: {sorted(cls.__dataclass_fields__)}")
        from vidtune.model.request import GenerationRequest

        value = dict(value)
        return cls(**{**value, "source": model_source(value["source"]), "request": GenerationRequest.of(value["request"])})


def model_source(value: Any) -> Any:
    """``value`` as a ``ModelSource`` (a mapping of its fields, as JSON holds them: ``stg_blocks`` a list)."""
    from vidtune.model.loading import ModelSource

    if isinstance(value, ModelSource):
        return value
    fields = dict(value)
    if fields.get("stg_blocks") is not None:
        fields["stg_blocks"] = tuple(fields["stg_blocks"])
    return ModelSource(**fields)


QUALITY_LONG_SIDE = 768  # px: the default 512 px VAE tiles cut it, as they cut a 1536 px frame
QUALITY_FRAMES = 33


def quality_size(request: Any, qm: Any) -> dict[str, Any]:
    """``quality_model.{height,width,frames}``, ``auto`` resolved against the campaign's request: its frame
    scaled to a long side of at most 768 px (multiples of 64, the aspect kept) and at most 33 frames; a smaller
    request keeps its own size. Why: at 256x384x17 (height x width x frames) the mini scored FP8 on every linear
    + compile + the VAE decode knobs 36.9 dB (H200), and 768 px VAE tiles cut nothing there; at 512x768x33 FP8 on
    every linear with those tiles scored 47.9 dB (CPU, 2026-12-03), the tiles measured (the default's cut that
    frame), for ~3 s a generation on a CPU."""
    long_side = max(request.height, request.width)
    scale = min(1.0, QUALITY_LONG_SIDE / long_side)
    auto = {"height": max(64, round(request.height * scale / 64) * 64),
            "width": max(64, round(request.width * scale / 64) * 64),
            "frames": request.frames if request.frames <= QUALITY_FRAMES else QUALITY_FRAMES}
    return {k: auto[k] if qm.get(k, "auto") == "auto" else qm.get(k) for k in ("height", "width", "frames")}


def geometry(source: Any, request: Any) -> dict[str, float]:
    """What a setting's model- and size-dependent knobs are counted against (``transfer_setting``): the
    transformer's blocks, the frame's long side in pixels, the frame count."""
    from vidtune.model.memory import transformer_config

    return {"depth": float(transformer_config(source)["num_layers"]), "size": float(max(request.height, request.width)),
            "frames": float(request.frames)}


def quality_setting(knobs: SettingLike, quality: QualitySpec) -> tuple[Setting, list[str]]:
    """``knobs`` mapped to the quality model of a worker spec's ``quality`` (``transfer_setting`` by its
    geometry), without the parallelism family (it changes how the work is spread, not what is computed), and
    the notes of what changed; ``KnobError`` when the mapped setting is invalid there."""
    from vidtune.techniques.registry import get
    from vidtune.techniques.transfer import transfer_setting

    kept = {n: v for n, v in knobs.items() if not get(n).spreads_work_only}
    mapped, notes = transfer_setting(kept, quality.geometry["source"], quality.geometry["target"])
    if len(kept) < len(knobs):
        notes.append("parallelism knobs not applied on the quality model (one process; they do not change what "
                     "is computed)")
    return mapped, notes


def unmeasured_on_quality_model(knobs: SettingLike, mapped: Setting, request: Any,
                                quality_request: Any) -> list[str]:
    """The techniques of ``knobs`` that change this request's output but whose mapped setting changes nothing at
    the quality model's request (VAE tiles that cut a 1536 px frame and not a 384 px one): the quality model's
    numbers do not measure them, and the trial's record says so instead of passing them as exact."""
    from vidtune.techniques.registry import get

    out = []
    for name, values in mapped.items():
        tech = get(name)
        if name in knobs and tech.effective(tech.validate(knobs[name]), request) and not tech.effective(values, quality_request):
            q = quality_request
            out.append(f"{name} changes nothing at the quality model's {q.height}x{q.width}x{q.frames}: its effect on "
                       f"quality is not measured there (a larger quality_model request measures it)")
    return out


def _quality_process_main(conn: Any, worker_cls: Any, spec: Any, threads: int, parent: int, state: Any) -> None:
    """The body of a ``QualityProcess``: build the quality model's worker (a ``worker_cls``: ``TrialWorker``), then answer (command, args) with
    (True, value) or (False, message) until the pipe closes or the trial worker's process (``parent``) is gone."""
    import os
    import threading

    from vidtune._compat import enter_creator_state

    enter_creator_state(state)

    def orphaned() -> None:  # a trial worker killed at its timeout must not leave this process on the GPU
        while True:  # (its parent is the forkserver it was forked from: the trial worker is asked by its pid)
            time.sleep(1.0)
            try:
                os.kill(parent, 0)
            except ProcessLookupError:
                os._exit(0)

    threading.Thread(target=orphaned, daemon=True).start()
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    try:
        worker = worker_cls(spec)
    except BaseException as exc:
        conn.send((False, f"{type(exc).__name__}: {exc}"))
        return
    conn.send((True, "ready"))
    while True:
        try:
            command, args = conn.recv()
        except (EOFError, OSError):
            break
        try:
            conn.send((True, getattr(worker, command)(*args)))
        except BaseException as exc:
            conn.send((False, f"{type(exc).__name__}: {exc}"))
    worker.close()


class QualityProcessError(RuntimeError):
    """The quality model's process failed a call or ended."""


class QualityProcess:
    """The quality model's ``TrialWorker`` in a process of its own on the same device, so that its evaluation
    of a trial's mapped setting (a compile of the small model included) runs while this worker warms the
    setting up, instead of after it.

    Why: in the 19B campaign at 1536x1024x121 (results/campaigns/h200-19b-1536b) the quality model's
    evaluation, in this process after the trial, was nearly all of the per-trial framework overhead of the
    compiling trials (14 s and 26 s: 13.6% and 20.2% of the trial), since Dynamo compiles one graph at a
    time per process. ``TrialWorker.evaluate`` submits the quality run first and waits for it after its own
    warm-up (``evaluate(..., before_timing=...)``), so the two models never share the GPU in a timed run;
    what the trial waits there is its overhead (``timing.waited_s``).

    The same calls as a ``TrialWorker`` (``ensure_baseline``, ``evaluate``, ``wait_baseline_files``) block
    until answered; ``submit`` starts an ``evaluate`` and returns, ``wait`` blocks until its result is in.
    """

    def __init__(self, spec: Any, worker_cls: Any, threads: int = 0) -> None:
        import os

        from vidtune._compat import child_context, creator_state

        self.source, self.request = spec.source, spec.request
        ctx = child_context()
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_quality_process_main, args=(child, worker_cls, spec, threads, os.getpid(),
                                                                     creator_state()), daemon=True, name="vidtune-quality-model")
        self._proc.start()
        child.close()
        self._ready = False
        self._ended = False
        self._submitted: tuple | None = None  # the evaluate call in flight or answered, and its answer
        self._answer: tuple | None = None

    def alive(self) -> bool:
        return not self._ended and self._proc.is_alive()

    def _gone(self) -> QualityProcessError:
        self._ended = True
        self._proc.join(timeout=10)  # (its pipe closes before it has exited)
        return QualityProcessError(f"the quality model's process ended (exit code {self._proc.exitcode})")

    def _receive(self) -> Any:
        if self._ended:
            raise self._gone()
        while not self._conn.poll(1.0):
            if not self._proc.is_alive() and not self._conn.poll(0):
                raise self._gone()
        try:
            ok, value = self._conn.recv()
        except (EOFError, OSError):
            raise self._gone() from None
        if not self._ready:
            if not ok:
                raise QualityProcessError(f"the quality model could not be built: {value}")
            self._ready = True
            return self._receive()
        return ok, value

    def _settle(self) -> None:
        """Receive the answer of the call in flight, if any."""
        if self._submitted is not None and self._answer is None:
            self._answer = self._receive()

    def _call(self, command: str, *args: Any) -> Any:
        self._settle()
        self._submitted = self._answer = None
        self._conn.send((command, args))
        ok, value = self._receive()
        if not ok:
            raise QualityProcessError(f"the quality model's {command}: {value}")
        return value

    def submit(self, knobs: SettingLike, scoped: bool = True, repeats: int | None = None) -> None:
        """Start ``evaluate(knobs, scoped, repeats)`` there and return (an earlier call's answer is received
        and dropped first)."""
        self._settle()
        self._submitted, self._answer = (knobs, scoped, repeats), None
        self._conn.send(("evaluate", (knobs, scoped, repeats)))

    def wait(self) -> None:
        """Block until the submitted evaluation's answer is in."""
        self._settle()

    def evaluate(self, knobs: SettingLike, scoped: bool = True, repeats: int | None = None) -> dict[str, Any]:
        """The submitted evaluation's record when it is this call's, else a new evaluation."""
        if self._submitted == (knobs, scoped, repeats):
            self._settle()
            (ok, value), self._submitted, self._answer = self._answer, None, None
            if not ok:
                raise QualityProcessError(f"the quality model's evaluate: {value}")
            return value
        return self._call("evaluate", knobs, scoped, repeats)

    def ensure_baseline(self) -> dict[str, Any]:
        return self._call("ensure_baseline")

    def clip_quality(self, knobs: SettingLike, change: dict[str, Any]) -> dict[str, Any]:
        return self._call("clip_quality", knobs, change)

    def wait_baseline_files(self, timeout: float | None = None) -> bool:
        return self._call("wait_baseline_files", timeout)

    def close(self) -> None:
        """Let the process finish its files and end."""
        if self.alive():
            try:
                self._settle()  # (an answer still in flight: received, so the process is idle when the pipe closes)
            except QualityProcessError:  # it ended meanwhile: _gone() joined it, nothing left to wait for
                return
            self._conn.close()
            self._proc.join(timeout=120)
        if self._proc.is_alive():
            self._proc.terminate()
