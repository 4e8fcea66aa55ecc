"""The seed question under each library: what `shardsim sweep` recommends as SageMaker's library
(smp) and PyTorch's FSDP2 (pytorch) run it, and ZeRO-2D over one node against ZeRO over all 32
GPUs, as the README's table shows it.

    python experiments/seed/libraries.py      # prints the README's markdown table
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBRARIES = {
    "smp": "SageMaker's library (`--library smp`, the default here)",
    "pytorch": "PyTorch FSDP2 (`--library pytorch`)",
}


def sweep(*args: str) -> dict:
    """`shardsim sweep ... --json` of this interpreter's environment."""
    command = [str(Path(sys.executable).parent / "shardsim"), "sweep", *args, "--json", "--no-progress"]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT).stdout)


def ms(s: float) -> str:
    return f"{s * 1000:.0f} ms"


def main() -> None:
    print(
        "| library | `shardsim sweep` recommends | with `--tp 1` | ZeRO (32): step, exposed comm "
        "| ZeRO-2D (4): step, exposed comm | ZeRO-2D (4) against ZeRO (32) |"
    )
    print("|---|---|---|---|---|---|")
    for lib, name in LIBRARIES.items():
        every = sweep("--library", lib)["recommended"]
        flat = sweep("--library", lib, "--tp", "1")
        rows = {r["label"]: r for r in flat["rows"]}
        zero, mics = rows["zero"], rows["zero2d d=4"]
        faster = zero["step_time_s"] / mics["step_time_s"] - 1
        print(
            f"| {name} | degree {every['sharded_data_parallel_degree']} ({every['sdp']['label']}, "
            f"{every['sdp']['step_time_s']:.3f} s) | degree {flat['recommended']['sharded_data_parallel_degree']} "
            f"| {zero['step_time_s']:.3f} s, {ms(zero['exposed_comm_s'])} "
            f"| {mics['step_time_s']:.3f} s, {ms(mics['exposed_comm_s'])} "
            f"| {abs(faster) * 100:.1f} % {'faster' if faster > 0 else 'slower'} |"
        )


if __name__ == "__main__":
    main()
