"""Every kind of file a command reads has its bound (docs/calibration.md lists them): a file one
byte larger is refused in one line naming the file and the bound, exit status 2, before it is
parsed. The files here are sparse (their zeros are not written to disk)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardsim.core.csvfile import CSV_BYTES
from shardsim.core.yamlio import FILE_BYTES
from shardsim.simulator.calibration.measurements import RUN_JSON_BYTES
from shardsim.simulator.network.nccl_tests import NCCL_TESTS_BYTES
from shardsim.specs.model.hf_config import CONFIG_JSON_BYTES
from tests.unit.test_flag_bounds import refused

CALIBRATE = ["calibrate", "--topology", "p4d.24xlarge"]
CASES = [
    ("runs.csv", CSV_BYTES, [*CALIBRATE, "FILE"]),
    ("run.json", RUN_JSON_BYTES, [*CALIBRATE, "FILE"]),
    ("all_reduce_perf.log", NCCL_TESTS_BYTES, [*CALIBRATE, "--nccl-tests", "FILE"]),
    ("all_reduce_perf.log", NCCL_TESTS_BYTES, ["collective", "--compare", "FILE"]),
    ("config.json", CONFIG_JSON_BYTES, ["predict", "--workload", "FILE", "--topology", "p4d.24xlarge"]),
    ("big.yaml", FILE_BYTES, ["predict", "--workload", "gpt2", "--topology", "FILE"]),
    ("cal.yaml", FILE_BYTES, ["collective", "--calibration", "FILE"]),
]


@pytest.mark.parametrize(("name", "bound", "argv"), CASES, ids=[f"{c[0]}-{c[2][0]}" for c in CASES])
def test_a_file_beyond_its_bound_is_refused_in_one_line(tmp_path: Path, capsys, name, bound, argv) -> None:
    f = tmp_path / name
    with open(f, "wb") as out:
        out.truncate(bound + 1)
    err = refused(capsys, [str(f) if a == "FILE" else a for a in argv])
    assert str(f) in err and f"larger than {bound >> 20} MiB" in err, err
