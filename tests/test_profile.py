"""The kernel-time profile that explains a benchmark's result (``bench_kernels --profile``)."""

from __future__ import annotations

import json

import pytest

from vidtune.benchmarks.profile import CATEGORIES, kernel_category


@pytest.mark.parametrize("name,category", [
    # kernel names as the H200 reports them, and CPU aten operators
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0", "attention"),
    ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>",
     "attention"),
    ("_sol_attention_kernel", "attention"),
    ("nvjet_tst_256x128_64x4_2x1_v_bz_coopB_TNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>", "gemm"),
    ("triton_tem_fused_mm_0", "gemm"),
    ("triton_poi_fused_add_mul_rsqrt_0", "fused_triton"),
    ("_quantize_rowwise_kernel", "fused_triton"),
    ("quant_rows", "fused_triton"),
    # Inductor's prologue of a compiled attention (seen on the H200): fused elementwise, not attention
    ("triton_poi_fused__fused_rms_norm__scaled_dot_product_cudnn_attention_addcmul_slice_transpose_unsqueeze_view_14",
     "fused_triton"),
    ("triton_red_fused__fused_rms_norm_add_mul_quantize_rowwise_slice_unbind_unsqueeze_view_17", "fused_triton"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>", "elementwise"),
    ("void at::native::(anonymous namespace)::rms_norm_kernel", "elementwise"),
    ("Memcpy DtoD (Device -> Device)", "copy"),
    ("aten::addmm", "gemm"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("aten::copy_", "copy"),
    ("aten::mul", "elementwise"),
])
def test_kernel_categories(name, category):
    assert kernel_category(name) == category


def test_bench_kernels_profiles_baseline_and_setting_on_the_cpu(tmp_path):
    """The benchmark's profile path end to end on the tiny preset (CPU: aten operator self time):
    every category present, shares summing to one, and a transformer pass that is mostly GEMM and
    attention has both."""
    from vidtune.benchmarks.bench_kernels import main

    out = tmp_path / "k.json"
    assert main(["--preset", "tiny", "--device", "cpu", "--sizes", "128x64x9", "--settings", "sdpa_per_kind",
                 "--repeats", "1", "--skip-quality", "--profile", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    profiles = doc["passes"]["128x64x9"]["profile"]
    assert set(profiles) == {"baseline", "sdpa_per_kind"}
    for prof in profiles.values():
        assert set(prof["ms"]) == set(CATEGORIES) and prof["total_ms"] > 0
        assert sum(prof["share"].values()) == pytest.approx(1.0, abs=1e-9)
        assert prof["ms"]["gemm"] > 0 and prof["ms"]["attention"] > 0
        assert prof["top"] and all(t["category"] in CATEGORIES for t in prof["top"])


def test_bench_kernels_times_passes_before_the_quality_check(tmp_path, monkeypatch):
    """The timed passes are saved before the tiny-preset quality check starts, so a run cut during that
    check (an autotuning setting compiles every tiny shape) still returns its timings; the quality
    then lands in the same file."""
    import vidtune.benchmarks.bench_kernels as bk

    out = tmp_path / "k.json"
    seen: dict[str, object] = {}
    real_quality = bk.tiny_quality

    def quality_after_passes(names, device):  # the real check, with a look at the file as it starts
        seen["file_at_quality"] = json.loads(out.read_text())  # what a cut run would have left
        return real_quality(names, device)

    monkeypatch.setattr(bk, "tiny_quality", quality_after_passes)
    assert bk.main(["--preset", "tiny", "--device", "cpu", "--sizes", "128x64x9", "--settings", "sdpa_per_kind",
                    "--repeats", "1", "--out", str(out)]) == 0
    early = seen["file_at_quality"]
    assert early["passes"]["128x64x9"]["settings"]["sdpa_per_kind"]["speedup"] > 0
    assert "tiny_quality" not in early
    final = json.loads(out.read_text())
    assert set(final["tiny_quality"]) == {"noise_floor_flash", "sdpa_per_kind"}
    # another SDPA backend order on the CPU: an exact attention, so near-identical frames
    assert final["tiny_quality"]["sdpa_per_kind"]["psnr_db"] > 40


def test_bench_decode_times_the_decode_of_a_setting_alone_on_the_cpu():
    """benchmarks/bench_decode's child (one process per setting on a GPU): the preset's decoder alone, the setting
    applied through the registry, its first run and steady runs; VAE tiles smaller than the frame change the
    decode's output shape not at all."""
    from vidtune.benchmarks.bench_decode import _child

    plain = _child("tiny", "128x192x9", [], 2, "cpu")
    tiled = _child("tiny", "128x192x9", ["tiling.vae_tiles.spatial_px=64", "tiling.vae_tiles.spatial_overlap_px=32"],
                   2, "cpu")
    assert plain["frames"] == tiled["frames"] == [9, 128, 192, 3]
    for rec in (plain, tiled):
        assert rec["first_run_s"] > 0 and len(rec["runs_ms"]) == 2 and rec["min_ms"] <= rec["median_ms"] <= rec["max_ms"]
    assert tiled["knobs"] == ["tiling.vae_tiles.spatial_px=64", "tiling.vae_tiles.spatial_overlap_px=32"]
