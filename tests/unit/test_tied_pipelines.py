"""A pipeline of a model with tied embeddings is refused everywhere, in one line: its first and
last stage would hold the same matrix and neither the plans nor the runtime sum its gradients."""

from __future__ import annotations

import pytest

from shardsim.config import RunConfig, Strategy
from shardsim.core.errors import ConfigError
from shardsim.runtime.models.build import n_blocks
from shardsim.simulator.predict import predict
from shardsim.simulator.sweep.space import SweepSpace, enumerate_configs

TIED = RunConfig(workload="gpt2-xl", topology="g4dn.12xlarge", nodes=4, precision="fp16", batch_per_device=2)


def test_predict_refuses_a_pipeline_of_a_tied_model():
    with pytest.raises(ConfigError, match="tied embeddings") as err:
        predict(RunConfig(**{**TIED.__dict__, "strategy": Strategy("pipeline", pp=4, microbatches=8)}))
    assert err.value.field == "pp"


def test_the_runtime_refuses_it_before_starting():
    with pytest.raises(ConfigError, match="tied embeddings"):
        n_blocks("gpt2-xl", pipeline=True)
    assert n_blocks("gpt2-xl") == 48  # sharding it is fine


def test_a_sweep_says_it_left_the_pipelines_out():
    out = enumerate_configs(TIED, SweepSpace())
    assert not any(c.cfg.strategy.kind == "pipeline" for c in out.candidates)
    assert any("tied embeddings" in why for why in out.skipped)
    untied = enumerate_configs(RunConfig(**{**TIED.__dict__, "workload": "gpt-10b"}), SweepSpace())
    assert any(c.cfg.strategy.kind == "pipeline" for c in untied.candidates)
