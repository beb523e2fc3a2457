"""docs/architecture.md's "Adding a technique" example is real code: registered from the page, it passes the
conformance checks every built-in technique passes, and a broken copy of it fails them."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
import torch

from conformance import check_apply_undo, check_bad_values, check_neutral, check_off, check_seams, valid_samples
from vidtune.techniques import get
from vidtune.techniques.registry import unregister

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
NAME = "memory.upsample_inference_mode"


def _example_source() -> str:
    section = DOC.read_text().split("## Adding a technique", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the section holds one example module"
    return blocks[0]


def _register(source: str):
    module = types.ModuleType("docs_example")
    exec(compile(source, str(DOC), "exec"), module.__dict__)
    return get(NAME)


@pytest.fixture()
def example():
    technique = _register(_example_source())
    yield technique
    unregister(NAME)


def test_the_documented_example_passes_the_conformance_checks(example, tiny_models, tiny_request, tiny_reference_output):
    assert example.family == "memory" and example.stages == ("upsample",)
    check_off(example, tiny_models, tiny_request, tiny_reference_output)
    assert check_neutral(example, tiny_models, tiny_request, tiny_reference_output)
    samples = valid_samples(example, 1, 10)
    assert check_apply_undo(example, tiny_models, tiny_request, tiny_reference_output, samples) >= 1
    check_bad_values(example)
    assert check_seams(example, tiny_models, tiny_request, [{"enabled": True}]) >= 1


def test_a_broken_copy_of_the_example_fails_them(tiny_models, tiny_request, tiny_reference_output):
    """The same module with the upsample's output nudged: the neutral check sees the change."""
    broken = _example_source().replace("return original(video_latent).clone()",
                                       "return original(video_latent).clone() + 0.05")
    technique = _register(broken)
    try:
        assert not _passes_neutral(technique, tiny_models, tiny_request, tiny_reference_output)
    finally:
        unregister(NAME)


def _passes_neutral(technique, models, request, reference) -> bool:
    try:
        return bool(check_neutral(technique, models, request, reference))
    except AssertionError:
        return False


def test_the_example_is_not_shipped():
    """The example lives in the docs only: the registry of the package does not hold it."""
    from vidtune.techniques import registered

    assert NAME not in {t.name for t in registered()}
    assert torch.is_inference_mode_enabled() is False
