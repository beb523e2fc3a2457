"""Where does the colour die? Luma against chroma in the video VAE's first and last layers (CPU)

    python results/mini/checks/vae_colour_rows.py                    # the shipped ltx2-mini VAE
    python results/mini/checks/vae_colour_rows.py FILE.safetensors   # keys video_encoder.* / video_decoder.*

For the encoder's conv_in: its response (weights summed over the kernel taps) to a flat change of one
colour channel, split into the part common to R, G and B (luma) and the rest (chroma). For the decoder's
conv_out: its output rows per colour, split the same way; with chroma rows near zero the decoder can
only output grey, whatever its features carry. Fresh weights (``train.build``) for comparison. Then
flat colours through the whole VAE.
"""
import sys

import torch

import vidtune  # noqa: F401
from ltx_core.model.video_vae.ops import patchify
from vidtune.model.mini.train import build


def load() -> tuple[torch.nn.Module, torch.nn.Module]:
    if len(sys.argv) > 1:
        from safetensors.torch import load_file

        sd = load_file(sys.argv[1])
        enc, dec = build("video_encoder", "cpu").eval(), build("video_decoder", "cpu").eval()
        enc.load_state_dict({k[len("video_encoder."):]: v.float() for k, v in sd.items() if k.startswith("video_encoder.")})
        dec.load_state_dict({k[len("video_decoder."):]: v.float() for k, v in sd.items() if k.startswith("video_decoder.")})
        return enc, dec
    from vidtune.model.loading import ModelSource, load_models

    m = load_models(ModelSource(preset="ltx2-mini"), device="cpu")
    return m.video_encoder.float().eval(), m.video_decoder.float().eval()


# which patchified channel carries which colour
colour_of = []
for c in range(48):
    for ci in range(3):
        x = torch.zeros(1, 3, 1, 4, 4)
        x[:, ci] = 1
        if patchify(x, patch_size_hw=4, patch_size_t=1)[0, c, 0, 0, 0] > 0:
            colour_of.append(ci)
colour_of = torch.tensor(colour_of)


def split(per_colour: torch.Tensor, dim: int) -> tuple[float, float]:
    luma = per_colour.mean(dim, keepdim=True)
    return float(luma.norm() * 3 ** 0.5), float((per_colour - luma).norm())


enc, dec = load()
for name, e, d in (("trained", enc, dec), ("fresh", build("video_encoder", "cpu"), build("video_decoder", "cpu"))):
    w = e.conv_in.conv.weight.detach().sum((2, 3, 4))  # (128, 48)
    lu, ch = split(torch.stack([w[:, colour_of == ci].sum(1) for ci in range(3)], 1), 1)
    print(f"{name:8s} encoder conv_in response: luma {lu:.3f}, chroma {ch:.3f}")
    w = d.conv_out.conv.weight.detach().sum((2, 3, 4))  # (48, 32)
    lu, ch = split(torch.stack([w[colour_of == ci].mean(0) for ci in range(3)], 0), 0)
    print(f"{name:8s} decoder conv_out rows:     luma {lu:.3f}, chroma {ch:.3f}")
for c in ([-0.3] * 3, [0.3] * 3, [0.8, -0.8, -0.8], [-0.8, -0.6, 0.9], [-0.6, 0.8, -0.6]):
    x = torch.tensor(c)[None, :, None, None, None].expand(1, 3, 9, 128, 128).contiguous()
    with torch.no_grad():
        r = dec(enc(x))
    print("flat", c, "-> centre mean", [round(v, 3) for v in r[0, :, 4, 32:96, 32:96].mean((1, 2)).tolist()])
