"""The commands that run the pipeline once or a few times: ``knobs``, ``generate``, ``baseline``, ``evaluate``,
``calibrate``, ``parallel-check`` (and the helpers ``bench`` shares)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from vidtune.provenance import provenance
from vidtune.settings import CliError, Settings, knob_values, load_config

if TYPE_CHECKING:
    from vidtune.techniques.setting import Setting

__all__ = ["cmd_knobs", "cmd_generate", "cmd_baseline", "cmd_evaluate", "cmd_calibrate", "cmd_parallel_check",
           "tuned_knobs", "trial_worker", "warn"]


def cmd_knobs(args: argparse.Namespace) -> int:
    from vidtune.techniques import FAMILIES, registered

    techniques = [t.describe() for t in registered()]
    if args.json:
        print(json.dumps({"families": list(FAMILIES), "techniques": techniques}, indent=2))
        return 0
    for family in FAMILIES:
        members = [t for t in techniques if t["family"] == family]
        print(f"{family}: {len(members)} technique(s)")
        for t in members:
            print(f"  {t['name']}  stages={','.join(t['stages'])}  seams={','.join(t['seams'])}")
            for knob, d in t["knobs"].items():
                dom = d.get("choices") or f"[{d.get('low')}, {d.get('high')}]{' log' if d.get('log') else ''}"
                print(f"    {knob}: {d['kind']} {dom} off={d['off']!r}  {d.get('help', '')}")
    return 0


def tuned_knobs(args: argparse.Namespace, settings: Settings) -> Setting | None:
    """Knobs of ``--config tuned.yaml`` (validated: registry, model; a device mismatch warns)."""
    if not getattr(args, "config", None):
        return None
    import torch

    from vidtune.integrator.tuned import TunedConfigError, load_tuned_config

    device = settings.device
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else None
    try:
        doc = load_tuned_config(args.config, settings.source, name, settings.request, any_request=args.any_request,
                                allow_rejected=args.allow_rejected)
    except TunedConfigError as exc:
        raise CliError(str(exc)) from None
    if getattr(args, "config_notes", None) is None:  # (validated once before the model, used again after)
        for note in doc["notes"]:
            print(f"vidtune: note: {note}", file=sys.stderr)
    args.config_notes = doc["notes"]
    return doc["knobs"]


def trial_worker(settings: Settings, nproc: int) -> Any:
    """A trial worker for this model and request: in this process, or rank 0 of ``nproc`` processes
    (one GPU each under NCCL, else gloo on the CPU) that run every command together (SPMD)."""
    from vidtune.search.worker import TrialWorker, WorkerSpec

    spec = WorkerSpec(**settings.worker_spec())
    if nproc > 1:
        from vidtune.search.parallel_worker import ParallelTrialWorker

        return ParallelTrialWorker(spec, nproc)
    return TrialWorker(spec)


def warn(stats: dict[str, Any]) -> list[str]:
    """Techniques' warnings in a run's records (e.g. tile_parallel with fewer tiles than ranks), also on stderr."""
    found = [str(v["warning"]) for v in stats.values() if isinstance(v, dict) and "warning" in v]
    for w in found:
        print(f"warning: {w}", file=sys.stderr)
    return found


def cmd_generate(args: argparse.Namespace, settings: Settings) -> int:
    from vidtune.techniques.parallelism.distributed import init_from_env, launch

    if args.nproc > 1:
        # SPMD: every rank builds the model and runs the request; rank 0 writes the files.
        summaries = launch(_generate_rank, args.nproc, list(args.overrides), list(args.knobs), args.config,
                           (args.any_request, args.allow_rejected))
        print(json.dumps({**summaries[0], "provenance": provenance(settings, args.argv)}, indent=2))
        return 0
    init_from_env()  # under torchrun: join its world (no-op otherwise)
    summary = _generate(args.overrides, args.knobs, args.config, (args.any_request, args.allow_rejected))
    if summary is not None:
        print(json.dumps({**summary, "provenance": provenance(settings, args.argv)}, indent=2))
    return 0


def _generate_rank(rank: int, world: int, overrides: list[str], knobs: list[str], config: str | None,
                   flags: tuple[bool, bool]) -> Any:
    return _generate(overrides, knobs, config, flags)


def _generate(overrides: Sequence[str], knob_items: Sequence[str], config: str | None,
              flags: tuple[bool, bool] = (False, False)) -> dict[str, Any] | None:
    """Generate once in this process (one rank of a world, or alone); the summary on rank 0, else None."""
    import torch.distributed as dist

    from vidtune.model.media import write_mp4, write_raw
    from vidtune.search.stages import run_from
    from vidtune.techniques import compose

    settings = Settings(load_config(overrides))
    # (the notes were printed when main validated the config; config_notes=[] keeps them from a second print)
    tuned = argparse.Namespace(config=config, any_request=flags[0], allow_rejected=flags[1], config_notes=[])
    knobs = tuned_knobs(tuned, settings)
    if knobs is None:
        knobs = knob_values(knob_items)
    pipeline = settings.pipeline()
    with compose(pipeline, knobs):
        out, times = run_from(pipeline, settings.request, "stage1", None)
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    folder = Path(settings.cfg.out) if settings.cfg.out else settings.results / "generate"
    mp4 = write_mp4(folder / "video.mp4", out.frames, settings.request.fps, out.audio, out.sample_rate)
    raw = write_raw(folder / "output.safetensors", out.frames, out.audio, out.sample_rate, settings.request.fps)
    return {"video": str(mp4), "raw": str(raw), "frames": list(out.frames.shape),
            "audio": list(out.audio.shape), "sample_rate": out.sample_rate,
            "latency_ms": {k: round(v, 3) for k, v in times.items()},
            "stats": json.loads(json.dumps(pipeline.run_stats(), default=str)), "config_notes": tuned.config_notes}


def cmd_parallel_check(args: argparse.Namespace) -> int:
    from vidtune.benchmarks.parallel_check import main as check_main

    if args.nproc < 2:
        raise CliError(f"--nproc must be >= 2 for a parallel check, got {args.nproc}")
    return check_main(args.preset, args.nproc, args.height, args.width, args.frames)


def cmd_baseline(args: argparse.Namespace, settings: Settings) -> int:
    from vidtune.search.evaluator import ensure_baseline

    pipeline = settings.pipeline()
    # (a person asked for this baseline: its MP4 is written unless eval.baseline_mp4=false)
    base, reused = ensure_baseline(pipeline, settings.request, settings.source, settings.results / "baseline",
                                   repeats=settings.repeats, warmup=settings.warmup, force=args.force,
                                   mp4=settings.baseline_mp4 is not False,
                                   say=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps({"baseline": str(base.directory), "key": base.key, "reused": reused,
                      "latency_ms": {s: round(v["median_ms"], 3) for s, v in base.latency.items()},
                      "provenance": provenance(settings, args.argv)}, indent=2))
    return 0


def cmd_calibrate(args: argparse.Namespace, settings: Settings) -> int:
    from vidtune.benchmarks.calibrate import markdown, run_calibration, write

    pipeline = settings.pipeline()
    model = settings.source.preset or Path(settings.source.checkpoint or "checkpoint").stem
    out = Path(args.out) if args.out else Path(settings.cfg.results_dir) / "calibration" / model
    result = run_calibration(pipeline, settings.request, settings.source, settings.results / "baseline",
                             flip_frames=settings.flip_frames,  # (0: FLIP left out, its rows 'not measured')
                             say=lambda line: print(line, file=sys.stderr, flush=True))
    result["provenance"] = provenance(settings, args.argv)
    write(result, out)
    print(markdown(result))
    return 0


def cmd_evaluate(args: argparse.Namespace, settings: Settings) -> int:

    knobs = knob_values(args.knobs)
    # the same trial worker as bench and the campaign: in this process, or rank 0 of --nproc processes
    # that all run the evaluation (SPMD) while rank 0 reports
    worker = trial_worker(settings, args.nproc)
    try:
        info = worker.ensure_baseline()
        record = worker.evaluate(knobs)
    finally:
        worker.close()
    from vidtune.search.records import Status

    if record["status"] != Status.OK:
        where = f" on {args.nproc} processes" if args.nproc > 1 else ""
        raise CliError(f"the evaluation failed{where} ({record['reason']}): {record['message']}")
    base_latency, reused, noise_floor, base_dir = info["latency"], info["reused"], info["noise_floor"], info["directory"]
    summary = evaluation_summary(record)
    base_total = sum(v["median_ms"] for v in base_latency.values())
    total = record["total_ms"]
    summary.update(knobs=dict(record["knobs"]), baseline_total_ms=round(base_total, 3), baseline_reused=reused,
                   speedup=round(base_total / total, 4) if total else None, stats=record["stats"], nproc=args.nproc,
                   warnings=warn(record["stats"]), provenance=provenance(settings, args.argv))
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
        return 0
    q = record["quality"]
    print(f"start stage: {record['start_stage']}   (baseline {'reused' if reused else 'computed'}: {base_dir})"
          + (f"   ({args.nproc} processes, timed on rank 0)" if args.nproc > 1 else ""))
    for stage, v in record["latency"].items():
        b = base_latency.get(stage, {}).get("median_ms")
        print(f"  {stage:13s} {v['median_ms']:10.2f} ms  [{v['min_ms']:.2f}, {v['max_ms']:.2f}] x{v['repeats']} "
              f"({v.get('source', 'measured')})  baseline {b:.2f} ms" if b is not None else "")
    # Not interleaved: the baseline's latency was measured when it was stored. For a ratio to quote,
    # measure both in one process, interleaved (vidtune bench).
    print(f"  total         {total:10.2f} ms  baseline {base_total:.2f} ms  "
          f"ratio x{summary['speedup']} (vs stored baseline timing, not interleaved)")
    if noise_floor:
        print(f"  noise floor ({noise_floor['setting']}): PSNR {noise_floor['quality']['psnr_db']:.2f} dB, "
              f"SSIM {noise_floor['quality']['ssim']:.4f}, audio SNR {noise_floor['quality']['audio_snr_db']:.2f} dB")
    print(f"  quality: PSNR {q['psnr_db']:.2f} dB (worst frame {q['psnr_db_worst']:.2f}), SSIM {q['ssim']:.4f}, "
          f"audio SNR {q['audio_snr_db']:.2f} dB, identical={q['identical']}")
    return 0


def evaluation_summary(rec: Mapping[str, Any]) -> dict[str, Any]:
    """Compact dict for printing an evaluation's record (``Evaluation.record()``, or a worker's):
    per-stage medians, total, quality."""
    return {
        "start_stage": rec["start_stage"],
        "latency_ms": {s: round(v["median_ms"], 3) for s, v in rec["latency"].items()},
        "total_ms": round(rec["total_ms"], 3),
        "quality": dict(rec["quality"]) if rec["quality"] else None,
    }
