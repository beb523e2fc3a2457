"""GPU evidence for sparse attention: time vs density of the Sol Triton kernel against cuDNN dense, and
one full 4K stage-2 transformer pass of ``ltx2-19b`` dense vs Sol.

    python -m vidtune.benchmarks.bench_sparse --out results/benchmarks/sparse/sparse.json

Attention-only: 32 heads x 128 at 24,576 and 130,560 tokens (the 1536x1024x121 and 3840x2176x121
stage-2 sequences); queries and keys follow a smooth random walk along the sequence plus noise (so
nearby tokens are alike, as in video), values are Gaussian. For each beta, Sol (routing + kernel, and
the kernel alone) and cuDNN dense SDPA are alternated ``repeats`` times after a warm-up; medians and
the ratio are reported with the achieved density and the error against dense attention. The pass:
one X0Model forward at 3840x2176x121 with Sol on every block's video self-attention (stage-2 context
set), alternated with the dense pass.
"""

from __future__ import annotations

import argparse
import json
import statistics
import traceback
from pathlib import Path
from typing import Any

import torch

from vidtune.search.baseline import environment
from vidtune.search.timing import interleaved, summarise, time_call

SEQUENCES = {"1536x1024x121": 24_576, "3840x2176x121": 130_560}


def attention_inputs(n: int, heads: int, d: int, device: torch.device, seed: int = 0, step: float | None = None,
            noise: float = 0.5) -> tuple[torch.Tensor, ...]:
    """bf16 q, k (a random walk divided by ``step``, default sqrt(n)/8, plus noise) and Gaussian v."""
    g = torch.Generator(device=device).manual_seed(seed)
    walk = torch.randn(1, heads, n, d, generator=g, device=device).cumsum(2) / (step or n**0.5 / 8)
    q = (walk + noise * torch.randn(1, heads, n, d, generator=g, device=device)).bfloat16()
    k = (walk + noise * torch.randn(1, heads, n, d, generator=g, device=device)).bfloat16()
    v = torch.randn(1, heads, n, d, generator=g, device=device).bfloat16()
    return q, k, v


def bench_attention(betas: list[float], repeats: int, device: torch.device, on_progress: Any) -> dict[str, Any]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from vidtune.kernels.sol_triton import route, sol_attention_triton

    out: dict[str, Any] = {}
    for name, n in SEQUENCES.items():
        q, k, v = attention_inputs(n, 32, 128, device)

        def dense() -> torch.Tensor:
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v)

        ref = dense()
        rows: dict[str, Any] = {}
        for beta in betas:
            try:
                sol = lambda: sol_attention_triton(q, k, v, beta)  # noqa: E731
                got, density = sol()  # warm-up: compile + autotune
                err = float((got.float() - ref.float()).norm() / ref.float().norm())
                routing = route(q, k, v, beta, 64, "exact", 1)
                fns = {"dense": dense, "sol": sol, "route": lambda: route(q, k, v, beta, 64, "exact", 1),
                       "plain": lambda: sol_attention_triton(q, k, v, beta, correction=False)}  # (plain: block_sparse)
                timed = interleaved(list(fns), repeats, lambda key: None, lambda key: time_call(fns[key], device),
                                    untimed=0)
                t_dense, t_sol, t_route, t_plain = timed["dense"], timed["sol"], timed["route"], timed["plain"]
                rows[str(beta)] = {
                    "density": density, "rel_error_vs_dense": err, "dense_cudnn": summarise(t_dense).to_dict(),
                    "sol_total": summarise(t_sol).to_dict(), "sol_routing": summarise(t_route).to_dict(),
                    "block_sparse_total": summarise(t_plain).to_dict(),
                    "speedup": statistics.median(t_dense) / statistics.median(t_sol),
                    "kept_blocks_mean": float(routing["nkept"].float().mean()),
                }
                print(f"{name} beta {beta}: density {density:.3f}, dense {statistics.median(t_dense):.1f} ms, "
                      f"sol {statistics.median(t_sol):.1f} ms (routing {statistics.median(t_route):.1f}, "
                      f"without correction {statistics.median(t_plain):.1f}), "
                      f"x{rows[str(beta)]['speedup']:.2f}, rel err {err:.3g}", flush=True)
            except Exception as exc:
                rows[str(beta)] = {"failed": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
                print(f"{name} beta {beta}: FAILED {exc}", flush=True)
            out[name] = {"tokens": n, "heads": 32, "head_dim": 128, "betas": rows}
            on_progress(out)
        del q, k, v, ref
        torch.cuda.empty_cache()
    return out


def check_kernel(device: torch.device) -> dict[str, Any]:
    """Kernel vs reference on the GPU test's inputs (steep random walk: logits in the thousands), with
    the correction on and off, so that a mismatch is placed in the exact or the approximated part."""
    from vidtune.kernels.sol_attention import sol_attention_reference
    from vidtune.kernels.sol_triton import sol_attention_triton

    rows: dict[str, Any] = {}
    for n, heads in ((4096, 4), (24576, 2)):
        q, k, v = attention_inputs(n, heads, 128, device, step=8.0, noise=0.3)
        for beta in (1.0, 2.0):
            for correction in (True, False):
                got, dens = sol_attention_triton(q, k, v, beta, correction=correction)
                ref, rdens = sol_attention_reference(q, k, v, beta, correction=correction)
                diff = (got.float() - ref.float()).abs()
                bad = diff > 2e-2 + 2e-2 * ref.float().abs()
                key = f"n{n} beta{beta} correction={correction}"
                rows[key] = {"density": dens, "ref_density": rdens, "max_abs": float(diff.max()),
                             "bad_fraction": float(bad.float().mean()),
                             "bad_rows": int(bad.any(-1).sum()), "nan": bool(got.isnan().any())}
                print("check", key, rows[key], flush=True)
        del q, k, v
    return rows


# Rounds 5-6 measured lazy rescaling, paired key blocks and query-block pairs (all slower); round 7
# measures tensor-descriptor (TMA) loads and base-2 exponentials. Each row overrides ROUND3, the launch
# settings that were the default until round 7 (so the lists keep meaning what they measured);
# ``--sweep NAME`` picks a list (the last one by default).
ROUND3 = {"num_warps": 4, "num_stages": 3, "chunk": 32, "value_lo": True, "lazy": False, "pair": False,
          "query_blocks": 1, "tma": False, "exp2": False, "kmean_lo": True}
SWEEPS = {
    "7a": [{}, {"tma": True}, {"tma": True, "num_stages": 2}, {"tma": True, "num_stages": 4},
           {"tma": True, "chunk": 64}, {"tma": True, "value_lo": False}, {"value_lo": False},
           {"tma": True, "query_blocks": 2, "num_warps": 8}],
    "7b": [{}, {"tma": True, "value_lo": False}, *({"tma": True, "value_lo": False, "num_stages": st, "num_warps": w,
                                                     "chunk": c} for st, w, c in ((2, 4, 32), (2, 4, 64), (2, 8, 32),
                                                                                  (3, 8, 32), (2, 4, 16), (1, 4, 32)))],
    "7c": [{}, *({"tma": True, "value_lo": False, **row} for row in (
        {}, {"exp2": True}, {"exp2": True, "chunk": 64}, {"query_blocks": 2, "num_warps": 8},
        {"query_blocks": 2, "num_warps": 8, "num_stages": 2}, {"query_blocks": 2, "num_warps": 8, "exp2": True},
        {"query_blocks": 2, "num_warps": 4, "num_stages": 2}))],
    "7d": [{}, {"tma": True, "value_lo": False, "exp2": True}],  # round 3's default against round 7's
    # round 8: round 7's default with and without the block means' lo part, and with chunks of 64
    "8": [{"tma": True, "value_lo": False, "exp2": True, **row} for row in (
        {}, {"kmean_lo": False}, {"kmean_lo": False, "chunk": 64}, {"kmean_lo": False, "num_stages": 2})],
}


def sweep_launch(beta: float, repeats: int, device: torch.device, name: str = "7d") -> list[dict[str, Any]]:
    """The kernel alone (routing done once) at 130,560 tokens under each launch setting, interleaved."""
    from vidtune.kernels.sol_triton import LAUNCH, launch, route, union_routing

    q, k, v = attention_inputs(SEQUENCES["3840x2176x121"], 32, 128, device)
    r = route(q, k, v, beta, 64, "exact", 1)
    ref = launch(q, k, v, r)
    union_ms = [time_call(lambda: union_routing({"keep": r["keep"]}), device) for _ in range(repeats)]
    union_routing(r)
    print("sweep: density", float(r["density"]), "union density (query-block pairs)", float(r["union_density"]),
          "union routing", statistics.median(union_ms), "ms", flush=True)
    rows: list[dict[str, Any]] = [{"density": float(r["density"]), "union_density": float(r["union_density"]),
                                   "union_routing_ms": union_ms}]
    for cfg in ({**ROUND3, **row} for row in SWEEPS[name]):
        try:
            got = launch(q, k, v, r, **cfg)  # compile
            rows.append({**cfg, "max_abs_vs_default": float((got.float() - ref.float()).abs().max()), "ms": []})
        except Exception as exc:
            rows.append({**cfg, "failed": f"{type(exc).__name__}: {exc}"})
    runnable = [i for i, row in enumerate(rows) if "failed" not in row and "num_warps" in row]  # (row 0: densities)
    timed = interleaved(runnable, repeats, lambda i: None,
                        lambda i: time_call(lambda: launch(q, k, v, r, **{key: rows[i][key] for key in LAUNCH}), device),
                        untimed=0)
    for i, ms in timed.items():
        rows[i]["ms"] = ms
    for row in rows:
        if row.get("ms"):
            row["median_ms"] = statistics.median(row["ms"])
        print("sweep", {key: val for key, val in row.items() if key != "ms"}, flush=True)
    return rows


def compare_backends(betas: list[float], repeats: int, device: torch.device, on_progress: Any) -> dict[str, Any]:
    """The CuTe DSL kernel (``kernels/sol_cute.py``) against the Triton kernel on the same routing: first
    their agreement (kept part alone, and Sol with the correction), then, interleaved after a warm-up,
    cuDNN dense, Sol end to end with each backend (routing included) and the kept part alone with each."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from vidtune.kernels.sol_cute import CUTE_LAUNCH, kept_attention_cute, sol_attention_cute
    from vidtune.kernels.sol_triton import launch, route, sol_attention_triton

    out: dict[str, Any] = {}
    for name, n in SEQUENCES.items():
        q, k, v = attention_inputs(n, 32, 128, device)

        def dense() -> torch.Tensor:
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v)

        rows: dict[str, Any] = {}
        for beta in betas:
            try:
                r = route(q, k, v, beta, 64, "exact", 1)
                kept_t = launch(q, k, v, r, 64, False)
                kept_c, _ = kept_attention_cute(q, k, v, r)
                sol_t, density = sol_attention_triton(q, k, v, beta)
                sol_c, _ = sol_attention_cute(q, k, v, beta)
                where = CUTE_LAUNCH["correction"]
                other = "triton" if where == "fused" else "fused"

                def sol_cute_other() -> Any:  # the correction in the other place
                    CUTE_LAUNCH["correction"] = other
                    try:
                        return sol_attention_cute(q, k, v, beta)
                    finally:
                        CUTE_LAUNCH["correction"] = where

                sol_o, _ = sol_cute_other()
                agree = {"kept_max_abs": float((kept_c.reshape(kept_t.shape).float() - kept_t.float()).abs().max()),
                         "sol_max_abs": float((sol_c.float() - sol_t.float()).abs().max()),
                         f"sol_correction_{other}_max_abs": float((sol_o.float() - sol_t.float()).abs().max()),
                         "nan": bool(kept_c.isnan().any() or sol_c.isnan().any() or sol_o.isnan().any())}
                fns = {"dense_cudnn": dense,
                       "sol_triton": lambda: sol_attention_triton(q, k, v, beta),
                       "sol_cute": lambda: sol_attention_cute(q, k, v, beta),
                       f"sol_cute_correction_{other}": sol_cute_other,
                       "kept_triton": lambda: launch(q, k, v, r, 64, False),
                       "kept_cute": lambda: kept_attention_cute(q, k, v, r)}
                times = interleaved(list(fns), repeats, lambda key: None, lambda key: time_call(fns[key], device),
                                    untimed=0)
                med = {key: statistics.median(t) for key, t in times.items()}
                rows[str(beta)] = {"density": density, "agreement": agree,
                                   **{key: summarise(t).to_dict() for key, t in times.items()},
                                   "speedup_triton": med["dense_cudnn"] / med["sol_triton"],
                                   "speedup_cute": med["dense_cudnn"] / med["sol_cute"],
                                   "kept_cute_over_triton": med["kept_triton"] / med["kept_cute"]}
                print(f"{name} beta {beta}: density {density:.3f}, dense {med['dense_cudnn']:.1f} ms; sol triton "
                      f"{med['sol_triton']:.1f} ms (x{rows[str(beta)]['speedup_triton']:.2f}), sol cute "
                      f"{med['sol_cute']:.1f} ms (x{rows[str(beta)]['speedup_cute']:.2f}); kept part triton "
                      f"{med['kept_triton']:.1f} ms, cute {med['kept_cute']:.1f} ms; correction {where}; with the "
                      f"correction {other}: {med[f'sol_cute_correction_{other}']:.1f} ms; {agree}", flush=True)
            except Exception as exc:
                rows[str(beta)] = {"failed": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
                print(f"{name} beta {beta}: FAILED {exc}", flush=True)
            out[name] = {"tokens": n, "heads": 32, "head_dim": 128, "betas": rows}
            on_progress(out)
        del q, k, v
        torch.cuda.empty_cache()
    return out


def bench_pass(betas: list[float], repeats: int, device: torch.device, backend: str = "triton") -> dict[str, Any]:
    """One 4K stage-2 X0Model forward of ltx2-19b, dense vs Sol (``backend``) on every block, per beta
    (the model is built once; each beta's runs alternate with dense runs)."""
    from vidtune.model.pipeline import StepContext
    from vidtune.model.presets import get_preset
    from vidtune.benchmarks.bench_kernels import transformer_only_pipeline
    from vidtune.benchmarks.bench_pass import pass_inputs
    from vidtune.techniques import compose

    pipe = transformer_only_pipeline("ltx2-19b", device)
    video, audio = pass_inputs(get_preset("ltx2-19b"), 2176, 3840, 121, 24.0, device)
    tr = pipe.models.transformer
    pipe.context = StepContext(stage="stage2", step=0, num_steps=3, sigma=0.909375, grid=(16, 68, 120))

    def one() -> None:
        tr(video=video, audio=audio, perturbations=None)

    out: dict[str, Any] = {}
    with torch.inference_mode():
        one()  # warm-up, dense
        for beta in betas:
            setting = {"sparse_attention.sol": {"beta": beta, "backend": backend}}
            try:
                with compose(pipe, setting):
                    one()  # warm-up: the kernel compiles for this model's shapes
                dens: dict[str, float] = {}

                def timed_one(side: str) -> float:
                    pipe.reset_stats()
                    ms = time_call(one, device)
                    if side == "B":
                        dens.update(pipe.run_stats().get("sparse_attention.sol", {}).get("density", {}))
                    return ms

                timed = interleaved(("A", "B"), repeats, lambda side: compose(pipe, setting).undo if side == "B" else None,
                                    timed_one, untimed=0)
                base, test = timed["A"], timed["B"]
                mean_density = sum(dens.values()) / max(len(dens), 1)
                res = {"setting": setting, "dense": summarise(base).to_dict(), "sol": summarise(test).to_dict(),
                       "speedup": statistics.median(base) / statistics.median(test), "mean_density": mean_density,
                       "density_per_layer": dens}
                print(f"4K pass beta {beta}: dense {statistics.median(base):.0f} ms, sol {statistics.median(test):.0f} ms, "
                      f"x{res['speedup']:.2f}, density {mean_density:.3f}", flush=True)
            except Exception as exc:
                res = {"setting": setting, "failed": f"{type(exc).__name__}: {exc}",
                       "traceback": traceback.format_exc()[-2000:]}
                print(f"4K pass beta {beta}: FAILED {exc}", flush=True)
            out[str(beta)] = res
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--betas", nargs="+", type=float, default=[0.5, 1.0, 1.5, 2.0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pass-betas", nargs="+", type=float, default=None,
                    help="betas of the 4K pass (default: the one nearest 10%% density in the attention-only runs)")
    ap.add_argument("--skip-attention", action="store_true", help="no attention-only runs (the pass only)")
    ap.add_argument("--pass-repeats", type=int, default=2)
    ap.add_argument("--skip-pass", action="store_true")
    ap.add_argument("--check", action="store_true", help="first compare kernel and reference (correction on/off)")
    ap.add_argument("--sweep", nargs="?", const=list(SWEEPS)[-1], default=None, choices=list(SWEEPS),
                    help="first time the kernel's launch settings at 130,560 tokens (a list of SWEEPS, default the last)")
    ap.add_argument("--launch", nargs="*", default=[], metavar="KEY=VALUE",
                    help="override the kernel's launch settings (kernels/sol_triton.py LAUNCH) for the "
                         "attention-only runs and the pass, e.g. query_blocks=2 num_warps=8")
    ap.add_argument("--cute-launch", nargs="*", default=[], metavar="KEY=VALUE",
                    help="override the CuTe kernel's settings (kernels/sol_cute.py CUTE_LAUNCH), e.g. stages=3")
    ap.add_argument("--backend", default="triton", choices=("triton", "cute"), help="Sol kernel of the 4K pass")
    ap.add_argument("--compare-backends", action="store_true",
                    help="first compare the CuTe DSL and Triton kernels (agreement, then interleaved times) at --betas")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    from vidtune.kernels.sol_triton import LAUNCH

    from vidtune.kernels.sol_cute import CUTE_LAUNCH

    for flag, items, settings in (("--launch", a.launch, LAUNCH), ("--cute-launch", a.cute_launch, CUTE_LAUNCH)):
        for item in items:
            key, _, value = item.partition("=")
            if key not in settings or not value:
                raise SystemExit(f"{flag} {item!r}: KEY=VALUE with KEY one of {', '.join(settings)}")
            if value.lower() in ("true", "false"):
                settings[key] = value.lower() == "true"
            else:
                settings[key] = value if isinstance(settings[key], str) else type(settings[key])(value)
    if not a.skip_pass:  # the pass runs through the technique: its betas must be knob values, checked before
        # any GPU work (round 8d built the 4K model before beta 1.25 was refused)
        from vidtune.techniques import get

        for beta in a.pass_betas or []:
            try:
                get("sparse_attention.sol").validate({"beta": beta, "backend": a.backend})
            except ValueError as exc:
                raise SystemExit(f"--pass-betas: {exc}") from None
    device = torch.device("cuda")
    result: dict[str, Any] = {"environment": environment(device), "method": __doc__, "launch": dict(LAUNCH),
                              "cute_launch": dict(CUTE_LAUNCH)}
    path = Path(a.out)
    path.parent.mkdir(parents=True, exist_ok=True)

    def saver(key: str) -> Any:
        """A progress callback: store the rows under ``key`` and rewrite the JSON (a cut run keeps them)."""
        def save(rows: dict[str, Any]) -> None:
            result[key] = rows
            path.write_text(json.dumps(result, indent=2, default=str))
        return save

    if a.check:
        result["check"] = check_kernel(device)
    if a.compare_backends:
        save_cmp = saver("compare_backends")
        save_cmp(compare_backends(a.betas, a.repeats, device, save_cmp))
    if a.sweep:
        result["sweep"] = sweep_launch(1.0, a.repeats, device, a.sweep)
        path.write_text(json.dumps(result, indent=2, default=str))
    if not a.skip_attention:
        save = saver("attention")
        save(bench_attention(a.betas, a.repeats, device, save))
    if not a.skip_pass:
        betas = a.pass_betas
        if betas is None:
            rows = result.get("attention", {}).get("3840x2176x121", {}).get("betas", {})
            allowed = get("sparse_attention.sol").knob("beta").choices
            ok = {float(b): r["density"] for b, r in rows.items() if "density" in r and float(b) in allowed}
            betas = [min(ok, key=lambda b: abs(ok[b] - 0.10)) if ok else 1.5]
        try:
            result["pass_4k"] = bench_pass(betas, a.pass_repeats, device, a.backend)
        except Exception as exc:
            result["pass_4k"] = {"failed": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
        path.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
