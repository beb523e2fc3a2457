"""Parallelism family: guidance-pass, sequence (Ulysses / gathered KV) and tile parallelism over
torch.distributed (NCCL on GPUs, gloo on CPU). Every technique runs SPMD: all ranks apply the same
setting to the same request and end with the same output."""

from vidtune.techniques.parallelism import guidance_parallel, sequence_parallel, tile_parallel  # noqa: F401
