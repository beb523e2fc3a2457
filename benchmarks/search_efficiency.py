"""Search-efficiency benchmark: how fast a search strategy finds the best setting of a small space.

    python -m vidtune.benchmarks.search_efficiency measure --space tiny-caching --out TABLE.json
    python -m vidtune.benchmarks.search_efficiency score --table TABLE.json [--runs 40] [--strategies campaign tpe random]

``measure`` evaluates every distinct setting of a small, finite search space (the exhaustive set: one
representative value per bin of each knob of one family, each technique off or on at each combination) on one in-process trial worker, against
the stored baseline, and writes the table (latency, quality, the measurement's own seconds per setting).

``score`` replays strategies on that table, many seeds each, without measuring anything again:
- ``campaign``: the campaign's own sampling (its probes, ``search/probes.py``, then ``family_sampler``'s TPE with
  ``ask_effective``: no-op and duplicate samples skipped, results told with the gate's constraints), every
  sampled value read as the representative of its bin (``Space``); a sampled setting that reads as none of the
  table's (a no-op at the bins' values) is skipped as the campaign skips a no-op;
- ``tpe``: the same without the probes;
- ``random``: the space's settings in a random order (sampling without replacement).
Each run's score is the number of evaluations (and the measured seconds they took) until a setting within
``--within`` (5%) of the exhaustive best feasible latency was evaluated; the summary gives medians and the
regret after each evaluation. Every sampled setting counts as an evaluation, also where snapping maps it onto
one evaluated before (a campaign would have measured it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vidtune.search.records import Status

if TYPE_CHECKING:
    from vidtune.techniques.setting import KnobValues

__all__ = ["SPACES", "Space", "enumerate_space", "measure_space", "score_table", "main"]


class Space:
    """A finite search space: one family's knobs cut into bins. Per technique, each knob lists one representative
    value per bin: a numeric knob's range (as the family samples it) is cut into as many equal bins as it lists
    values, in order, and each value must lie in its own bin; a categorical knob lists its choices. The table
    holds the representatives' measurements; a sampled setting is read as its bins' representatives (``snap``)."""

    def __init__(self, name: str, family: str, model: str, request: dict[str, Any],
                 grid: dict[str, dict[str, list[Any]]], gate: dict[str, float | None]) -> None:
        self.name, self.family, self.model, self.request, self.grid, self.gate = name, family, model, request, grid, gate
        self._distributions: dict[str, Any] | None = None

    def generation_request(self) -> Any:
        from vidtune.model import GenerationRequest

        return GenerationRequest(**self.request)

    def distributions(self) -> dict[str, Any]:
        """The family's Optuna distributions for this request, by parameter name."""
        if self._distributions is None:
            from vidtune.search.sampling import family_distributions

            self._distributions = family_distributions(self.family, self.generation_request())
        return self._distributions

    def bin_of(self, param: str, value: Any) -> int | None:
        """The index of the bin of ``param`` (``technique.knob``) that ``value`` falls in; None for a knob sampled
        as a category (or not sampled here)."""
        import math

        d = self.distributions().get(param)
        if d is None or hasattr(d, "choices"):
            return None
        k = len(self.grid[param.rsplit(".", 1)[0]][param.rsplit(".", 1)[1]])
        lo, hi, v = float(d.low), float(d.high), float(value)
        if getattr(d, "log", False):
            lo, hi, v = math.log(lo), math.log(hi), math.log(v)
        if isinstance(d.low, int) and not getattr(d, "log", False):  # integers: k runs of consecutive values
            return min(k - 1, int((v - lo) * k // (hi - lo + 1)))
        return min(k - 1, max(0, int((v - lo) / (hi - lo) * k))) if hi > lo else 0


_SMALL = {"prompt": "a red circle bouncing on a blue background", "seed": 0, "height": 128, "width": 192, "frames": 9}
STRATEGIES = ("campaign", "tpe", "random")  # tpe: the campaign's sampling without its probes

SPACES: dict[str, Space] = {
    # distilled mode: the caching techniques that apply there (the guidance cache and the STG prefix need
    # guided steps); step skipping composes with either residual cache, the two residual caches exclude each other.
    # Two bins of each knob that matters most, one of the others (e.g. step_skip.every 1..4: 1-2 and 3-4)
    "tiny-caching": Space("tiny-caching", "caching", "tiny", _SMALL, {
        "caching.step_skip": {"every": [2, 3], "first_kept": [2, 5], "last_kept": [1], "stage": ["stage1", "stage2", "both"]},
        "caching.first_block": {"threshold": [0.2, 0.7], "fn_blocks": [1], "warmup_steps": [1], "max_consecutive": [2]},
        "caching.teacache": {"threshold": [0.3, 1.2], "first_kept": [1], "last_kept": [1]},
    }, {"psnr_db": 20.0, "ssim": 0.5, "audio_snr_db": 0.0}),
    # (the gate's three fields set, as the campaign's default gate: ask_effective tells its no-ops three constraints)
    # two settings: the test of the measuring path itself
    "tiny-smoke": Space("tiny-smoke", "caching", "tiny", {**_SMALL, "frames": 9}, {
        "caching.step_skip": {"every": [2, 3], "first_kept": [1], "last_kept": [1], "stage": ["both"]},
    }, {"psnr_db": 0.0, "ssim": 0.0, "audio_snr_db": -100.0}),
}


def _key(setting: KnobValues) -> str:
    return json.dumps(setting, sort_keys=True)


def enumerate_space(space: Space) -> list[KnobValues]:
    """Every distinct setting of ``space`` that changes something for its request, built by the family's own
    sampling (``sample_family_setting`` on fixed parameters: its clash and no-op rules apply), in a stable order."""
    import optuna

    from vidtune.search.sampling import sample_family_setting
    from vidtune.techniques import registered

    req = space.generation_request()
    names = [t.name for t in registered(space.family)]
    options: list[list[dict[str, Any]]] = []
    for name in names:
        opts: list[dict[str, Any]] = [{f"{name}.use": False}]
        if name in space.grid:
            knobs = space.grid[name]
            for values in itertools.product(*knobs.values()):
                opts.append({f"{name}.use": True, **{f"{name}.{k}": v for k, v in zip(knobs, values)}})
        options.append(opts)
    seen: dict[str, KnobValues] = {}
    for combo in itertools.product(*options):
        params = {k: v for part in combo for k, v in part.items()}
        try:
            setting = sample_family_setting(optuna.trial.FixedTrial(params), space.family, req)
        except ValueError:  # a knob of the technique that the grid leaves out: not part of this space
            continue
        if setting:
            seen.setdefault(_key(setting), setting)
    return list(seen.values())


def snap(setting: KnobValues, space: Space) -> KnobValues:
    """``setting`` read on the space: techniques outside it dropped, each knob replaced by its bin's representative
    (a categorical value outside the listed choices by the first listed)."""
    out: KnobValues = {}
    for name, values in setting.items():
        if name not in space.grid:
            continue
        snapped = {}
        for knob, choices in space.grid[name].items():
            v = values.get(knob, choices[0])
            index = space.bin_of(f"{name}.{knob}", v)
            snapped[knob] = choices[index] if index is not None else (v if v in choices else choices[0])
        out[name] = snapped
    return out


def measure_space(space: Space, repeats: int = 2, say: Any = print) -> dict[str, Any]:
    """Evaluate every setting of ``space`` on one in-process trial worker (unpaired medians of ``repeats``
    generations after one warm-up, each against the stored baseline); returns the table."""
    import tempfile

    from vidtune.model import ModelSource
    from vidtune.search.worker import TrialWorker, WorkerSpec

    settings = enumerate_space(space)
    with tempfile.TemporaryDirectory(prefix="vidtune-efficiency-") as tmp:
        worker = TrialWorker(WorkerSpec(source={"preset": ModelSource(preset=space.model).preset}, request=space.request,
                                        device="cpu", repeats=repeats, warmup=1, paired=False, baseline_dir=tmp,
                                        baseline_mp4=False, flip_frames=0))
        base = worker.ensure_baseline()
        rows = []
        for i, setting in enumerate(settings):
            t0 = time.perf_counter()
            rec = worker.evaluate(setting)
            seconds = time.perf_counter() - t0
            row = {"setting": setting, "status": rec["status"], "seconds": round(seconds, 3)}
            if rec["status"] == Status.OK:
                row.update(total_ms=round(rec["total_ms"], 3),
                           quality={k: rec["quality"].get(k) for k in ("psnr_db", "ssim", "audio_snr_db")})
            else:
                row.update(reason=rec.get("reason"), message=str(rec.get("message", ""))[:300])
            rows.append(row)
            say(f"{i + 1}/{len(settings)} {_key(setting)}: {row.get('total_ms', row.get('reason'))} ms, "
                f"{(row.get('quality') or {}).get('psnr_db')} dB, {seconds:.1f} s")
        worker.close()
    return {"space": space.name, "family": space.family, "model": space.model, "request": space.request,
            "grid": space.grid, "gate": space.gate, "repeats": repeats, "baseline_ms": base["total_ms"],
            "measured": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}


def _gate(table: dict[str, Any]) -> Any:
    from vidtune.search.spec import Gate

    return Gate(**table["gate"])


def _target(table: dict[str, Any], within: float) -> tuple[float, set[str]]:
    """The exhaustive best feasible latency and the keys of the settings within ``within`` of it."""
    gate = _gate(table)
    ok = [r for r in table["rows"] if r["status"] == Status.OK and gate.passes(r["quality"])]
    if not ok:
        raise ValueError(f"table {table['space']!r}: no setting passes the gate {table['gate']}")
    best = min(r["total_ms"] for r in ok)
    return best, {_key(r["setting"]) for r in ok if r["total_ms"] <= best * (1 + within)}


def _replay_campaign(table: dict[str, Any], space: Space, seed: int, good: set[str], limit: int,
                     probes: bool = True) -> list[str]:
    """The campaign's sampling run against the table: the keys of the settings it evaluates, in order, until one
    in ``good`` (or ``limit`` evaluations)."""
    import optuna

    from vidtune.search.probes import queue_follow_ups, queue_probes
    from vidtune.search.records import Reason
    from vidtune.search.sampling import ask_effective, family_sampler, set_constraints

    rows = {_key(r["setting"]): r for r in table["rows"]}
    gate, req = _gate(table), space.generation_request()
    study = optuna.create_study(directions=["minimize", "maximize"], sampler=family_sampler(seed, space.family, 0))
    if probes:
        queue_probes(study, space.family, req)
    order: list[str] = []
    while len(order) < limit:
        if probes:
            queue_follow_ups(study, space.family, req)
        trial, setting, _ = ask_effective(study, space.family, req)
        if trial is None:
            break
        key = _key(snap(setting, space))
        row = rows.get(key)
        if row is None:  # snapped onto nothing of the space (off): the baseline itself, a no-op
            trial.set_user_attr("reason", Reason.NO_OP)
            set_constraints(trial, [1.0, 1.0, 1.0])  # (as ask_effective tells its no-ops)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        order.append(key)
        if row["status"] != Status.OK:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            constraints = gate.constraints(row["quality"])
            set_constraints(trial, constraints)
            trial.set_user_attr("feasible", all(c <= 0 for c in constraints))  # (as the campaign's tell records it)
            study.tell(trial, [row["total_ms"], row["quality"]["psnr_db"]])
        if key in good:
            break
    return order


def score_table(table: dict[str, Any], runs: int = 40, within: float = 0.05,
                strategies: tuple[str, ...] = ("campaign", "random")) -> dict[str, Any]:
    """Replay ``strategies`` ``runs`` times each on a measured table; evaluations and seconds to the target."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = SPACES[table["space"]]
    rows = {_key(r["setting"]): r for r in table["rows"]}
    best, good = _target(table, within)
    n = len(rows)
    out: dict[str, Any] = {"space": table["space"], "settings": n, "best_ms": best, "within": within,
                           "good_settings": len(good), "baseline_ms": table["baseline_ms"], "runs": runs}
    for strategy in strategies:
        evals, seconds, found = [], [], 0
        for seed in range(runs):
            if strategy in ("campaign", "tpe"):
                order = _replay_campaign(table, space, seed, good, limit=n * 3, probes=strategy == "campaign")
            elif strategy == "random":
                keys = list(rows)
                random.Random(seed).shuffle(keys)
                order = keys[:next(i for i, k in enumerate(keys) if k in good) + 1]
            else:
                raise ValueError(f"strategy must be one of {list(STRATEGIES)}; got {strategy!r}")
            hit = bool(order) and order[-1] in good
            found += hit
            evals.append(len(order) if hit else float("inf"))
            seconds.append(sum(rows[k]["seconds"] for k in order) if hit else float("inf"))
        out[strategy] = {"found": found, "median_evaluations": statistics.median(evals),
                         "median_fraction": statistics.median(evals) / n,
                         "median_seconds": round(statistics.median(seconds), 2),
                         "evaluations": evals}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vidtune.benchmarks.search_efficiency", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="evaluate every setting of a space; write the table")
    m.add_argument("--space", choices=sorted(SPACES), default="tiny-caching")
    m.add_argument("--repeats", type=int, default=2)
    m.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("score", help="replay strategies on a measured table")
    s.add_argument("--table", type=Path, required=True)
    s.add_argument("--runs", type=int, default=40)
    s.add_argument("--within", type=float, default=0.05)
    s.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=["campaign", "random"])
    a = p.parse_args(argv)
    if a.command == "measure":
        if not 1 <= a.repeats <= 20:
            p.error(f"--repeats must be in [1, 20], got {a.repeats}")
        table = measure_space(SPACES[a.space], repeats=a.repeats, say=lambda line: print(line, file=sys.stderr))
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(table, indent=1) + "\n")
        print(json.dumps({"table": str(a.out), "settings": len(table["rows"])}))
        return 0
    if not 0 < a.within < 1 or not 1 <= a.runs <= 1000:
        p.error("--within must be in (0, 1) and --runs in [1, 1000]")
    result = score_table(json.loads(a.table.read_text()), runs=a.runs, within=a.within, strategies=tuple(a.strategies))
    for strategy in a.strategies:
        result[strategy].pop("evaluations")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
