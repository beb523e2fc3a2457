"""The ``vidtune`` command line.

    vidtune knobs [--json]
    vidtune generate  [hydra overrides...] [--knobs k=v ...]
    vidtune baseline  [hydra overrides...] [--force]
    vidtune evaluate  [hydra overrides...] --knobs kernel_choice.sdpa_backend.video_self=flash ... [--json]
    vidtune campaign  [hydra overrides...]          (e.g. families=[caching,tiling] budget.trials_per_family=20)
    vidtune generate  --config tuned.yaml [overrides]
    vidtune generate  --nproc 2 --knobs parallelism.guidance_parallel.degree=2 request.mode=multistep
    vidtune parallel-check --nproc 4                 (every parallel strategy vs one process)
    vidtune bench     --config tuned.yaml [overrides] [--repeats N] [--nproc N]
    vidtune bench     --knobs k=v ... [--nproc 2]     (any setting, interleaved with the baseline)
    vidtune evaluate  --nproc 2 --knobs parallelism.sequence_parallel.degree=2
    vidtune report <campaign> | signoff <campaign> --by NAME --verdict approve|reject --note TEXT
    vidtune ask <campaign> --family F | tell <campaign> --trial N --result result.json

Hydra overrides (``model=ltx2-19b request.seed=3 eval.repeats=5``) compose ``conf/``. Every input is
validated (request fields, knob names and values, technique conflicts) before a model is built; a bad
input exits with status 2 and a message naming the field and its allowed values.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from vidtune.commands.bench import cmd_bench
from vidtune.commands.campaign import cmd_ask, cmd_campaign, cmd_report, cmd_signoff, cmd_tell
from vidtune.commands.run import (cmd_baseline, cmd_calibrate, cmd_evaluate, cmd_generate, cmd_knobs,
                                  cmd_parallel_check, tuned_knobs)
from vidtune.settings import MAX_REPEATS, CliError, Settings, knob_values, load_config, quality_size

# `vidtune campaign` paused by budget.run_minutes (sysexits' EX_TEMPFAIL: run the same command again)
EXIT_PAUSED = 75

__all__ = ["main", "load_config", "Settings", "CliError", "quality_size"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vidtune", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    k = sub.add_parser("knobs", help="list every registered technique, its knobs, domains and off values")
    k.add_argument("--json", action="store_true", help="machine-readable output")
    for name, helptext in (("generate", "generate a video (MP4 with audio + raw safetensors)"),
                           ("baseline", "run (or reuse) the all-knobs-off baseline"),
                           ("evaluate", "measure a knob setting against the baseline"),
                           ("campaign", "search: baseline, one Optuna study per family on Ray, integrator, export"),
                           ("bench", "re-measure a tuned config (or --knobs) against the baseline, interleaved"),
                           ("calibrate", "run the quality metrics' calibration ladders (benchmarks/calibrate.py)")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=tiny request.seed=3")
        if name in ("generate", "evaluate", "bench"):
            s.add_argument("--knobs", nargs="*", default=[], metavar="FAMILY.TECHNIQUE.KNOB=VALUE")
        if name in ("generate", "bench"):
            s.add_argument("--config", default=None, help="a tuned config YAML (from vidtune campaign)")
            s.add_argument("--any-request", action="store_true",
                           help="apply --config to a request other than the one it was tuned for (noted in the output)")
            s.add_argument("--allow-rejected", action="store_true",
                           help="apply a --config whose sign-off rejected it (noted in the output)")
        if name in ("generate", "evaluate", "bench"):
            s.add_argument("--nproc", type=int, default=1,
                           help="processes on this machine (one per GPU, else gloo on the CPU) for parallelism knobs")
        if name == "bench":
            s.add_argument("--repeats", type=int, default=5)
            s.add_argument("--no-rewarm", dest="rewarm", action="store_false",
                           help="skip the untimed baseline+setting pair after the warm-up (two generations; the "
                                "JSON still counts graphs compiled during timed runs)")
            s.add_argument("--also", action="append", default=[], metavar="NAME:KNOB=VALUE[,KNOB=VALUE...]",
                           help="another setting benched in the same process against the same baseline runs "
                                "(A B NAME ..., ... NAME B A); repeatable; NAME: letters, digits, _ and -")
            s.add_argument("--reference", choices=("stored", "run"), default="stored",
                           help="quality reference: the stored baseline (computed and stored first if none matches: "
                                "eval.repeats + 1 generations), or 'run': an untimed baseline run of this process, "
                                "nothing stored (one generation)")
        if name == "evaluate":
            s.add_argument("--json", action="store_true")
        if name == "baseline":
            s.add_argument("--force", action="store_true", help="recompute even if a matching baseline exists")
        if name == "calibrate":
            s.add_argument("--out", default=None, help="where calibration.json and .md go (default: "
                           "results/calibration/<model>)")
    pc = sub.add_parser("parallel-check", help="run every parallelism strategy on N processes and compare with one")
    pc.add_argument("--nproc", type=int, default=2)
    pc.add_argument("--preset", default="tiny")
    pc.add_argument("--height", type=int, default=256)
    pc.add_argument("--width", type=int, default=384)
    pc.add_argument("--frames", type=int, default=17)
    for name, helptext in (("report", "write results/<campaign>/report.html (self-contained)"),
                           ("signoff", "record a person's review in the tuned config"),
                           ("ask", "print the next knob setting of a family's study as JSON"),
                           ("tell", "record an externally measured result for an asked trial")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("campaign", help="campaign name (results/<campaign>/)")
        s.add_argument("--results-dir", default="results")
        if name == "signoff":
            s.add_argument("--by", required=True)
            s.add_argument("--verdict", required=True, choices=["approve", "reject"])
            s.add_argument("--note", default="")
        if name == "ask":
            s.add_argument("--family", required=True)
            s.add_argument("--lease-s", type=float, default=3600.0,
                           help="how long the trial stays this agent's: a resumed campaign leaves it alone until then")
        if name == "tell":
            s.add_argument("--trial", type=int, required=True)
            s.add_argument("--result", required=True, help="JSON: {status: ok, total_ms, quality: {...}} or {status: fail, reason}")
            s.add_argument("--family", default=None)
    d = sub.add_parser("dashboard", help="a campaign's studies in optuna-dashboard on 127.0.0.1 (needs vidtune[dashboard])")
    d.add_argument("campaign", help="campaign name (results/<campaign>/)")
    d.add_argument("--results-dir", default="results")
    d.add_argument("--host", default="127.0.0.1")
    d.add_argument("--port", type=int, default=8080)
    d.add_argument("--public", action="store_true", help="allow a --host that is not a loopback address")
    m = sub.add_parser("mcp", help="serve vidtune to agents over the Model Context Protocol (stdio; needs vidtune[mcp])")
    m.add_argument("--results-dir", default="results", help="where the campaigns it starts and reads live")
    return p


def _cmd_mcp(args: argparse.Namespace) -> int:
    from vidtune.agent_server import serve

    try:
        return serve(args.results_dir)
    except RuntimeError as exc:  # (the SDK missing)
        raise CliError(str(exc)) from exc


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from vidtune.dashboard import serve

    try:
        return serve(args.results_dir, args.campaign, args.host, args.port, args.public)
    except (RuntimeError, ValueError) as exc:  # (the package missing, a bad address, no such campaign)
        raise CliError(str(exc)) from exc


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``vidtune`` console script."""
    from vidtune.model.request import RequestError
    from vidtune._io import OutputError
    from vidtune.search.campaign import CampaignBusy, CampaignPaused, CampaignStopped, StorageError
    from vidtune.techniques.registry import KnobError
    from vidtune.techniques.setting import CompositionError

    args = _parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # (the command, in every JSON's provenance)
    try:
        if args.command == "knobs":
            return cmd_knobs(args)
        offline = {"report": cmd_report, "signoff": cmd_signoff, "ask": cmd_ask, "tell": cmd_tell,
                   "parallel-check": cmd_parallel_check, "mcp": _cmd_mcp, "dashboard": _cmd_dashboard}
        if args.command in offline:
            return offline[args.command](args)
        if not 1 <= getattr(args, "nproc", 1) <= 1024:
            raise CliError(f"--nproc must be an integer in [1, 1024], got {args.nproc}")
        if not 1 <= getattr(args, "repeats", 1) <= MAX_REPEATS:
            raise CliError(f"--repeats must be an integer in [1, {MAX_REPEATS}], got {args.repeats}")
        if args.command == "bench" and args.config and args.knobs:
            raise CliError("bench takes --config tuned.yaml or --knobs, not both")
        if getattr(args, "nproc", 1) > 1:
            from vidtune.techniques.parallelism.distributed import plan_world

            plan_world(args.nproc)  # parallelism degrees are checked against the world about to start
        settings = Settings(load_config(args.overrides))
        if getattr(args, "knobs", None):
            from vidtune.techniques.setting import check_request

            check_request(knob_values(args.knobs), settings.request, settings.device)  # before the model is built
        if args.command == "campaign":
            settings.campaign_spec()  # validate before anything starts
        if getattr(args, "config", None):
            tuned_knobs(args, settings)
        settings.check_fits()
        settings.check_results_dir()  # the last checks (the ones above write nothing)
        settings.check_free_space(args.command)
        commands = {"generate": cmd_generate, "baseline": cmd_baseline, "evaluate": cmd_evaluate,
                    "campaign": cmd_campaign, "bench": cmd_bench, "calibrate": cmd_calibrate}
        return commands[args.command](args, settings)
    except (CliError, RequestError, KnobError, CompositionError, CampaignBusy, StorageError, OutputError) as exc:
        print(f"vidtune: error: {exc}", file=sys.stderr)
        return 2
    except CampaignPaused as exc:
        print(f"vidtune: {exc}; finished trials and combinations are kept: run the same command to go on",
              file=sys.stderr)
        return EXIT_PAUSED
    except CampaignStopped as exc:
        print(f"vidtune: {exc}: finished trials are kept; run the same command to resume (the trials that were "
              f"running are measured again)", file=sys.stderr)
        return 128 + exc.signum
    except ValueError as exc:  # a resumed campaign whose search space changed (before any model work)
        from vidtune.search.campaign import SearchSpaceError

        if not isinstance(exc, SearchSpaceError):
            raise
        print(f"vidtune: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
