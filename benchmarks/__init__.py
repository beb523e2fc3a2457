"""Benchmarks and measurement tools beside the search (as Optuna keeps ``benchmarks/`` beside its package).

Installed as ``vidtune.benchmarks``; each ``bench_*`` module is a command (``python -m vidtune.benchmarks.bench_pass
--help``): the transformer pass per SDPA backend (``bench_pass``), kernels and their profile (``bench_kernels``,
``profile``), sparse attention (``bench_sparse``), memory techniques (``bench_memory``), parallel strategies
(``bench_parallel``, ``parallel_check``), the search's efficiency against a space's exhaustive set
(``search_efficiency``), and the quality metrics' calibration ladders (``calibrate``, also
``vidtune calibrate``). ``device_bench.sh`` and ``device_campaign.sh`` run them on a GPU machine without
network access (docs/offline-gpu.md). The search never imports this package.
"""
