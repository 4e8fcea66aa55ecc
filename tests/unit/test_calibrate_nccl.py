"""shardsim calibrate with nccl-tests files: the network figures fitted to the p5 all-reduce
file move the prediction toward it (before, after, cross-validated), the file it writes loads and
`collective --calibration` applies it; bad input is one line, exit 2."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from shardsim.cli import main
from shardsim.core.errors import ConfigError
from shardsim.simulator.calibration import fit as F
from shardsim.simulator.calibration.apply import calibrated_instance, read_calibration
from shardsim.simulator.calibration.calibrate import default_params
from shardsim.simulator.calibration.collectives import collective_rows
from shardsim.simulator.calibration.parameters import DEFAULT_FIT, NETWORK_FIT
from shardsim.simulator.network.nccl_tests import read_nccl_tests
from shardsim.specs.hardware.topology import load_instance

ROOT = Path(__file__).resolve().parents[2]
P5 = str(ROOT / "experiments/calibration/data/nccl-all-reduce-p5-2node.csv")
TOPOLOGY = "p5.48xlarge"
ARGS = ["--nccl-tests", P5, "--nodes", "2", "--topology", TOPOLOGY]
# finer than the shipped three points (fitted to this file already): what a calibration adds
FINE = (
    "latency_inter_us",
    *(f"nic_size_factor.{s}" for s in ("1KiB", "16KiB", "128KiB", "1MiB", "8MiB", "64MiB")),
)


@pytest.fixture(scope="module")
def calibrated_p5(tmp_path_factory) -> tuple[str, Path]:
    """`shardsim calibrate` on the p5 file with the finer points, 4 folds: its stdout and the file
    it wrote."""
    out = tmp_path_factory.mktemp("cal") / "p5.yaml"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["calibrate", *ARGS, "--folds", "4", "--params", ",".join(FINE), "--out", str(out)])
    assert code == 0, buf.getvalue()
    return buf.getvalue(), out


def test_the_network_fit_improves_on_the_defaults_and_is_cross_validated(calibrated_p5) -> None:
    stdout, path = calibrated_p5
    assert "all_reduce 1.00 MiB, 16 ranks / 2 nodes" in stdout and "µs" in stdout
    cal = read_calibration(path)
    # the points the rows determine are fitted, the others held at their defaults, each with why
    assert set(cal.parameters) | set(cal.fit["held"]) == set(FINE) and not set(cal.parameters) & set(cal.fit["held"])
    assert {"latency_inter_us", "nic_size_factor.8MiB", "nic_size_factor.64MiB"} <= set(cal.parameters)
    e = cal.errors
    assert e["after"]["mae_pct"] < e["before"]["mae_pct"] and e["after"]["max_pct"] < e["before"]["max_pct"]
    assert e["cross_validated"]["folds"] == 4 and e["cross_validated"]["mae_pct"] < e["before"]["mae_pct"]
    (f,) = cal.fitted_to["nccl_tests"]
    assert (f["rows"], f["ranks"], f["nodes"], f["op"], len(f["sha256"])) == (32, 16, 2, "all_reduce", 64)


def _compare(capsys, *extra: str) -> dict:
    assert main(["collective", "--compare", P5, "--topology", TOPOLOGY, "--nodes", "2", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_collective_with_the_calibration_moves_toward_the_measurement(calibrated_p5, capsys) -> None:
    _, path = calibrated_p5
    cal = read_calibration(path)
    inst = calibrated_instance(load_instance(TOPOLOGY), cal)  # what predict --calibration applies
    assert inst.nic.figures.latency_inter_us == pytest.approx(cal.values["latency_inter_us"])
    assert inst.nic.figures.factor(8 << 20) == pytest.approx(cal.values["nic_size_factor.8MiB"])
    plain, fitted = _compare(capsys)["summary"], _compare(capsys, "--calibration", str(path))["summary"]
    for key in ("mean_abs_busbw_error_pct_from_1MiB", "mean_abs_time_error_pct_below_1MiB"):
        assert fitted[key] < plain[key], key


def test_compute_figures_are_left_out_of_a_fit_to_collectives_alone() -> None:
    inst = load_instance(TOPOLOGY)
    rows = collective_rows(read_nccl_tests(P5), inst, 2)
    names, notes = F.fitted_names(inst, rows, DEFAULT_FIT + NETWORK_FIT)
    assert names == ("nic_efficiency", *NETWORK_FIT)
    assert len(notes) == 4 and all("no measured runs" in n for n in notes)
    assert default_params(False, True) == NETWORK_FIT and default_params(True, False) == DEFAULT_FIT
    assert "nic_efficiency" not in default_params(True, True)  # it and the size factors scale one rate


def _gather(tmp_path: Path) -> str:
    path = tmp_path / "nccl-gather.csv"
    path.write_text(Path(P5).read_text())
    return str(path)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["calibrate", "--topology", TOPOLOGY], "field 'measured'"),
        (["calibrate", "--nccl-tests", P5, "--topology", TOPOLOGY], "field 'nodes'"),
        (["calibrate", *ARGS, "--params", "nic_size_factor.abc"], "nic_size_factor.abc"),
        (["calibrate", *ARGS, "--nccl-tests", P5], "given twice"),
        (["calibrate", "--nccl-tests", "GATHER", "--nodes", "2", "--topology", TOPOLOGY], "not gather"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, says) -> None:
    argv = [_gather(tmp_path) if a == "GATHER" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_a_file_on_other_nodes_than_nodes_is_refused(tmp_path) -> None:
    from shardsim.simulator.calibration.calibrate import calibrate

    text = tmp_path / "all_reduce_perf.log"
    ranks = "".join(
        f"#  Rank {r:2d} Group  0 Pid  {100 + r} on node-{r // 8} device  {r % 8} [0x53] H100\n" for r in range(16)
    )
    text.write_text(
        ranks + "".join(f"{s} {s // 4} float sum -1 {50 + s / 1e6:.2f} 0 0 0 50 0 0 0\n" for s in (1 << 20, 1 << 24))
    )
    with pytest.raises(ConfigError, match="measured on 2 nodes, not --nodes 4"):
        calibrate(None, TOPOLOGY, nccl_tests=(str(text),), nodes=4)


def test_the_api_takes_nccl_tests_files_alone() -> None:
    import shardsim

    r = shardsim.calibrate(None, TOPOLOGY, nccl_tests=P5, nodes=2, folds=0, params="latency_inter_us")
    assert tuple(r.values) == ("latency_inter_us",) and r.errors["after"]["mae_pct"] < r.errors["before"]["mae_pct"]
    with pytest.raises(ConfigError, match="nothing to fit to"):
        shardsim.calibrate(None, TOPOLOGY)


def test_a_fit_worse_than_the_defaults_on_its_own_rows_warns_and_says_its_band(capsys) -> None:
    """The shipped default parameters on the p5 curve: 7.0 -> 8.4 % mean, 28 -> 38 % largest."""
    assert main(["calibrate", *ARGS, "--folds", "0"]) == 0
    out = capsys.readouterr().out
    warning = next(line for line in out.splitlines() if line.startswith("WARNING: the fit is worse than the defaults"))
    assert "(mean |error| 7.0 % -> 8.4 %, largest 28 % -> 38 %)" in warning
    # the row error the covariance used (the rows' residual, not the weights' 0.05), the model's error and the band
    assert "row error 0.05 in log throughput in the fit's weights, 0.115 in its covariance" in out
    assert "model error added: ±11.8 % (nccl on p5.48xlarge, 2 nodes; measured: nccl-tests all_reduce" in out
    assert "band of a prediction (one sigma): the fitted parameters ±" in out


@pytest.mark.parametrize(
    ("argv", "measured", "says"),
    [
        (["--topology", TOPOLOGY, "--nodes", "2"], True, "±9.3 % (nccl on p5.48xlarge, 2 nodes; measured)"),
        (["--topology", TOPOLOGY, "--nodes", "1"], False, "±16.2 % (nccl on p5.48xlarge, 1 node; not measured here)"),
        (["--topology", "g4dn.12xlarge", "--nodes", "2"], False, "±16.2 % (nccl on g4dn.12xlarge, 2 nodes; not"),
    ],
)
def test_collective_prints_its_band(capsys, argv, measured, says) -> None:
    assert main(["collective", *argv, "--size", "64MiB"]) == 0
    assert f"  band   {says}" in capsys.readouterr().out
    assert main(["collective", *argv, "--size", "64MiB", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["band"]["measured"] is measured
    assert main(["collective", *argv, "--sizes", "1MiB,2MiB"]) == 0
    assert f"# band: {says}" in capsys.readouterr().out
