"""Parallelism family: guidance-pass, Ulysses sequence and tile parallelism over torch.distributed.
Techniques land with issue "Technique families II"."""
