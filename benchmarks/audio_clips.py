"""The audio metrics across clips: where each setting's audio sits between the baseline's and another seed's.

    python -m vidtune.benchmarks.audio_clips --size 512x768x33 --out results/calibration/audio

The calibration (benchmarks/calibrate.py) runs its ladders on one clip. A gate threshold must hold on every
clip a verdict measures (search/verdict.py), so this runs a few settings of the calibration's ladders on the
clips of three prompts ltx2-mini knows x two seeds, on the embedded ltx2-mini (CPU or GPU), and scores each
setting's audio against the same clip's baseline with every audio metric of search/metrics.py, beside two
references that are not the baseline's sound: another seed's baseline audio and silence. A metric fit for a
gate keeps the settings' scores apart from those references on every clip; conf/tiers/calibrated.yaml takes
its audio thresholds from the lowest score of the settings each tier admits on the video metrics.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PROMPTS = ("a red circle and a blue square bouncing", "a yellow triangle and a green circle bouncing, camera panning left",
           "a red circle bouncing on a blue background")
SEEDS = (0, 1)
# (the calibration's rungs: FP8 and skipping every 4th step are the `high` tier's on video, skipping every 2nd
# step and TeaCache 0.6 the `balanced` tier's, skipping every step is rejected by every tier; Sol touches video
# attention only)
SETTINGS = {"fp8 all": {"kernel_choice.fp8_linear": {"layers": "all"}},
            "skip every 4": {"caching.step_skip": {"every": 4, "stage": "both"}},
            "skip every 2": {"caching.step_skip": {"every": 2, "stage": "both"}},
            "teacache 0.6": {"caching.teacache": {"threshold": 0.6}},
            "skip every 1": {"caching.step_skip": {"every": 1, "stage": "both"}},
            "sol beta 1": {"sparse_attention.sol": {"beta": 1.0, "stages": "both"}}}
METRICS = ("audio_spectral_snr_db", "audio_spectral_db", "audio_snr_db")


def measure(size: str, device: str) -> dict:
    import torch

    from vidtune.api import Deployment
    from vidtune.search import metrics

    h, w, f = (int(x) for x in size.split("x"))
    overrides = ["model=ltx2-mini", f"request.height={h}", f"request.width={w}", f"request.frames={f}", f"device={device}"]
    clips = [(p, s) for p in PROMPTS for s in SEEDS]
    plain = Deployment.load(None, overrides)
    with plain:
        base = {c: plain.generate(prompt=c[0], seed=c[1]).audio for c in clips}
    audio = {}
    for name, knobs in SETTINGS.items():
        with Deployment(plain.settings, knobs, [], None) as d:
            for c in clips:
                audio[name, c] = d.generate(prompt=c[0], seed=c[1]).audio
    rows = []
    for prompt, seed in clips:
        ref = base[prompt, seed]
        others = {**{n: audio[n, (prompt, seed)] for n in SETTINGS},
                  "another seed's baseline": base[prompt, 1 - seed], "silence": torch.zeros_like(ref)}
        for name, out in others.items():
            rows.append({"prompt": prompt, "seed": seed, "setting": name,
                         **{m: round(getattr(metrics, m)(ref, out), 4) for m in METRICS}})
    return {"model": "ltx2-mini", "size": size, "device": device, "rows": rows}


def table(result: dict, metric: str) -> str:
    names = list(SETTINGS) + ["another seed's baseline", "silence"]
    lines = [f"| clip | {' | '.join(names)} |", "|---|" + "---|" * len(names)]
    clips = list(dict.fromkeys((r["prompt"], r["seed"]) for r in result["rows"]))
    for prompt, seed in clips:
        cells = {r["setting"]: r[metric] for r in result["rows"] if (r["prompt"], r["seed"]) == (prompt, seed)}
        lines.append(f"| {prompt[:28]}, seed {seed} | " + " | ".join(f"{cells[n]:.3f}" for n in names) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="512x768x33", help="HxWxF of the clips (default: the quality model's size)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = measure(args.size, args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"audio_{args.size}.json").write_text(json.dumps(result, indent=1))
    md = [f"ltx2-mini, {args.size}, {args.device}: each setting's audio against its clip's baseline.", ""]
    for metric in METRICS:
        md += [f"### {metric}", "", table(result, metric), ""]
    (args.out / f"audio_{args.size}.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
