"""Peak memory of one training step (forward, backward, Adam) per architecture.

On CUDA it reports ``torch.cuda.max_memory_allocated``; on CPU the peak resident set
of a fresh process (build + step), which includes the Python and torch runtime
(~0.3 GB), so it is an upper bound on what the model itself needs. Prints Markdown.

    .venv/bin/python benchmarks/memory.py [--device cpu|cuda] [--batch-size 15]
        [--sizes 64 128] [--archs parallel-dr parallel-em resnext50]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys

CHILD = """
import json, resource, sys
import torch
from capsmed.models import count_parameters, create_model
from capsmed.train.losses import training_loss

arch, size, batch, device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.manual_seed(0)
model = create_model(arch, in_channels=3, num_classes=15, input_size=size).to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.rand(batch, 3, size, size, device=device)
y = torch.arange(batch, device=device) % 15
loss = training_loss(model.loss_kind, model(x, target=y), x, y, 0.0)
loss.backward()
opt.step()
if device == "cuda":
    peak = torch.cuda.max_memory_allocated() / 2**30
else:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(json.dumps({"params": count_parameters(model), "peak_gib": peak}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=15)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--archs", nargs="+", default=["parallel-dr", "parallel-em",
                                                       "resnext50"])
    args = parser.parse_args()
    import torch

    name = (torch.cuda.get_device_name() if args.device == "cuda"
            else f"cpu ({platform.machine()}), peak RSS incl. runtime")
    print(f"device: {name}, torch {torch.__version__}, batch {args.batch_size}, "
          f"3 channels, 15 classes, default model sizes\n")
    print("| arch | input | parameters | peak GiB |")
    print("|---|---:|---:|---:|")
    for arch in args.archs:
        for size in args.sizes:
            out = subprocess.run([sys.executable, "-c", CHILD, arch, str(size),
                                  str(args.batch_size), args.device],
                                 capture_output=True, text=True, check=True)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"| {arch} | {size}x{size} | {result['params']:,} | "
                  f"{result['peak_gib']:.2f} |")


if __name__ == "__main__":
    main()
