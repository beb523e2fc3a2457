"""What the quality metrics cost a trial on the H200: ``quality()`` on 121 frames at 1024x1536 and at
2176x3840 with the frames already on the GPU (where a trial's decode leaves them), candidate = baseline +
noise; 3 timed calls after one warm call, CUDA-synchronised wall time. Run: python3 quality_cost.py"""

import json
import time

import torch

from vidtune.search.metrics import quality

out = {}
for h, w in ((1024, 1536), (2176, 3840)):
    g = torch.Generator(device="cuda").manual_seed(0)
    ref = torch.randint(0, 256, (121, h, w, 3), generator=g, device="cuda", dtype=torch.uint8)
    cand = (ref.int() + torch.randint(-6, 7, ref.shape, generator=g, device="cuda", dtype=torch.int32)).clamp(0, 255).to(torch.uint8)
    audio = torch.randn(2, 5 * 16000, generator=torch.Generator().manual_seed(1))
    noisy = audio + 0.01 * torch.randn(audio.shape, generator=torch.Generator().manual_seed(2))
    quality(ref, audio, cand, noisy, fps=24.0, sample_rate=16000)
    times = []
    for _ in range(3):
        torch.cuda.synchronize()
        t = time.perf_counter()
        q = quality(ref, audio, cand, noisy, fps=24.0, sample_rate=16000)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    out[f"{h}x{w}x121"] = {"seconds": times, "median_s": sorted(times)[1], "quality": q.to_dict()}
    print(f"{h}x{w}x121: quality() {sorted(times)[1]:.3f} s (runs {', '.join(f'{x:.3f}' for x in times)})", flush=True)
    del ref, cand
print(json.dumps(out, default=str))
