"""LDR-FLIP (Andersson et al., "FLIP: A Difference Evaluator for Alternating Images", HPG 2020) in PyTorch,
so that the perceptual metric runs where the frames are (a trial's GPU) instead of on the host.

Why a second implementation beside ``flip-evaluator`` (NVIDIA's C++ library, the one the metric was
calibrated with): a trial's frames live on the GPU, and the library runs on the host, one frame at a time,
at 2.2 s for a 1024x1536 frame on this repository's 2-core CPU; on a GPU this one needs no host copy of
the frames and runs a frame as a few dozen small convolutions. The tests (``tests/test_metrics_media.py``)
hold it to the library's per-pixel map within 1e-5 on the CPU, and on a GPU (``-m gpu``) within 2e-5 (the
H200 differed by 1.05e-5 at most), where they also time both: 9.6-11.8 ms a 1024x1536 frame on the H200
against 1.3-2.3 s for the library on that machine's host, 2026-12-02. On the CPU the library is the faster (0.13-0.18 s against 0.24-0.6 s at 256x384, measured
under load), so ``search/metrics.py`` calls the library there.

The model, from the paper (constants are the paper's and the sRGB / CIE standards'):
- colour: sRGB -> linear RGB -> XYZ -> YCxCz (an opponent space, D65 white); each channel filtered by its
  contrast sensitivity function (sums of Gaussians in visual degrees, at ``ppd`` pixels per degree, on a
  square support of radius ``ceil(3 sqrt(b_max / 2 pi^2) ppd)``, normalised to sum 1); back to linear RGB,
  clamped to [0, 1]; CIELAB with the Hunt adjustment (a, b scaled by L / 100); HyAB distance, raised to 0.7
  and mapped to [0, 1] against the distance between green and blue (95% of the range for the first 40%);
- features: on the unfiltered luminance Y / Y_white, first and second derivatives of a Gaussian (standard
  deviation 0.041 degrees, support 3 sd, positive and negative weights each normalised to 1) find edges
  and points; the larger difference of their magnitudes, over sqrt 2, to the power 0.5;
- per pixel: colour error ** (1 - feature error).
All filters are Gaussians or Gaussian derivatives on square supports, so each is applied as two 1-D
passes (exactly the same sums), with the borders replicated.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F

__all__ = ["flip_map", "flip_mean", "DEFAULT_PPD"]

# a 0.7 m wide 4K monitor seen from 0.7 m: the library's default observer
DEFAULT_PPD = 0.7 * 3840 / 0.7 * math.pi / 180

_WHITE = (0.950428545, 1.0, 1.088900371)  # D65, XYZ
# linear sRGB -> XYZ (D65) and its inverse
_RGB2XYZ = ((10135552 / 24577794, 8788810 / 24577794, 4435075 / 24577794),
            (2613072 / 12288897, 8788810 / 12288897, 887015 / 12288897),
            (1425312 / 73733382, 8788810 / 73733382, 70074185 / 73733382))
_XYZ2RGB = ((3.241003275, -1.537398934, -0.498615861),
            (-0.969224334, 1.875930071, 0.041554224),
            (0.055639423, -0.204011202, 1.057148933))
# contrast sensitivity: (a1, b1, a2, b2) of a1 sqrt(pi/b1) exp(-pi^2 r^2 / b1) + a2 ..., r in degrees
_CSF = {"A": (1.0, 0.0047, 0.0, 1e-5), "RG": (1.0, 0.0053, 0.0, 1e-5), "BY": (34.1, 0.04, 13.5, 0.025)}
_QC, _QF, _PC, _PT = 0.7, 0.5, 0.4, 0.95
_FEATURE_WIDTH_DEG = 0.082  # peak to trough of the edge detector: 2 standard deviations


def _mix(x: torch.Tensor, matrix: tuple) -> torch.Tensor:
    m = torch.tensor(matrix, dtype=x.dtype, device=x.device)
    return torch.einsum("ij,njhw->nihw", m, x)


def _srgb_to_linear(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0.04045, ((x + 0.055) / 1.055) ** 2.4, x / 12.92)


def _white(x: torch.Tensor) -> torch.Tensor:
    return torch.tensor(_WHITE, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)


def _xyz_to_ycxcz(xyz: torch.Tensor) -> torch.Tensor:
    n = xyz / _white(xyz)
    x, y, z = n[:, 0:1], n[:, 1:2], n[:, 2:3]
    return torch.cat((116 * y - 16, 500 * (x - y), 200 * (y - z)), 1)


def _ycxcz_to_xyz(o: torch.Tensor) -> torch.Tensor:
    y = (o[:, 0:1] + 16) / 116
    return torch.cat((y + o[:, 1:2] / 500, y, y - o[:, 2:3] / 200), 1) * _white(o)


def _hunt_lab(rgb: torch.Tensor) -> torch.Tensor:
    """Linear RGB -> CIELAB (D65) with the Hunt adjustment."""
    n = _mix(rgb, _RGB2XYZ) / _white(rgb)
    d = 6 / 29
    f = torch.where(n > d ** 3, n.clamp_min(0) ** (1 / 3), n / (3 * d * d) + 4 / 29)
    lum = 116 * f[:, 1:2] - 16
    return torch.cat((lum, 0.01 * lum * 500 * (f[:, 0:1] - f[:, 1:2]), 0.01 * lum * 200 * (f[:, 1:2] - f[:, 2:3])), 1)


def _hyab(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    d = a - b
    return d[:, 0:1].abs() + torch.sqrt(d[:, 1:2] ** 2 + d[:, 2:3] ** 2)


@lru_cache(maxsize=16)
def _csf_terms(ppd: float, channel: str) -> list[tuple[float, tuple[float, ...]]]:
    """The channel's 2-D filter as a sum of separable terms: (weight, 1-D taps), the 2-D kernel summing to 1."""
    b_max = max(v for p in _CSF.values() for v in (p[1], p[3]))
    r = int(math.ceil(3 * math.sqrt(b_max / (2 * math.pi ** 2)) * ppd))
    xs = torch.arange(-r, r + 1, dtype=torch.float64) / ppd
    a1, b1, a2, b2 = _CSF[channel]
    terms = [(a * math.sqrt(math.pi / b), torch.exp(-math.pi ** 2 * xs ** 2 / b)) for a, b in ((a1, b1), (a2, b2)) if a]
    total = sum(w * float(t.sum()) ** 2 for w, t in terms)
    return [(w / total, tuple(t.tolist())) for w, t in terms]


@lru_cache(maxsize=16)
def _feature_taps(ppd: float, kind: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(across, along): the detector's 1-D taps across the feature (derivative, positive and negative parts
    each normalised to 1) and along it (a Gaussian normalised to 1); their outer product is the 2-D kernel."""
    sd = 0.5 * _FEATURE_WIDTH_DEG * ppd
    r = int(math.ceil(3 * sd))
    x = torch.arange(-r, r + 1, dtype=torch.float64)
    g = torch.exp(-x ** 2 / (2 * sd * sd))
    h = -x * g if kind == "edge" else (x ** 2 / (sd * sd) - 1) * g
    h = torch.where(h < 0, h / -h[h < 0].sum(), h / h[h > 0].sum())
    return tuple(h.tolist()), tuple((g / g.sum()).tolist())


def _separable(x: torch.Tensor, along_w: tuple[float, ...], along_h: tuple[float, ...]) -> torch.Tensor:
    """Correlate every channel of ``x`` [N, C, H, W] with ``along_h`` (rows) x ``along_w`` (columns), replicated
    borders (OpenCV's filter2D with BORDER_REPLICATE, as the reference implementation filters)."""
    c = x.shape[1]
    kw = torch.tensor(along_w, dtype=x.dtype, device=x.device).view(1, 1, 1, -1).expand(c, 1, 1, -1)
    kh = torch.tensor(along_h, dtype=x.dtype, device=x.device).view(1, 1, -1, 1).expand(c, 1, -1, 1)
    rw, rh = len(along_w) // 2, len(along_h) // 2
    x = F.conv2d(F.pad(x, (rw, rw, 0, 0), mode="replicate"), kw, groups=c)
    return F.conv2d(F.pad(x, (0, 0, rh, rh), mode="replicate"), kh, groups=c)


def _csf_filter(ycxcz: torch.Tensor, ppd: float) -> torch.Tensor:
    out = []
    for i, channel in enumerate(("A", "RG", "BY")):
        ch = ycxcz[:, i:i + 1]
        out.append(sum(w * _separable(ch, taps, taps) for w, taps in _csf_terms(ppd, channel)))
    return torch.cat(out, 1)


def _features(lum: torch.Tensor, ppd: float, kind: str) -> torch.Tensor:
    """Magnitude of the (x, y) detector responses of a luminance image [N, 1, H, W]."""
    across, along = _feature_taps(ppd, kind)
    fx = _separable(lum, across, along)
    fy = _separable(lum, along, across)
    return torch.sqrt(fx ** 2 + fy ** 2)


def _colour_max(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    green = torch.tensor([0.0, 1.0, 0.0], dtype=dtype, device=device).view(1, 3, 1, 1)
    blue = torch.tensor([0.0, 0.0, 1.0], dtype=dtype, device=device).view(1, 3, 1, 1)
    return _hyab(_hunt_lab(green), _hunt_lab(blue)) ** _QC


def flip_map(reference: torch.Tensor, test: torch.Tensor, ppd: float = DEFAULT_PPD) -> torch.Tensor:
    """Per-pixel LDR-FLIP error in [0, 1] of ``test`` against ``reference``: uint8 (0..255) or float (0..1) sRGB
    frames [N, H, W, 3] (or one [H, W, 3]) on any device; returns [N, H, W] float32 on that device."""
    if reference.shape != test.shape or reference.shape[-1] != 3:
        raise ValueError(f"FLIP needs two RGB frame stacks of one shape [..., H, W, 3], got {tuple(reference.shape)} "
                         f"and {tuple(test.shape)}")
    single = reference.dim() == 3

    def prepare(x: torch.Tensor) -> torch.Tensor:
        x = x.unsqueeze(0) if single else x
        x = x.float() / 255.0 if not x.is_floating_point() else x.float()
        return x.permute(0, 3, 1, 2)

    with _full_float32():
        return _flip(prepare(reference), prepare(test), ppd).squeeze(1)[0 if single else slice(None)]


def _flip(reference: torch.Tensor, test: torch.Tensor, ppd: float) -> torch.Tensor:
    """FLIP of float sRGB [N, 3, H, W] -> [N, 1, H, W]."""
    ycxcz = [_xyz_to_ycxcz(_mix(_srgb_to_linear(x), _RGB2XYZ)) for x in (reference, test)]
    # colour
    lab = [_hunt_lab(_mix(_ycxcz_to_xyz(_csf_filter(o, ppd)), _XYZ2RGB).clamp(0.0, 1.0)) for o in ycxcz]
    cmax = _colour_max(lab[0].dtype, lab[0].device)
    power = _hyab(lab[0], lab[1]) ** _QC
    knee = _PC * cmax
    colour = torch.where(power < knee, (_PT / knee) * power, _PT + (power - knee) / (cmax - knee) * (1.0 - _PT))
    # features, on Y / Y_white of the unfiltered images
    lum = [(o[:, 0:1] + 16) / 116 for o in ycxcz]
    edge = (_features(lum[0], ppd, "edge") - _features(lum[1], ppd, "edge")).abs()
    point = (_features(lum[0], ppd, "point") - _features(lum[1], ppd, "point")).abs()
    feature = (torch.maximum(edge, point) / math.sqrt(2)) ** _QF
    return colour ** (1 - feature)


def flip_mean(reference: torch.Tensor, test: torch.Tensor, ppd: float = DEFAULT_PPD) -> torch.Tensor:
    """Mean FLIP error of each frame, [N] (a scalar for one frame), on the frames' device, one frame at a time
    (so the working set is one frame's intermediate maps, whatever the video's length)."""
    one = reference.dim() == 3
    ref, out = (reference.unsqueeze(0), test.unsqueeze(0)) if one else (reference, test)
    means = torch.stack([flip_map(r, o, ppd).mean() for r, o in zip(ref, out)]) if len(ref) else torch.zeros(0)
    return means[0] if one else means


def _full_float32():
    """cuDNN convolutions in full float32: its default TF32 (10-bit mantissa) would move the filtered colours
    by ~1e-3, far above the 1e-5 agreement with the library."""
    b = torch.backends.cudnn
    return b.flags(enabled=b.enabled, benchmark=b.benchmark, deterministic=b.deterministic, allow_tf32=False)
