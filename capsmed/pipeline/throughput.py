"""Measured training throughput that ``capsmed run --dry-run`` estimates from.

Each figure is a measurement from the repository's ``benchmarks/results/``: the H100
rows from ``gpu_check-h100.jsonl`` and ``gpu_check-h100-run2.jsonl`` (``make
gpu-check``: eager mode, the paper-size model with its registry defaults, training
images per second), the CPU rows from ``train.jsonl`` (``capsmed bench train`` on the
2-core x86_64 development machine, 2 threads). They are copied here so that an
installed capsmed (without the repository) has them; ``capsmed bench train`` adds
your own machine's (read from the user data folder, and preferred).

A rate is keyed by (architecture, channels, input size, classes, batch, precision,
device kind, mode); an estimate uses only rates of the run's own architecture (with its
registry defaults), channels, input size, precision, device kind and mode (eager,
compiled, CUDA graph), at the nearest measured batch (within a factor of 4).

The H100 rows' ``tf32-conv`` precision is the gpu_check "eager-fp32" column: it was
timed before ``--precision fp32`` turned TF32 off, with PyTorch's default of cuDNN
convolutions in TF32 (matmuls in IEEE fp32), so it is neither capsmed's fp32 nor its
tf32 (TF32 matmuls too), and no run takes an estimate from it (benchmarks/README.md:
the IEEE fp32 re-measurement is pending).
"""

from __future__ import annotations

from typing import NamedTuple


class Rate(NamedTuple):
    arch: str
    channels: int
    size: int
    classes: int
    batch: int
    precision: str  # fp32, tf32, bf16, fp16 (tf32-conv: TF32 convolutions only)
    device: str  # "cpu", or "gpu:<model>"
    images_per_s: float  # training
    source: str
    mode: str = "eager"  # eager, compile, graph or compile+graph (--compile, --cuda-graph)


RATES = (
    Rate('baseline', 1, 28, 10, 256, 'bf16', 'gpu:H100', 33946.6, 'gpu_check-h100-run2.jsonl'),
    Rate('baseline', 1, 28, 10, 256, 'tf32-conv', 'gpu:H100', 15998.3, 'gpu_check-h100-run2.jsonl'),
    Rate('baseline', 1, 28, 10, 1024, 'bf16', 'gpu:H100', 23956.8, 'gpu_check-h100-run2.jsonl'),
    Rate('baseline', 1, 28, 10, 1024, 'tf32-conv', 'gpu:H100',
         17377.7, 'gpu_check-h100-run2.jsonl'),
    Rate('capsnet', 1, 28, 10, 128, 'fp32', 'cpu', 98.4, 'train.jsonl (2-core x86_64)'),
    Rate('capsnet', 1, 28, 10, 256, 'bf16', 'gpu:H100', 60820.0, 'gpu_check-h100.jsonl'),
    Rate('capsnet', 1, 28, 10, 256, 'tf32-conv', 'gpu:H100', 38602.5, 'gpu_check-h100.jsonl'),
    Rate('capsnet', 1, 28, 10, 1024, 'bf16', 'gpu:H100', 84562.8, 'gpu_check-h100.jsonl'),
    Rate('capsnet', 1, 28, 10, 1024, 'tf32-conv', 'gpu:H100', 49940.0, 'gpu_check-h100.jsonl'),
    Rate('capsnet', 1, 28, 10, 4096, 'bf16', 'gpu:H100', 86558.4, 'gpu_check-h100.jsonl'),
    Rate('capsnet', 1, 28, 10, 4096, 'tf32-conv', 'gpu:H100', 52490.0, 'gpu_check-h100.jsonl'),
    Rate('convnet-avg', 1, 28, 10, 128, 'fp32', 'cpu', 158.4, 'train.jsonl (2-core x86_64)'),
    Rate('convnet-avg', 1, 28, 10, 256, 'bf16', 'gpu:H100', 91409.0, 'gpu_check-h100-run2.jsonl'),
    Rate('convnet-avg', 1, 28, 10, 256, 'tf32-conv', 'gpu:H100',
         60351.0, 'gpu_check-h100-run2.jsonl'),
    Rate('convnet-avg', 1, 28, 10, 1024, 'bf16', 'gpu:H100', 140659.3, 'gpu_check-h100-run2.jsonl'),
    Rate('convnet-avg', 1, 28, 10, 1024, 'tf32-conv', 'gpu:H100',
         72783.1, 'gpu_check-h100-run2.jsonl'),
    Rate('em-capsnet', 1, 28, 10, 128, 'fp32', 'cpu', 480.3, 'train.jsonl (2-core x86_64)'),
    Rate('em-capsnet', 1, 28, 10, 256, 'bf16', 'gpu:H100', 24164.0, 'gpu_check-h100-run2.jsonl'),
    Rate('em-capsnet', 1, 28, 10, 256, 'tf32-conv', 'gpu:H100',
         25022.7, 'gpu_check-h100-run2.jsonl'),
    Rate('em-capsnet', 1, 28, 10, 1024, 'bf16', 'gpu:H100', 70324.5, 'gpu_check-h100-run2.jsonl'),
    Rate('em-capsnet', 1, 28, 10, 1024, 'tf32-conv', 'gpu:H100',
         93243.9, 'gpu_check-h100-run2.jsonl'),
    Rate('em-capsnet', 1, 28, 10, 4096, 'bf16', 'gpu:H100', 240439.7, 'gpu_check-h100.jsonl'),
    Rate('em-capsnet', 1, 28, 10, 4096, 'tf32-conv', 'gpu:H100', 154262.3, 'gpu_check-h100.jsonl'),
    Rate('lenet', 1, 28, 10, 128, 'fp32', 'cpu', 15772.3, 'train.jsonl (2-core x86_64)'),
    Rate('lenet', 1, 28, 10, 256, 'bf16', 'gpu:H100', 83016.8, 'gpu_check-h100-run2.jsonl'),
    Rate('lenet', 1, 28, 10, 256, 'tf32-conv', 'gpu:H100', 98300.1, 'gpu_check-h100-run2.jsonl'),
    Rate('lenet', 1, 28, 10, 1024, 'bf16', 'gpu:H100', 254799.7, 'gpu_check-h100-run2.jsonl'),
    Rate('lenet', 1, 28, 10, 1024, 'tf32-conv', 'gpu:H100', 370080.5, 'gpu_check-h100-run2.jsonl'),
    Rate('parallel-dr', 3, 400, 15, 16, 'bf16', 'gpu:H100', 497.2, 'gpu_check-h100.jsonl'),
    Rate('parallel-dr', 3, 400, 15, 16, 'tf32-conv', 'gpu:H100', 452.7, 'gpu_check-h100.jsonl'),
    Rate('parallel-dr', 3, 400, 15, 64, 'bf16', 'gpu:H100', 809.9, 'gpu_check-h100.jsonl'),
    Rate('parallel-dr', 3, 400, 15, 64, 'tf32-conv', 'gpu:H100', 528.3, 'gpu_check-h100.jsonl'),
    Rate('parallel-em', 3, 400, 15, 16, 'bf16', 'gpu:H100', 237.7, 'gpu_check-h100-run2.jsonl'),
    Rate('parallel-em', 3, 400, 15, 16, 'tf32-conv', 'gpu:H100',
         242.6, 'gpu_check-h100-run2.jsonl'),
    Rate('parallel-em', 3, 400, 15, 64, 'bf16', 'gpu:H100', 540.5, 'gpu_check-h100-run2.jsonl'),
    Rate('parallel-em', 3, 400, 15, 64, 'tf32-conv', 'gpu:H100',
         330.1, 'gpu_check-h100-run2.jsonl'),
    Rate('resnext50', 3, 400, 15, 16, 'bf16', 'gpu:H100', 603.8, 'gpu_check-h100-run2.jsonl'),
    Rate('resnext50', 3, 400, 15, 16, 'tf32-conv', 'gpu:H100', 477.2, 'gpu_check-h100-run2.jsonl'),
    Rate('resnext50', 3, 400, 15, 64, 'bf16', 'gpu:H100', 964.3, 'gpu_check-h100-run2.jsonl'),
    Rate('resnext50', 3, 400, 15, 64, 'tf32-conv', 'gpu:H100', 560.4, 'gpu_check-h100-run2.jsonl'),
)
