"""`shardsim profile` with a tensor-parallel degree times a tensor-parallel rank's share of the
passes (what `validate` measures for a matrix with tensor-parallel rows)."""

from __future__ import annotations

import json

from shardsim.cli import main

TINY = ["profile", "--topology", "emu-2x2", "--workload", "tiny-gpt", "--batch", "2", "--repeats", "1",
        "--no-links", "--no-sharing", "--json"]  # fmt: skip


def test_a_tensor_parallel_degree_adds_that_ranks_share(tmp_path, capsys):
    assert main([*TINY, "--out", str(tmp_path / "plain.json")]) == 0
    assert json.loads(capsys.readouterr().out)["tp_share_by_batch"] is None
    argv = [*TINY, "--strategy", "zero", "--tp", "2", "--sequence-parallel", "--out", str(tmp_path / "tp.json")]
    assert main(argv) == 0
    shares = json.loads(capsys.readouterr().out)["tp_share_by_batch"]
    assert list(shares) == ["2"] and list(shares["2"]) == ["2+sp"]
    assert len(shares["2"]["2+sp"]) == 2 and all(s > 0 for s in shares["2"]["2+sp"])  # forward, backward
