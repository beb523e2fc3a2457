"""Import-time compatibility for CPU-only machines.

ltx-core 1.0.0 imports torchaudio at module level (only its audio *encoder* uses it). PyPI's
torchaudio wheel is a CUDA build whose native extension fails to load beside the CPU torch wheel
(``libc10_cuda.so``; ENVIRONMENT.md). vidtune never runs the audio encoder, so when the native
extension cannot load we register an empty ``torchaudio._extension`` module before the import. This
runs on ``import vidtune``, so every process that imports vidtune (Ray workers included) gets it; with a
working torchaudio (the CUDA torch on the GPU machine) nothing is changed.
"""

from __future__ import annotations

import importlib
import sys
import types

__all__ = ["ensure_torchaudio_importable", "TORCHAUDIO_STUBBED"]

TORCHAUDIO_STUBBED = False


def _passthrough(*args, **kwargs):
    """Stand-in for the extension's decorators (``fail_if_no_align`` ...): return the function as is."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return None


def _extension_stub() -> types.ModuleType:
    stub = types.ModuleType("torchaudio._extension")
    stub._IS_TORCHAUDIO_EXT_AVAILABLE = False  # type: ignore[attr-defined]
    stub._IS_ALIGN_AVAILABLE = False  # type: ignore[attr-defined]
    def getattr_(name: str):
        if name.startswith("__"):  # module protocol lookups (__file__, __path__ ...) must fail normally
            raise AttributeError(name)
        return _passthrough

    stub.__getattr__ = getattr_  # type: ignore[attr-defined]
    return stub


def ensure_torchaudio_importable() -> bool:
    """Make ``import torchaudio`` succeed; return True when the native extension was stubbed."""
    global TORCHAUDIO_STUBBED
    if "torchaudio" in sys.modules:
        return TORCHAUDIO_STUBBED
    try:
        importlib.import_module("torchaudio")
        return False
    except ModuleNotFoundError:
        # No torchaudio at all (the GPU image): ltx-core's audio ops only need the name at import.
        stub = types.ModuleType("torchaudio")
        stub.__dict__["__vidtune_stub__"] = True
        sys.modules["torchaudio"] = stub
        TORCHAUDIO_STUBBED = True
        return True
    except OSError:
        for name in [n for n in sys.modules if n == "torchaudio" or n.startswith("torchaudio.")]:
            del sys.modules[name]
        sys.modules["torchaudio._extension"] = _extension_stub()
        importlib.import_module("torchaudio")
        TORCHAUDIO_STUBBED = True
        return True
