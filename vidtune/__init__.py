"""vidtune: find, by measurement, how to run a video diffusion pipeline faster without changing it.

The subpackages live in the repository's top-level folders (``model/``, ``techniques/``, ``search/``,
``integrator/``, ``kernels/``) and are installed as ``vidtune.model`` and so on by setuptools'
``package-dir`` mapping, so no generic top-level module (``model``, ``kernels``) is ever installed.
"""

from __future__ import annotations

from pathlib import Path

from vidtune._compat import ensure_torchaudio_importable, fast_cpu_convolutions

__version__ = "0.1.0"

# Running from a source checkout (tests, `python -m vidtune.cli` in the repo): the subpackages sit
# beside this folder, not inside it. Extending __path__ to the checkout root resolves `vidtune.model`
# to `<root>/model` exactly as the installed mapping does. Installed copies never take this branch.
_root = Path(__file__).resolve().parent.parent
if (_root / "pyproject.toml").is_file() and (_root / "model" / "pipeline.py").is_file():
    __path__.append(str(_root))  # type: ignore[name-defined]

ensure_torchaudio_importable()
fast_cpu_convolutions()  # bf16 convolutions on CPUs without AVX512 (vidtune/_compat.py)
