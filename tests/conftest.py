"""Shared fixtures: the tiny preset loaded once per session, small requests, CPU threads."""

from __future__ import annotations

import os

import sys

import pytest
import torch

# Without a GPU, Triton kernels run in Triton's interpreter (their CPU tests compare them with the
# PyTorch references). Triton reads TRITON_INTERPRET when it is first imported, so set it before that.
if not torch.cuda.is_available() and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Inductor compiles in this process (its default on 2 cores starts a pool of compile processes, each importing
# torch, in every test process that compiles: the workers share the cores anyway)
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

# Inductor's CPU code without SIMD (scalar C++): the tests check what vidtune does with compiled graphs (caches,
# guards, graph counts, numerics within a tolerance), not Inductor's vector code, whose headers made each graph's
# g++ build the bulk of a compile, and whose ISA probes compiled test programs in every new process (an
# evaluation compiling the tiny VAE decoder in a new process: 42 s -> 34 s, from a loaded compile cache 36 s ->
# 24 s, one core). The subprocesses of the tests inherit it.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")

# (Inductor reads both variables at its config's import, which `import torch` may have done already)
import torch._inductor.config as _inductor_config  # noqa: E402

if os.environ["TORCHINDUCTOR_COMPILE_THREADS"] == "1":
    _inductor_config.compile_threads = 1
if os.environ["TORCHINDUCTOR_VEC_ISA_OK"] == "0":
    _inductor_config.cpp.vec_isa_ok = False

# Ray reads these when it is imported: a local Ray of the tests binds 127.0.0.1 only and writes no token file
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import vidtune  # noqa: F401  (applies the torchaudio import shim first)
from vidtune.model import GenerationRequest, ModelSource, ReferencePipeline, load_models

# Under pytest-xdist (`make test` runs 2 workers on 2 cores) each worker is pinned to its share of the cores, and
# so is every process it starts (Ray actors, the campaigns of the subprocess tests: the affinity is inherited, and
# vidtune sizes its threads by it, vidtune._compat.usable_cores). Sharing the cores by thread counts alone was not
# enough: a campaign's actor on one worker and another's on the other, each sized by the machine's cores, ran a
# generation ~10x slower than alone (measured, 2 cores), and the suite waited on it.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKERS > 1 and _WORKER.startswith("gw") and hasattr(os, "sched_setaffinity"):
    _cores = sorted(os.sched_getaffinity(0))
    _index = int(_WORKER[2:])
    _share = _cores[_index::_WORKERS] or [_cores[_index % len(_cores)]]
    os.sched_setaffinity(0, _share)
from vidtune._compat import usable_cores  # noqa: E402

torch.set_num_threads(max(1, min(2, usable_cores())))

# Module-scoped fixtures that cost a campaign or a model's training: the tests using one run on one xdist worker
# (``--dist loadgroup``), so the fixture is built once, while the other tests spread over the workers.
_SHARED_FIXTURES = ("finished_campaign", "tiny_run", "report", "deeper_tiny", "block_inputs")


# tryfirst: pytest-xdist's worker reads the xdist_group marks in its own pytest_collection_modifyitems (it appends the
# group to each node id there), so the marks must be on the items before that hook runs; without it they came too
# late, and the shared campaign fixture was built on both workers (two setups of ~300 s in a fresh-clone run)
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        shared = [name for name in _SHARED_FIXTURES if name in getattr(item, "fixturenames", ())]
        if shared:
            item.add_marker(pytest.mark.xdist_group(f"{item.module.__name__}:{shared[0]}"))
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


_UNGROUPED = pytest.StashKey[str]()


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """On an xdist worker under --dist loadgroup: the groups must have reached the node ids (xdist's own hook puts
    them there). Where they did not (pytest 9.2 with pytest-xdist 3.8) every shared fixture would be built on every
    worker unnoticed: the grouped tests fail instead, saying why (an error raised here is not shown by xdist)."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid.rsplit("]", 1)[-1]]
    if lost:
        session.config.stash[_UNGROUPED] = (
            f"--dist loadgroup did not group {len(lost)} test(s): pytest {pytest.__version__} and this pytest-xdist "
            f"do not work together (pytest-xdist#1386); install the test extra's pytest (pyproject.toml)")


def pytest_runtest_setup(item):
    problem = item.config.stash.get(_UNGROUPED, None)
    if problem and item.get_closest_marker("xdist_group") is not None:
        pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Materialised preset checkpoints go to a per-session folder, never the user's cache."""
    if "VIDTUNE_CACHE" not in os.environ:
        os.environ["VIDTUNE_CACHE"] = str(tmp_path_factory.mktemp("vidtune-cache"))
    yield


@pytest.fixture()
def compile_backend(monkeypatch):
    """``use(backend)``: every ``torch.compile`` of the test compiles with that backend (``eager``: Dynamo's graph
    capture and guards only; ``aot_eager``: AOTAutograd's trace of the custom ops too) instead of Inductor, whose
    C++ for the CPU is tested elsewhere. Dynamo is reset before and after, so no such graph reaches another test."""
    real_compile = torch.compile

    def use(backend: str) -> None:
        torch._dynamo.reset()
        monkeypatch.setattr(torch, "compile", lambda fn, mode=None, dynamic=None: real_compile(fn, backend=backend,
                                                                                             dynamic=dynamic))

    yield use
    torch._dynamo.reset()


@pytest.fixture(scope="session")
def tiny_models():
    return load_models(ModelSource(preset="tiny"))


@pytest.fixture()
def tiny_pipeline(tiny_models):
    return ReferencePipeline(tiny_models)


@pytest.fixture(scope="session")
def tiny_request():
    return GenerationRequest(prompt="a red circle bouncing", seed=7, height=256, width=384, frames=17, fps=24.0)


@pytest.fixture(scope="session")
def tiny_reference_output(tiny_models, tiny_request):
    """One all-knobs-off run of the tiny preset, shared by tests that compare against it."""
    return ReferencePipeline(tiny_models).run(tiny_request)
