"""Training throughput on CPU under each OpenMP wait policy, idle and with competition.

Each measurement runs in a fresh process, because OpenMP reads OMP_WAIT_POLICY once,
when torch loads. Prints a Markdown table; append it to benchmarks/README.md.

    .venv/bin/python benchmarks/cpu_wait_policy.py [--steps 20] [--batch-size 32] [--busy 1]

``--busy N`` runs N single-threaded busy-loop processes during the measurements, the
situation of a shared workstation (or a preprocessing worker beside training).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys

CASES = {  # name -> capsnet keyword arguments
    "capsnet (paper, 8.2M)": {},
    "capsnet (64 conv ch, 8 primary types)": {"conv_channels": 64, "primary_types": 8},
}

# libgomp reads OMP_WAIT_POLICY once, when torch loads it: hence one process per case.
CHILD = """
import json, sys, time
import torch
from capsmed.models import create_model
from capsmed.train.losses import training_loss

kwargs, steps, batch = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
model = create_model("capsnet", num_classes=2, **kwargs)
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
x, y = torch.rand(batch, 1, 28, 28), torch.randint(0, 2, (batch,))
for step in range(steps + 3):
    if step == 3:  # warm-up steps excluded
        start = time.perf_counter()
    loss = training_loss("margin", model(x, target=y), x, y, 5e-5)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(batch * steps / (time.perf_counter() - start))
"""


POLICIES = {"unset (OpenMP default)": None, "ACTIVE": "ACTIVE",
            "PASSIVE": "PASSIVE"}


def measure(policy: str | None, kwargs: dict, steps: int, batch: int) -> float:
    import json

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(kwargs), str(steps),
                          str(batch)], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--busy", type=int, default=0,
                        help="busy-loop processes competing for the cores")
    args = parser.parse_args()
    import torch

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.busy)]
    try:
        _table(args, torch.__version__)
    finally:
        for hog in hogs:
            hog.kill()


def _table(args: argparse.Namespace, torch_version: str) -> None:
    print(f"device: cpu ({platform.machine()}, {os.cpu_count()} cores), torch "
          f"{torch_version}, batch {args.batch_size}, {args.steps} timed steps, "
          f"{args.busy} competing busy process(es)\n")
    print("| model (training img/s) | " + " | ".join(POLICIES) + " |")
    print("|---|" + "---:|" * len(POLICIES))
    for name, kwargs in CASES.items():
        rates = [measure(policy, kwargs, args.steps, args.batch_size)
                 for policy in POLICIES.values()]
        print(f"| {name} | " + " | ".join(f"{r:,.0f}" for r in rates) + " |")


if __name__ == "__main__":
    main()
