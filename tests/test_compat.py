"""Import-time compatibility: half-precision CPU convolutions on CPUs without AVX512 (vidtune/_compat.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from vidtune import _compat


@pytest.fixture()
def restore_functional():
    saved = {name: getattr(F, name) for name in _compat.CPU_CONV_FUNCTIONS}
    yield
    for name, fn in saved.items():
        setattr(F, name, fn)


def _conv_inputs(dims: int):
    g = torch.Generator().manual_seed(dims)
    x = torch.randn(1, 4, *([6] * dims), generator=g).bfloat16()
    w = torch.randn(5, 4, *([3] * dims), generator=g).bfloat16()
    b = torch.randn(5, generator=g).bfloat16()
    return x, w, b


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_forced_upcast_computes_in_float32_and_rounds_once(monkeypatch, restore_functional, dims):
    monkeypatch.setenv("VIDTUNE_CPU_CONV", "float32")
    assert _compat.fast_cpu_convolutions() == {torch.bfloat16, torch.float16}
    conv = getattr(F, f"conv{dims}d")
    plain = conv.__vidtune_upcast__
    x, w, b = _conv_inputs(dims)
    out = conv(x, w, b, padding=1)
    assert out.dtype == torch.bfloat16 and out.shape == plain(x, w, b, padding=1).shape
    assert torch.equal(out, plain(x.float(), w.float(), b.float(), padding=1).bfloat16())
    # float32 inputs and keyword bias go through unchanged
    assert torch.equal(conv(x.float(), w.float(), bias=b.float()), plain(x.float(), w.float(), b.float()))
    # installing twice wraps the original once, not the wrapper
    _compat.fast_cpu_convolutions()
    assert getattr(F, f"conv{dims}d").__vidtune_upcast__ is plain


def test_modules_and_transposed_convolutions_take_the_replaced_functions(monkeypatch, restore_functional):
    monkeypatch.setenv("VIDTUNE_CPU_CONV", "float32")
    _compat.fast_cpu_convolutions()
    seen = []
    original = F.conv_transpose1d
    monkeypatch.setattr(F, "conv_transpose1d", lambda *a, **k: seen.append("t") or original(*a, **k))
    layer = torch.nn.ConvTranspose1d(4, 3, 4, stride=2).bfloat16()
    x = torch.randn(1, 4, 8).bfloat16()
    out = layer(x)
    assert seen == ["t"] and out.dtype == torch.bfloat16
    assert torch.equal(out, original.__vidtune_upcast__(x.float(), layer.weight.float(), layer.bias.float(),
                                                          stride=2).bfloat16())


def test_native_keeps_pytorchs_kernels_and_a_bad_value_is_named(monkeypatch, restore_functional):
    monkeypatch.setenv("VIDTUNE_CPU_CONV", "native")
    before = F.conv3d
    assert _compat.fast_cpu_convolutions() == frozenset() and F.conv3d is before
    monkeypatch.setenv("VIDTUNE_CPU_CONV", "fp32")
    with pytest.raises(ValueError, match="VIDTUNE_CPU_CONV must be one of auto, native, float32, got 'fp32'"):
        _compat.fast_cpu_convolutions()


def test_auto_upcasts_exactly_where_pytorch_lacks_the_fast_kernel():
    """Each half-precision dtype is upcast exactly where this CPU lacks oneDNN's kernel for it, and the functions
    are replaced when any is (a CPU with bf16 but not fp16 kernels, AVX512-BF16 without AVX512-FP16, upcasts
    float16 alone)."""
    code = ("import torch, vidtune, torch.nn.functional as F; from vidtune import _compat; "
            "m = torch.backends.mkldnn.is_available(); "
            "print(m and torch.ops.mkldnn._is_mkldnn_bf16_supported(), m and torch.ops.mkldnn._is_mkldnn_fp16_supported(), "
            "torch.bfloat16 in _compat.CPU_CONV_UPCAST, torch.float16 in _compat.CPU_CONV_UPCAST, "
            "hasattr(F.conv3d, '__vidtune_upcast__'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "VIDTUNE_CPU_CONV": "auto"}).stdout.split()
    bf16_fast, fp16_fast, bf16_up, fp16_up, replaced = (v == "True" for v in out)
    assert bf16_up == (not bf16_fast) and fp16_up == (not fp16_fast)
    assert replaced == (bf16_up or fp16_up)


def test_under_cpu_autocast_the_convolution_computes_in_float32_and_gives_autocasts_dtype(monkeypatch,
                                                                                         restore_functional):
    monkeypatch.setenv("VIDTUNE_CPU_CONV", "float32")
    _compat.fast_cpu_convolutions()
    layer = torch.nn.Conv2d(4, 5, 3, padding=1)  # float32 weights, as a trainer's
    x = torch.randn(1, 4, 6, 6, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, F.conv2d.__vidtune_upcast__(x, layer.weight, layer.bias, padding=1).bfloat16())
    out.float().sum().backward()  # gradients reach the float32 leaves
    assert x.grad is not None and layer.weight.grad.dtype == torch.float32
