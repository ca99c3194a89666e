"""Page faults of a training loop with glibc's default malloc and with keep_freed_memory.

    python benchmarks/host_memory.py [--pairs 5]

Each measurement is a fresh process running ten forward/backward passes of an MLP with 8 MiB
activations (one torch thread) after a warm-up pass, and counting its minor page faults. Default and kept
processes alternate; the table gives every pair and the medians. Writes benchmarks/results/host_memory.md.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import subprocess
import sys
from pathlib import Path

FAULTS = """
import resource, sys, torch
from hybridrl.utils.device import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
torch.set_num_threads(1)
torch.manual_seed(0)
layers = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.SiLU(), torch.nn.Linear(1024, 256))
x = torch.randn(2048, 256)
layers(x).square().mean().backward()  # the first pass faults its pages in either way
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    layers(x).square().mean().backward()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    rows = [(faults("default"), faults("keep")) for _ in range(args.pairs)]
    default_median = statistics.median(r[0] for r in rows)
    kept_median = statistics.median(r[1] for r in rows)
    lines = [
        "# Minor page faults of ten MLP passes: glibc defaults vs keep_freed_memory",
        "",
        f"{datetime.date.today()}, {cpu_name()}, torch 1 thread, `python benchmarks/host_memory.py "
        f"--pairs {args.pairs}`.",
        "",
        "| pair | default | kept | kept / default |",
        "| --- | --- | --- | --- |",
        *(f"| {i} | {d} | {k} | {k / d:.2f} |" for i, (d, k) in enumerate(rows)),
        f"| median | {default_median:.0f} | {kept_median:.0f} | {kept_median / default_median:.2f} |",
        "",
    ]
    out = Path(__file__).parent / "results" / "host_memory.md"
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
