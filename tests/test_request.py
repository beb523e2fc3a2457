"""Every bad request field gives an error naming the field and what is allowed."""

from __future__ import annotations

import pytest

from vidtune.model import GenerationRequest, RequestError


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("height", 100, "request.height must be a positive multiple of 64"),
        ("width", 0, "request.width must be a positive multiple of 64"),
        ("frames", 16, "request.frames must be 8k+1"),
        ("fps", 0, "request.fps must be a positive number"),
        ("fps", -24.0, "request.fps must be a positive number"),
        ("mode", "turbo", "request.mode must be one of ['distilled', 'multistep']"),
        ("seed", -1, "request.seed must be an integer in [0, 2**63 - 1]"),
        ("steps", 0, "request.steps must be an integer in [1, 1000]"),
        ("stage1_sigmas", (1.0, 0.5, 0.7, 0.0), "request.stage1_sigmas must be strictly decreasing"),
        ("cfg_scale", -1.0, "request.cfg_scale must be a number >= 0"),
        ("prompt", "", "request.prompt must be a non-empty string"),
    ],
)
def test_bad_field(field, value, needle):
    with pytest.raises(RequestError) as err:
        GenerationRequest(**{field: value})
    assert needle in str(err.value)
    assert repr(value) in str(err.value) or field in ("prompt", "stage1_sigmas")


def test_unknown_field_named():
    with pytest.raises(RequestError, match=r"unknown request field\(s\) \['heigth'\]"):
        GenerationRequest.from_dict({"heigth": 256})


def test_key_is_stable_and_sensitive():
    a, b = GenerationRequest(seed=1), GenerationRequest(seed=1)
    assert a.key() == b.key()
    assert a.key() != GenerationRequest(seed=2).key()
    assert GenerationRequest(height=1024, width=1536, frames=121).video_tokens(2) == 24_576
