"""The reference two-stage LTX-2 pipeline, device-agnostic, with seams for techniques.

It follows ``ltx_pipelines.distilled.DistilledPipeline`` and ``ti2vid_two_stages.TI2VidTwoStagesPipeline``
step for step (same ltx-core helpers, same noise order, same guidance code) so that with every knob off
it reproduces them bit for bit (tests/test_fidelity.py). What it adds:

* stages as separate calls on plain tensors (``stage1``, ``upsample``, ``stage2``, ``decode_video``,
  ``decode_audio``); the noise generator's state travels with the latents, so a later stage started
  from a stored earlier output continues exactly as the full run would;
* every transformer pass goes through ``run_pass`` with a named pass (``cond``, ``uncond``, ``stg``,
  ``modality``) and a ``StepContext`` (stage, step, sigma, tile), the seam that caching and
  parallelism techniques wrap;
* stage 2 can be denoised in overlapping spatial tiles (``model/tiles.py``);
* attention modules are reachable per kind (``attention_modules``), the seam of kernel choice and
  sparse attention.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any, Callable

import torch

from vidtune.model.generation import (  # noqa: F401  (re-exported: the pipeline's API)
    ATTENTION_KINDS, STAGES, GenerationOutput, StageLatents, StepContext, cpu_safe_cuda_sync, PassRouter, read_once,
    sync_if_cuda, default_vae_tiling, rope_grids_on, stage_steps, to_device_at_once)
from vidtune.model.loading import Models
from vidtune.model.request import GenerationRequest
from vidtune.model.text import DEFAULT_NEGATIVE_PROMPT, PromptContexts, load_embedding_file, standin_context
from vidtune.model.tiles import Stage2Tiling, denoised_area_factor, plan_tiles

__all__ = [
    "ATTENTION_KINDS",
    "STAGES",
    "GenerationOutput",
    "ReferencePipeline",
    "StageLatents",
    "StepContext",
    "default_vae_tiling",
    "stage_steps",
]

class ReferencePipeline:
    """Two-stage LTX-2 audio+video generation with technique seams.

    Args:
        models: the loaded ltx-core components.
        device: where to run (CPU works).
        stage2_tiling: tile grid of stage 2 (default: whole frame below ~32k tokens).
        vae_tiling: ltx-core ``TilingConfig`` for video decoding (default: the official one); None decodes
            in one piece.
        dtype: compute dtype of latents, contexts and noise: bf16 as the official pipelines (the models must
            be loaded in it). float32 serves one purpose: a CPU check whose rounding does not depend on the
            CPU model (tests/test_mini.py, the float32 reference clip).
    """

    def __init__(
        self,
        models: Models,
        device: torch.device | str = "cpu",
        stage2_tiling: Stage2Tiling | None = None,
        vae_tiling: Any = "default",
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        from ltx_pipelines.utils.types import PipelineComponents

        self.models = models
        self.device = torch.device(device)
        self.dtype = dtype
        self.components = PipelineComponents(dtype=self.dtype, device=self.device)
        self.stage2_tiling = stage2_tiling or Stage2Tiling()
        self.vae_tiling = default_vae_tiling() if vae_tiling == "default" else vae_tiling
        self.context: StepContext | None = None
        self._serial = 0  # steps run so far (StepContext.serial)
        self._prompt_cache: tuple[tuple, PromptContexts] | None = None
        self.stats: Counter = Counter()
        self.records: dict[str, Any] = {}  # per-run technique statistics (cleared by reset_stats)
        # Statistics kept on the device in the hot path (inside compiled blocks, where a host read or a
        # growing Python list would break or re-specialise the graph): objects with ``tensors()`` (one-element
        # device tensors they accumulate into in place), ``record(records, values)`` and ``reset()``.
        # ``run_stats`` reads every one of them in one transfer; ``reset_stats`` zeroes them in place.
        self.recorders: list[Any] = []
        self.applied_info: dict[str, Any] = {}  # what applied techniques changed (kept across runs)
        if self.device.type == "cuda":
            rope_grids_on(self.device)

    # ----------------------------------------------------------------- seams
    def transformers(self) -> list[torch.nn.Module]:
        """The distinct transformers the stages run: stage 1's, then stage 2's where it has its own (the
        official two-stage pipeline's stage 2 fuses the distilled LoRA). Techniques patch every one."""
        out = [self.models.transformer]
        stage2 = self.models.stage2_transformer
        if stage2 is not None and stage2 is not out[0]:
            out.append(stage2)
        return out

    def transformer_for(self, stage: str) -> torch.nn.Module:
        """The transformer that denoises ``stage``."""
        if stage == "stage2" and self.models.stage2_transformer is not None:
            return self.models.stage2_transformer
        return self.models.transformer

    def attention_modules(self, kind: str) -> list[torch.nn.Module]:
        """The ltx-core ``Attention`` modules of one kind (see ``ATTENTION_KINDS``), in block order, of every
        transformer (``transformers``) in turn."""
        return [module for _, module in self.attention_layers(kind)]

    def attention_layers(self, kind: str) -> list[tuple[int, torch.nn.Module]]:
        """``attention_modules(kind)`` with each module's block index within its transformer."""
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"attention kind must be one of {sorted(ATTENTION_KINDS)}, got {kind!r}")
        out = []
        for t in self.transformers():
            for layer, b in enumerate(t.velocity_model.transformer_blocks):
                out += [(layer, getattr(b, attr)) for attr in ATTENTION_KINDS[kind] if hasattr(b, attr)]
        return out

    def transformer_blocks(self) -> list[torch.nn.Module]:
        """Every transformer block of every transformer (``transformers``)."""
        return [b for t in self.transformers() for b in t.velocity_model.transformer_blocks]

    def transformer_pass(self, video: Any, audio: Any, perturbations: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """One transformer evaluation (X0 prediction for both modalities). Techniques may wrap this."""
        stage = self.context.stage if self.context is not None else "stage1"
        return self.transformer_for(stage)(video=video, audio=audio, perturbations=perturbations)

    def run_pass(self, pass_name: str, video: Any, audio: Any, perturbations: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Record the pass in ``context`` and ``stats``, then run ``transformer_pass``."""
        if self.context is not None:
            self.context = replace(self.context, pass_name=pass_name)
            self.stats[f"{self.context.stage}.passes"] += 1
        return self.transformer_pass(video, audio, perturbations)

    def map_tiles(self, fn: Callable[[int], tuple[torch.Tensor, torch.Tensor]], n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Stage-2 tile predictions ``[fn(0), ..., fn(n - 1)]``. tile_parallel spreads them over ranks."""
        return [fn(i) for i in range(n)]

    def run_stats(self) -> dict[str, Any]:
        """Pass counts, per-run technique records and applied-technique info, for the trial record.

        Statistics kept on the device (``recorders``, e.g. Sol's density per layer) are read here, all in
        one transfer, and filed into the records by their recorders."""
        if self.recorders:
            tensors = [r.tensors() for r in self.recorders]
            values = iter(read_once([t for ts in tensors for t in ts]))
            for recorder, ts in zip(self.recorders, tensors):
                recorder.record(self.records, [next(values) for _ in ts])
        return {**dict(self.stats), **self.records, **self.applied_info}

    def reset_stats(self) -> None:
        """Clear per-run statistics (pass counts and technique records)."""
        self.stats = Counter()
        self.records = {}
        for recorder in self.recorders:
            recorder.reset()

    # ----------------------------------------------------------------- prompts
    def _context_dims(self) -> tuple[int, int]:
        vm = self.models.transformer.velocity_model
        video_proj = getattr(vm, "caption_projection", None)
        audio_proj = getattr(vm, "audio_caption_projection", None)
        block = vm.transformer_blocks[0]
        vdim = video_proj.linear_1.in_features if video_proj is not None else block.attn2.to_k.in_features
        adim = audio_proj.linear_1.in_features if audio_proj is not None else block.audio_attn2.to_k.in_features
        return vdim, adim

    def encode_prompt(self, request: GenerationRequest) -> PromptContexts:
        """Prompt contexts for ``request``: embedding file, real Gemma encoder, or seeded stand-in.

        The last result is cached by prompt, negative prompt, embedding file and mode, so the Gemma
        encoder runs once per request however often the request is re-run (repeats, trials).
        """
        key = (request.prompt, request.negative_prompt, request.prompt_embedding, request.mode)
        if self._prompt_cache is not None and self._prompt_cache[0] == key:
            return self._prompt_cache[1]
        ctx = self._encode_prompt(request)
        self._prompt_cache = (key, ctx)
        return ctx

    def _encode_prompt(self, request: GenerationRequest) -> PromptContexts:
        need_negative = request.mode == "multistep"
        negative = request.negative_prompt or DEFAULT_NEGATIVE_PROMPT
        if request.prompt_embedding is not None:
            t = load_embedding_file(request.prompt_embedding, self.dtype, self.device)
            nv, na = t.get("negative_video_context"), t.get("negative_audio_context")
            if need_negative and (nv is None or na is None):
                vdim, adim = self._context_dims()
                tokens = t["video_context"].shape[1]
                nv = standin_context(negative, vdim, tokens, self.dtype, self.device)
                na = standin_context(negative, adim, tokens, self.dtype, self.device)
            return PromptContexts(t["video_context"], t["audio_context"], nv, na)
        ledger = self.models.ledger
        if ledger is not None and getattr(ledger, "gemma_root_path", None) is not None:
            from ltx_pipelines.utils.helpers import encode_prompts

            prompts = [request.prompt, negative] if need_negative else [request.prompt]
            with cpu_safe_cuda_sync():
                outs = encode_prompts(prompts, ledger)
            neg = outs[1] if need_negative else None
            return PromptContexts(
                outs[0].video_encoding, outs[0].audio_encoding,
                neg.video_encoding if neg else None, neg.audio_encoding if neg else None,
            )
        encoder = getattr(self.models, "text_encoder", None)
        if encoder is not None:  # ltx2-mini: vidtune's small trained encoder ("" is the unconditional prompt)
            prompts = [request.prompt, request.negative_prompt or ""] if need_negative else [request.prompt]
            v, a = encoder.encode(prompts, self.dtype, self.device)
            return PromptContexts(v[:1], a[:1], v[1:] if need_negative else None, a[1:] if need_negative else None)
        vdim, adim = self._context_dims()
        n = self.models.context_tokens
        return PromptContexts(
            standin_context(request.prompt, vdim, n, self.dtype, self.device),
            standin_context(request.prompt, adim, n, self.dtype, self.device),
            standin_context(negative, vdim, n, self.dtype, self.device) if need_negative else None,
            standin_context(negative, adim, n, self.dtype, self.device) if need_negative else None,
        )

    # ----------------------------------------------------------------- denoising
    def _generator(self, seed: int | None = None, state: torch.Tensor | None = None) -> torch.Generator:
        g = torch.Generator(device=self.device)
        if state is not None:
            g.set_state(state)
        else:
            g.manual_seed(seed)
        return g

    def _denoising_loop(self, stage: str, denoise_fn: Callable, grid: tuple[int, int, int] | None = None) -> Callable:
        """A loop with the same arithmetic as ``ltx_pipelines.utils.euler_denoising_loop``, plus context.

        ``grid``: the latent (frames, height, width) of the video tokens, given to every pass's context (stage
        2's tiled step replaces it with each tile's)."""
        from ltx_pipelines.utils.helpers import post_process_latent

        def loop(sigmas, video_state, audio_state, stepper):
            n = len(sigmas) - 1
            sigma_values = sigmas.detach().float().cpu().tolist()
            for step_idx in range(n):
                self.enter_step(stage, step_idx, n, sigma_values[step_idx], grid)
                denoised_video, denoised_audio = denoise_fn(video_state, audio_state, sigmas, step_idx)
                denoised_video = post_process_latent(denoised_video, video_state.denoise_mask, video_state.clean_latent)
                denoised_audio = post_process_latent(denoised_audio, audio_state.denoise_mask, audio_state.clean_latent)
                video_state = replace(video_state, latent=stepper.step(video_state.latent, denoised_video, sigmas, step_idx))
                audio_state = replace(audio_state, latent=stepper.step(audio_state.latent, denoised_audio, sigmas, step_idx))
            self.context = None
            return video_state, audio_state

        return loop

    def enter_step(self, stage: str, step: int, num_steps: int, sigma: float, grid: tuple[int, int, int] | None) -> None:
        """The context of the step about to run (a sampler loop calls it before each step's passes)."""
        self._serial += 1
        self.context = StepContext(stage=stage, step=step, num_steps=num_steps, sigma=sigma, grid=grid, serial=self._serial)

    def _denoise(self, stage: str, request: GenerationRequest, generator: torch.Generator, sigmas: torch.Tensor,
                 denoise_fn: Callable, height: int, width: int, noise_scale: Any = 1.0,
                 initial_video: torch.Tensor | None = None, initial_audio: torch.Tensor | None = None) -> StageLatents:
        from ltx_core.components.diffusion_steps import EulerDiffusionStep
        from ltx_core.components.noisers import GaussianNoiser
        from ltx_core.types import VideoLatentShape, VideoPixelShape
        from ltx_pipelines.utils.helpers import denoise_audio_video

        shape = VideoPixelShape(batch=1, frames=request.frames, width=width, height=height, fps=request.fps)
        latent = VideoLatentShape.from_pixel_shape(shape)
        video_state, audio_state = denoise_audio_video(
            output_shape=shape,
            conditionings=[],
            noiser=GaussianNoiser(generator=generator),
            sigmas=sigmas,
            stepper=EulerDiffusionStep(),
            denoising_loop_fn=self._denoising_loop(stage, denoise_fn, (latent.frames, latent.height, latent.width)),
            components=self.components,
            dtype=self.dtype,
            device=self.device,
            noise_scale=noise_scale,
            initial_video_latent=initial_video,
            initial_audio_latent=initial_audio,
        )
        return StageLatents(video_state.latent, audio_state.latent, generator.get_state())

    def stage1_sigmas(self, request: GenerationRequest) -> torch.Tensor:
        """Stage-1 sigmas: explicit, the official distilled 8 steps, or LTX2Scheduler's multistep schedule."""
        from ltx_core.components.schedulers import LTX2Scheduler
        from ltx_pipelines.utils.constants import DISTILLED_SIGMA_VALUES

        if request.stage1_sigmas is not None:
            return torch.tensor(request.stage1_sigmas, dtype=torch.float32, device=self.device)
        if request.mode == "distilled":
            return torch.Tensor(DISTILLED_SIGMA_VALUES).to(self.device)
        return LTX2Scheduler().execute(steps=request.steps).to(dtype=torch.float32, device=self.device)

    def _guided_denoise_fn(self, request: GenerationRequest, ctx: PromptContexts) -> Callable:
        from ltx_core.components.guiders import MultiModalGuiderParams, create_multimodal_guider_factory
        from ltx_pipelines.utils.helpers import multi_modal_guider_factory_denoising_func

        stg_blocks = list(self.models.stg_blocks)
        video_params = MultiModalGuiderParams(
            cfg_scale=request.cfg_scale, stg_scale=request.stg_scale, rescale_scale=request.rescale_scale,
            modality_scale=request.modality_scale, skip_step=0, stg_blocks=stg_blocks,
        )
        audio_params = MultiModalGuiderParams(
            cfg_scale=request.audio_cfg_scale, stg_scale=request.stg_scale, rescale_scale=request.rescale_scale,
            modality_scale=request.modality_scale, skip_step=0, stg_blocks=stg_blocks,
        )
        return multi_modal_guider_factory_denoising_func(
            video_guider_factory=create_multimodal_guider_factory(params=video_params, negative_context=ctx.negative_video),
            audio_guider_factory=create_multimodal_guider_factory(params=audio_params, negative_context=ctx.negative_audio),
            v_context=ctx.video,
            a_context=ctx.audio,
            transformer=PassRouter(self, ctx.negative_video),
        )

    @torch.inference_mode()
    def stage1(self, request: GenerationRequest, contexts: PromptContexts | None = None) -> StageLatents:
        """Stage 1 at half resolution from pure noise (distilled: 8 passes; multistep: guided)."""
        from ltx_pipelines.utils.helpers import simple_denoising_func

        ctx = contexts or self.encode_prompt(request)
        generator = self._generator(seed=request.seed)
        if request.mode == "multistep":
            fn = self._guided_denoise_fn(request, ctx)
        else:
            fn = simple_denoising_func(video_context=ctx.video, audio_context=ctx.audio, transformer=PassRouter(self, None))
        h, w = request.stage1_shape
        return self._denoise("stage1", request, generator, self.stage1_sigmas(request), fn, h, w)

    @torch.inference_mode()
    def upsample(self, video_latent: torch.Tensor) -> torch.Tensor:
        """Latent spatial upsample x2 with the encoder's per-channel statistics (ltx-core)."""
        from ltx_core.model.upsampler import upsample_video

        return upsample_video(latent=video_latent[:1], video_encoder=self.models.video_encoder, upsampler=self.models.upsampler)

    def _tiled_denoise_fn(self, ctx: PromptContexts) -> Callable:
        from ltx_pipelines.utils.helpers import modality_from_latent_state

        router = PassRouter(self, None)

        def step(video_state, audio_state, sigmas, step_index):
            sigma = sigmas[step_index]
            grid = self._stage2_grid
            pos_audio = modality_from_latent_state(audio_state, ctx.audio, sigma)
            if len(grid["tiles"]) == 1:
                self.context = replace(self.context, grid=grid["fhw"])
                pos_video = modality_from_latent_state(video_state, ctx.video, sigma)
                return router(video=pos_video, audio=pos_audio, perturbations=None)
            if video_state.attention_mask is not None:
                # Conditioning items (image/keyframe) build a token-to-token mask that a spatial tile
                # would have to slice consistently; the reference requests have none.
                raise ValueError("stage-2 tiles cannot be combined with a conditioning attention mask; "
                                 "use stage2 tiles rows=1 cols=1 for conditioned requests")
            f, h, w = grid["fhw"]
            b, _, c = video_state.latent.shape

            def grid_view(t: torch.Tensor) -> torch.Tensor:  # [B, N, ...] -> [B, F, H, W, ...]
                return t.reshape(b, f, h, w, *t.shape[2:])

            def pos_view(t: torch.Tensor) -> torch.Tensor:  # [B, 3, N, 2] -> [B, 3, F, H, W, 2]
                return t.reshape(b, t.shape[1], f, h, w, *t.shape[3:])

            lat, mask, clean = grid_view(video_state.latent), grid_view(video_state.denoise_mask), grid_view(video_state.clean_latent)
            pos = pos_view(video_state.positions)
            tiles = grid["tiles"]

            def denoise_tile(i: int) -> tuple[torch.Tensor, torch.Tensor]:
                tile = tiles[i]
                self.context = replace(self.context, tile=i, num_tiles=len(tiles),
                                       grid=(f, tile.ys.stop - tile.ys.start, tile.xs.stop - tile.xs.start))
                tpos = pos[:, :, :, tile.ys, tile.xs].clone()
                # Re-base RoPE positions: the tile is denoised as a video whose top-left pixel is 0.
                tpos[:, 1] -= tpos[:, 1, :, :1, :1, :1].clone()
                tpos[:, 2] -= tpos[:, 2, :, :1, :1, :1].clone()
                th, tw = tile.ys.stop - tile.ys.start, tile.xs.stop - tile.xs.start
                tstate = replace(
                    video_state,
                    latent=lat[:, :, tile.ys, tile.xs].reshape(b, f * th * tw, c),
                    denoise_mask=mask[:, :, tile.ys, tile.xs].reshape(b, f * th * tw, *mask.shape[4:]),
                    clean_latent=clean[:, :, tile.ys, tile.xs].reshape(b, f * th * tw, c),
                    positions=tpos.reshape(b, tpos.shape[1], f * th * tw, *tpos.shape[5:]),
                )
                return router(video=modality_from_latent_state(tstate, ctx.video, sigma), audio=pos_audio, perturbations=None)

            out_video = torch.zeros(b, f, h, w, c, dtype=torch.float32, device=self.device)
            out_audio = torch.zeros_like(audio_state.latent, dtype=torch.float32)
            # Blend in tile order whoever computed the tiles (tile_parallel), so the sum is the same.
            # (the weights went to the device once per stage and the audio shares were summed on the host
            # then: a copy per tile and step synchronises, 12 more than the baseline's in a 2 x 2 stage 2)
            for tile, weight, share, (dv, da) in zip(tiles, grid["weights"], grid["audio_shares"],
                                                      self.map_tiles(denoise_tile, len(tiles))):
                th, tw = tile.ys.stop - tile.ys.start, tile.xs.stop - tile.xs.start
                out_video[:, :, tile.ys, tile.xs] += dv.float().reshape(b, f, th, tw, c) * weight[None, None, :, :, None]
                out_audio += da.float() * share
            self.context = replace(self.context, tile=0, num_tiles=len(grid["tiles"]))
            return out_video.reshape(b, f * h * w, c).to(video_state.latent.dtype), out_audio.to(audio_state.latent.dtype)

        return step

    @torch.inference_mode()
    def stage2(self, request: GenerationRequest, upsampled_video: torch.Tensor, audio_latent: torch.Tensor,
               rng_state: torch.Tensor, contexts: PromptContexts | None = None) -> StageLatents:
        """Stage 2 at full resolution: the official 3 distilled steps from the upsampled latent."""
        from ltx_pipelines.utils.constants import STAGE_2_DISTILLED_SIGMA_VALUES

        ctx = contexts or self.encode_prompt(request)
        generator = self._generator(state=rng_state)
        sigmas = torch.Tensor(STAGE_2_DISTILLED_SIGMA_VALUES).to(self.device)
        f, h, w = upsampled_video.shape[2:]
        rows, cols, overlap = self.stage2_tiling.resolve(f, h, w)
        tiles = plan_tiles(h, w, rows, cols, overlap)
        self._stage2_grid = {"fhw": (f, h, w), "tiles": tiles, "weights": to_device_at_once([t.weight for t in tiles], self.device),
                             "audio_shares": [float(t.weight.sum()) / (h * w) for t in tiles]}
        self.records["stage2_tiles"] = {"rows": rows, "cols": cols, "overlap": overlap,
                                        "denoised_area_factor": denoised_area_factor(h, w, tiles)}
        return self._denoise(
            "stage2", request, generator, sigmas, self._tiled_denoise_fn(ctx), request.height, request.width,
            noise_scale=sigmas[0], initial_video=upsampled_video, initial_audio=audio_latent,
        )

    @torch.inference_mode()
    def decode_video(self, video_latent: torch.Tensor, rng_state: torch.Tensor) -> torch.Tensor:
        """Video VAE decode (ltx-core, tiled by ``vae_tiling``) -> uint8 frames [F, H, W, 3]."""
        from ltx_core.model.video_vae import decode_video as vae_decode_video

        generator = self._generator(state=rng_state)
        chunks = list(vae_decode_video(video_latent, self.models.video_decoder, self.vae_tiling, generator))
        return torch.cat(chunks, dim=0) if len(chunks) > 1 else chunks[0]

    @torch.inference_mode()
    def decode_audio(self, audio_latent: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Audio VAE decode + vocoder -> (float32 waveform [channels, samples], sample rate)."""
        from ltx_core.model.audio_vae import decode_audio as vae_decode_audio

        audio = vae_decode_audio(audio_latent, self.models.audio_decoder, self.models.vocoder)
        return audio.waveform.float(), int(audio.sampling_rate)

    def run(self, request: GenerationRequest) -> GenerationOutput:
        """All five stages in order; returns media, stage outputs and statistics."""
        self.reset_stats()
        ctx = self.encode_prompt(request)
        s1 = self.stage1(request, ctx)
        up = self.upsample(s1.video)
        s2 = self.stage2(request, up, s1.audio, s1.rng_state, ctx)
        frames = self.decode_video(s2.video, s2.rng_state)
        audio, sr = self.decode_audio(s2.audio)
        sync_if_cuda(self.device)
        return GenerationOutput(frames=frames.cpu(), audio=audio.cpu(), sample_rate=sr, stage1=s1, upsampled=up,
                                stage2=s2, stats=self.run_stats())
