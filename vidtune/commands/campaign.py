"""The campaign commands: ``campaign``, ``report``, ``signoff``, and the agents' ``ask`` / ``tell``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vidtune._io import atomic_write_text, strict_json
from vidtune.provenance import provenance
from vidtune.settings import CliError, Settings

__all__ = ["cmd_campaign", "cmd_report", "cmd_signoff", "cmd_ask", "cmd_tell"]


def cmd_campaign(args: argparse.Namespace, settings: Settings) -> int:
    from vidtune.driver import Campaign

    from vidtune.search.progress import TerminalLog

    spec = settings.campaign_spec()
    out = TerminalLog()  # (a bar at the bottom of a terminal; plain lines in a log)
    try:
        summary = Campaign(spec, log=out, status=out.status).run()
    finally:
        out.close()
    final = summary["final"]
    made = provenance(settings, args.argv)
    stored = spec.directory / "campaign.json"  # (the driver wrote it; the command that ran is the CLI's to add)
    atomic_write_text(stored, strict_json({**json.loads(stored.read_text()), "provenance": made}, indent=2))
    print(json.dumps({"campaign": spec.name, "directory": str(spec.directory), "tuned_config": summary["tuned_config"],
                      "chosen": summary["chosen"], "speedup": round(final["speedup"], 4),
                      "psnr_db": round(final["quality"]["psnr_db"], 3), "provenance": made}, indent=2))
    return 0


def _campaign_dir(args: argparse.Namespace) -> Path:
    d = Path(args.results_dir) / args.campaign
    if not (d / "campaign_spec.json").is_file():
        raise CliError(f"campaign {args.campaign!r} not found under {args.results_dir}/ (no campaign_spec.json)")
    return d


def cmd_report(args: argparse.Namespace) -> int:
    from vidtune.integrator.report import build_report

    d = _campaign_dir(args)
    for name in ("campaign.json", "tuned.yaml"):
        if not (d / name).is_file():
            raise CliError(f"campaign {args.campaign!r} has not finished (no {name}); run it to the end first (the same "
                           f"`vidtune campaign` command resumes it)")
    try:
        print(build_report(d))
    except (ValueError, KeyError, TypeError) as exc:  # (json's and yaml's errors are ValueErrors)
        raise CliError(f"campaign {args.campaign!r}: its campaign.json or tuned.yaml cannot be read ({type(exc).__name__}: "
                       f"{str(exc)[:300]}); re-run the campaign with the same name to write them again") from None
    return 0


def cmd_signoff(args: argparse.Namespace) -> int:
    from vidtune.integrator.report import build_report
    from vidtune.integrator.tuned import TunedConfigError, sign_off

    d = _campaign_dir(args)
    if not (d / "tuned.yaml").is_file():
        raise CliError(f"campaign {args.campaign!r} has no tuned.yaml yet")
    try:
        record = sign_off(d / "tuned.yaml", args.by, args.verdict, args.note)
    except TunedConfigError as exc:
        raise CliError(str(exc)) from None
    if (d / "campaign.json").is_file():
        build_report(d)
    print(json.dumps(record, indent=2))
    return 0


def cmd_ask(args: argparse.Namespace) -> int:
    from vidtune.search.campaign import ask_trial, load_spec

    try:
        print(json.dumps(ask_trial(load_spec(_campaign_dir(args)), args.family, args.lease_s), indent=2, default=str))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return 0


def cmd_tell(args: argparse.Namespace) -> int:
    from vidtune.search.campaign import load_spec, tell_trial

    try:
        result = json.loads(Path(args.result).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CliError(f"--result must be a JSON file with the measured result: {exc}") from None
    try:
        print(json.dumps(tell_trial(load_spec(_campaign_dir(args)), args.trial, result, args.family), indent=2))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return 0
