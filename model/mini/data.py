"""Procedural audio-video clips for training and evaluating ``ltx2-mini``, seeded and device-agnostic.

A scene is one to three shapes (circle, square, triangle; named colours) moving in straight lines and
bouncing off the frame edges, over a textured background that the camera may pan slowly. The sound
is synchronised with the picture: every shape hums a tone set by its colour (louder in the ear on its
side of the frame) and every bounce makes a click at the exact time it happens. The prompt describes
the scene ("a red circle and a blue square bouncing, camera panning left").

Everything is a closed-form function of the scene and time, so a clip can be rendered at any size,
frame rate or sample rate on any device, and the bounce times are known exactly (tests and the
audio-sync evidence use them).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

__all__ = ["COLOURS", "TONES", "SHAPES", "PANS", "Shape", "Scene", "sample_scene", "render_video", "render_audio",
           "bounce_times", "positions"]

# Colours far apart in RGB, so prompt adherence can be measured from the frames.
COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.90, 0.12, 0.12),
    "green": (0.15, 0.80, 0.20),
    "blue": (0.15, 0.30, 0.95),
    "yellow": (0.95, 0.88, 0.15),
    "magenta": (0.90, 0.20, 0.85),
    "cyan": (0.15, 0.85, 0.90),
    "white": (0.97, 0.97, 0.97),
}
# The tone each colour hums (Hz): a pentatonic-ish ladder, no two within a semitone.
TONES: dict[str, float] = {"red": 220.0, "green": 262.0, "blue": 330.0, "yellow": 392.0, "magenta": 440.0,
                           "cyan": 523.0, "white": 659.0}
SHAPES = ("circle", "square", "triangle")
PANS = ("none", "left", "right", "up", "down")
PAN_SPEED = 0.08  # fraction of the frame width (or height) per second
CLICK_S = 0.006  # click length
CLICK_HZ = 3000.0


@dataclass(frozen=True)
class Shape:
    kind: str
    colour: str
    size: float  # half-size as a fraction of min(height, width)
    x0: float  # centre at t=0, fraction of the width
    y0: float  # fraction of the height
    vx: float  # frame widths per second
    vy: float  # frame heights per second


@dataclass(frozen=True)
class Scene:
    shapes: tuple[Shape, ...]
    pan: str
    texture_seed: int
    background: tuple[float, float, float]

    @property
    def prompt(self) -> str:
        parts = [f"a {s.colour} {s.kind}" for s in self.shapes]
        text = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
        text += " bouncing"
        if self.pan != "none":
            text += f", camera panning {self.pan}"
        return text


def sample_scene(seed: int, max_shapes: int = 3, pan_probability: float = 0.5) -> Scene:
    """A random scene, a pure function of ``seed`` (Python's ``random``: same on every machine)."""
    rng = random.Random(seed)
    n = rng.randint(1, max_shapes)
    colours = rng.sample(sorted(COLOURS), n)  # distinct colours: a prompt names each once
    shapes = []
    for colour in colours:
        size = rng.uniform(0.08, 0.16)
        speed = rng.uniform(0.35, 0.9)
        angle = rng.uniform(0, 2 * math.pi)
        shapes.append(Shape(kind=rng.choice(SHAPES), colour=colour, size=size,
                            x0=rng.uniform(0.2, 0.8), y0=rng.uniform(0.2, 0.8),
                            vx=speed * math.cos(angle), vy=speed * math.sin(angle)))
    pan = rng.choice(PANS[1:]) if rng.random() < pan_probability else "none"
    grey = rng.uniform(0.25, 0.45)
    tint = [rng.uniform(-0.06, 0.06) for _ in range(3)]
    return Scene(tuple(shapes), pan, rng.randrange(1 << 30), tuple(grey + t for t in tint))


def _half_extent(shape: Shape, height: int, width: int) -> tuple[float, float]:
    r = shape.size * min(height, width)
    return r / width, r / height


def _fold(u0: float, v: float, lo: float, hi: float, t: torch.Tensor) -> torch.Tensor:
    """Position of a point bouncing between lo and hi (triangle wave of the unfolded path)."""
    span = hi - lo
    u = (u0 - lo) + v * t
    m = torch.remainder(u, 2 * span)
    return lo + torch.where(m <= span, m, 2 * span - m)


def positions(scene: Scene, t: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Shape centres at times ``t`` (seconds): [len(t), shapes, 2] as (x, y) fractions of the frame."""
    out = []
    for s in scene.shapes:
        rx, ry = _half_extent(s, height, width)
        out.append(torch.stack([_fold(s.x0, s.vx, rx, 1 - rx, t), _fold(s.y0, s.vy, ry, 1 - ry, t)], dim=-1))
    return torch.stack(out, dim=1)


def bounce_times(scene: Scene, duration: float, height: int, width: int) -> list[tuple[float, int]]:
    """(time in seconds, shape index) of every bounce in [0, duration), sorted by time."""
    events = []
    for i, s in enumerate(scene.shapes):
        rx, ry = _half_extent(s, height, width)
        for p0, v, lo, hi in ((s.x0, s.vx, rx, 1 - rx), (s.y0, s.vy, ry, 1 - ry)):
            if abs(v) < 1e-9:
                continue
            span = hi - lo
            u0 = p0 - lo
            # walls are crossed where the unfolded path u0 + v t reaches a multiple of span
            k = math.floor(u0 / span) + (1 if v > 0 else 0)
            while True:
                t = (k * span - u0) / v
                if t >= duration:
                    break
                if t > 0:
                    events.append((t, i))
                k += 1 if v > 0 else -1
    return sorted(events)


def _texture(scene: Scene, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """Background at world coordinates (fractions of the frame): [..., 3]."""
    rng = random.Random(scene.texture_seed)
    base = torch.tensor(scene.background, dtype=xs.dtype, device=xs.device)
    value = torch.zeros_like(xs)
    for _ in range(5):
        fx, fy = rng.uniform(-9, 9), rng.uniform(-6, 6)
        value = value + rng.uniform(0.02, 0.05) * torch.sin(2 * math.pi * (fx * xs + fy * ys) + rng.uniform(0, 6.3))
    tint = torch.tensor([rng.uniform(0.6, 1.4) for _ in range(3)], dtype=xs.dtype, device=xs.device)
    return (base + value[..., None] * tint).clamp(0, 1)


def _pan_offset(scene: Scene, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # the camera moving left makes the world appear to move right: sample the world further left
    dx = {"left": -1.0, "right": 1.0}.get(scene.pan, 0.0) * PAN_SPEED * t
    dy = {"up": -1.0, "down": 1.0}.get(scene.pan, 0.0) * PAN_SPEED * t
    return dx, dy


def _sdf(kind: str, px: torch.Tensor, py: torch.Tensor, r: float) -> torch.Tensor:
    """Signed distance (pixels) to a shape of half-size ``r`` centred at the origin."""
    if kind == "circle":
        return torch.sqrt(px * px + py * py) - r
    if kind == "square":
        return torch.maximum(px.abs(), py.abs()) - r
    # equilateral triangle pointing up, circumradius r: distance to the three edge lines
    k = math.sqrt(3.0)
    e1 = (k * px - py) / 2 - r / 2  # right edge
    e2 = (-k * px - py) / 2 - r / 2  # left edge
    e3 = py - r / 2  # bottom edge (y grows downwards)
    return torch.maximum(torch.maximum(e1, e2), e3)


def render_video(scene: Scene, frames: int, height: int, width: int, fps: float,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """Frames [F, H, W, 3], float32 in [0, 1] (anti-aliased edges: one pixel of soft coverage)."""
    t = torch.arange(frames, dtype=torch.float32, device=device) / fps
    ys = (torch.arange(height, dtype=torch.float32, device=device) + 0.5) / height
    xs = (torch.arange(width, dtype=torch.float32, device=device) + 0.5) / width
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    dx, dy = _pan_offset(scene, t)
    img = _texture(scene, gx[None] + dx[:, None, None], gy[None] + dy[:, None, None])  # [F, H, W, 3]
    centres = positions(scene, t, height, width)  # [F, S, 2]
    px_x, px_y = gx * width, gy * height
    for i, s in enumerate(scene.shapes):
        cx = centres[:, i, 0, None, None] * width
        cy = centres[:, i, 1, None, None] * height
        d = _sdf(s.kind, px_x[None] - cx, px_y[None] - cy, s.size * min(height, width))
        alpha = (0.5 - d).clamp(0, 1)[..., None]
        colour = torch.tensor(COLOURS[s.colour], dtype=torch.float32, device=device)
        img = img * (1 - alpha) + colour * alpha
    return img


def render_audio(scene: Scene, duration: float, height: int, width: int, sample_rate: int = 24000,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """Stereo audio [2, samples], float32 in [-1, 1]: a hum per shape, a click per bounce."""
    n = int(round(duration * sample_rate))
    t = torch.arange(n, dtype=torch.float32, device=device) / sample_rate
    out = torch.zeros(2, n, dtype=torch.float32, device=device)
    # the hum follows the shape across the stereo field, at the video's positions (sampled per 10 ms)
    coarse = torch.arange(0, duration + 0.01, 0.01, dtype=torch.float32, device=device)
    xs = positions(scene, coarse, height, width)[..., 0]  # [T, S]
    idx = torch.clamp((t / 0.01).long(), max=len(coarse) - 1)
    for i, s in enumerate(scene.shapes):
        hum = 0.08 * torch.sin(2 * math.pi * TONES[s.colour] * t)
        x = xs[idx, i]
        out[0] += hum * (1.2 - x) / 1.2
        out[1] += hum * (0.2 + x) / 1.2
    click_n = int(CLICK_S * sample_rate)
    tc = torch.arange(click_n, dtype=torch.float32, device=device) / sample_rate
    click = 0.6 * torch.sin(2 * math.pi * CLICK_HZ * tc) * torch.exp(-tc / (CLICK_S / 4))
    for time, _ in bounce_times(scene, duration, height, width):
        start = int(round(time * sample_rate))
        end = min(n, start + click_n)
        out[:, start:end] += click[: end - start]
    return out.clamp(-1, 1)
