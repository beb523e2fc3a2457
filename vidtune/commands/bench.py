"""``vidtune bench``: a tuned config (or ``--knobs``) re-measured interleaved with the baseline in one process."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any, Sequence

from vidtune.settings import CliError, Settings, knob_values
from vidtune.commands.run import trial_worker, tuned_knobs, warn
from vidtune.provenance import provenance

if TYPE_CHECKING:
    from vidtune.techniques.setting import Setting

__all__ = ["cmd_bench"]


def _also_settings(items: Sequence[str]) -> dict[str, Setting]:
    """Parse ``bench --also NAME:KNOB=VALUE,...`` (each validated as ``--knobs``) before any model is built."""
    import re

    out: dict[str, Setting] = {}
    for item in items:
        name, sep, rest = item.partition(":")
        if not sep or not re.fullmatch(r"[A-Za-z0-9_-]+", name) or name in ("A", "B") or not rest.strip():
            raise CliError(f"--also must be NAME:KNOB=VALUE[,KNOB=VALUE...] with NAME of letters, digits, _ and - "
                           f"(not A or B: the baseline and the setting), got {item!r}")
        if name in out:
            raise CliError(f"--also: the name {name!r} is given twice")
        out[name] = knob_values([kv for kv in rest.split(",") if kv])
    return out


def cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    knobs = tuned_knobs(args, settings)
    if knobs is None:
        if not args.knobs:
            raise CliError("bench needs --config tuned.yaml or --knobs FAMILY.TECHNIQUE.KNOB=VALUE ...")
        knobs = knob_values(args.knobs)
    others = _also_settings(args.also)

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    t0 = time.time()
    say(f"bench: building the pipeline on {args.nproc} process{'es' if args.nproc > 1 else ''}")
    worker = trial_worker(settings, args.nproc)
    worker.progress = say
    try:
        if args.reference == "stored":
            say(f"bench: pipeline built in {time.time() - t0:.1f} s; baseline (run or reused)")
            info = worker.ensure_baseline()
            say(f"bench: baseline {'reused' if info['reused'] else 'computed'} at {time.time() - t0:.1f} s; "
                f"{args.repeats} repeats of baseline and setting alternated")
        else:
            say(f"bench: pipeline built in {time.time() - t0:.1f} s; no stored baseline (--reference run)")
            worker.ensure_quality_baseline()
        res = worker.bench(knobs, args.repeats, rewarm=args.rewarm, reference=args.reference, others=others)
    finally:
        worker.close()
    where = "one process" if args.nproc == 1 else f"{args.nproc} processes, timed on rank 0 across the group"
    for stage, v in res["stages"].items():
        ratio = f"x{v['speedup']:.3f}" if v["speedup"] else "-"
        say(f"bench: {stage:13s} baseline {v['baseline_ms']:10.1f} ms  setting {v['tuned_ms']:10.1f} ms  {ratio}")
    for name, o in res["others"].items():
        say(f"bench: {name}: x{o['speedup']:.3f} (" + ", ".join(
            f"{stage} x{v['speedup']:.2f}" for stage, v in o["stages"].items() if v["speedup"]) + ")")
    print(json.dumps({"speedup": round(res["speedup"], 4), "baseline_total_ms": res["baseline_total_ms"],
                      "tuned_total_ms": res["tuned_total_ms"], "stages": res["stages"], "order": res["order"],
                      "warmup_s": res["warmup_s"], "warmup": res["warmup"], "rewarm": res["rewarm"],
                      "graphs_compiled_while_timed": res["graphs_compiled_while_timed"],
                      "quality": res["quality"], "reference": res["reference"], "knobs": knobs,
                      "nproc": args.nproc, "stats": res["stats"], "warnings": warn(res["stats"]),
                      "config_notes": getattr(args, "config_notes", None) or [],
                      "others": {name: {**o, "speedup": round(o["speedup"], 4), "warnings": warn(o["stats"])}
                                 for name, o in res["others"].items()},
                      "method": f"baseline and tuned alternated ({where}), median totals",
                      "provenance": provenance(settings, args.argv)}, indent=2, default=str))
    return 0
