"""Configuration: files, flags, SageMaker keys, and bad input (one line, exit status 2)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shardsim.cli import main
from shardsim.config import load_config, resolve
from shardsim.core.errors import ConfigError


def write(tmp_path, text: str, name: str = "c.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_flags_override_the_file(tmp_path) -> None:
    p = write(tmp_path, "workload: bert-large\nstrategy: zero2d\ndegree: 4\n")
    cfg = load_config(p, {"degree": 8})
    assert (cfg.workload, cfg.strategy.kind, cfg.strategy.degree) == ("bert-large", "zero2d", 8)


def test_sagemaker_distribution_block_is_understood(tmp_path) -> None:
    p = write(
        tmp_path,
        """
instance_type: ml.g4dn.12xlarge
instance_count: 8
distribution:
  mpi: {enabled: true, processes_per_host: 4}
  smdistributed:
    modelparallel:
      enabled: true
      parameters: {ddp: true, sharded_data_parallel_degree: 32, delayed_parameter_initialization: true}
""",
    )
    cfg, res = resolve(load_config(p), 32, 50)
    assert cfg.topology == "g4dn.12xlarge" and cfg.nodes == 8
    assert cfg.strategy.kind == "zero" and res.shard == 32


def test_sagemaker_partial_degree_is_zero2d(tmp_path) -> None:
    p = write(tmp_path, "sharded_data_parallel_degree: 4\n")
    cfg, res = resolve(load_config(p), 32, 50)
    assert cfg.strategy.kind == "zero2d" and res.shard == 4 and res.replicas == 8


def test_sagemaker_pipeline_keys(tmp_path) -> None:
    p = write(tmp_path, "partitions: 2\nmicrobatches: 4\npipeline: simple\nddp: true\n")
    cfg = load_config(p)
    assert (cfg.strategy.kind, cfg.strategy.pp, cfg.strategy.microbatches, cfg.strategy.schedule) == (
        "pipeline",
        2,
        4,
        "gpipe",
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("strategy: ddp\nsharded_data_parallel_degree: 8\n", "contradicts"),
        ("pipeline_parallel_degree: 2\npartitions: 4\n", "contradicting pipeline degrees"),
        ("degree: 4\nsharded_data_parallel_degree: 8\n", "contradicts"),
        ("strategy: tensor\n", "expected one of"),
        ("batch_per_device: -1\n", "batch_per_device"),
        ("nodes: 0\n", "nodes"),
        ("workload: [1, 2\n", "malformed YAML"),
        ("bogus_key: 1\n", "bogus_key"),
    ],
)
def test_bad_files_name_the_field(tmp_path, text: str, needle: str) -> None:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert needle in str(e.value)
    assert str(p) in str(e.value)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["predict", "--strategy", "zero2d", "--degree", "5"], "does not divide"),
        (["predict", "--strategy", "pipeline", "--pp", "64"], "pipeline degree"),
        (
            [
                "predict",
                "--workload",
                "tiny-gpt",
                "--strategy",
                "pipeline",
                "--pp",
                "8",
                "--nodes",
                "2",
                "--topology",
                "p4d.24xlarge",
            ],
            "exceeds the model's 4",
        ),
        (["predict", "--strategy", "pipeline", "--pp", "2", "--microbatches", "3"], "microbatches"),
        (["predict", "--workload", "nope"], "unknown workload"),
        (["predict", "--topology", "nope"], "unknown topology"),
        (["predict", "--precision", "bf16"], "no bf16"),
        (["predict", "--strategy", "magic"], "invalid choice"),
        (["collective", "--size", "12 parsecs"], "size"),
        (["collective", "--op", "all_gather", "--algo", "tree"], "tree"),
        (["predict", "/nonexistent.yaml"], "cannot read"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle) -> None:
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(argv))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_malformed_topology_file(tmp_path, capsys) -> None:
    import yaml

    from shardsim.specs.hardware.topology import builtin_topology_dir

    data = yaml.safe_load((builtin_topology_dir() / "p4d.24xlarge.yaml").read_text())
    data["nic"]["rate_gbps"] = {"value": -100, "source": "a typo"}
    p = write(tmp_path, yaml.safe_dump(data), "topo.yaml")
    assert main(["collective", "--topology", str(p)]) == 2
    err = capsys.readouterr().err
    assert "topo.yaml" in err and "nic.rate_gbps" in err and "> 0" in err
    del data["device"]["memory_gib"]
    p.write_text(yaml.safe_dump(data))
    assert main(["collective", "--topology", str(p)]) == 2
    assert "device.memory_gib" in capsys.readouterr().err


def test_help_starts_fast_without_torch() -> None:
    code = (
        "import sys; from shardsim.cli import main\ntry: main(['--help'])\nexcept SystemExit: pass\n"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    code2 = "import sys; from shardsim.cli import main\nmain(['predict', '--json'])\nassert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code2], check=True, capture_output=True)


def test_a_distribution_block_means_sagemakers_collectives(tmp_path) -> None:
    """MiCS's hierarchical all-gather only where the configuration says SageMaker's
    library (a pasted distribution block, or `library: smp`); flat keys are PyTorch's."""
    from shardsim.simulator.predict import predict

    block = (
        "workload: vit-630m\nbatch_per_device: 4\ninstance_type: ml.g4dn.12xlarge\ninstance_count: 8\n"
        "distribution:\n  smdistributed:\n    modelparallel:\n      enabled: true\n"
        "      parameters:\n        sharded_data_parallel_degree: {d}\n"
    )
    smp = load_config(write(tmp_path, block.format(d=16)))
    flat = load_config(
        write(tmp_path, "workload: vit-630m\ntopology: g4dn.12xlarge\nsharded_data_parallel_degree: 16\n")
    )
    assert (smp.library, flat.library) == ("smp", "pytorch")
    assert load_config(None, {"library": "smp"}).library == "smp"
    # a shard group over 4 nodes: SageMaker's hierarchical all-gather is another prediction
    assert predict(smp).step_time_s != predict(smp.replace(library="pytorch")).step_time_s
    # a group inside one node (4 T4s a g4dn.12xlarge): the same collectives either way
    inside = load_config(write(tmp_path, block.format(d=4)))
    assert predict(inside).step_time_s == predict(inside.replace(library="pytorch")).step_time_s
    with pytest.raises(ConfigError, match="library"):
        load_config(None, {"library": "nemo"})
