"""The mixture-of-experts fields of `Arch`: which layers are MoE, and what is refused."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shardsim.core.errors import ConfigError
from shardsim.specs.model.arch import check_arch
from shardsim.specs.model.describe import arch_from_mapping
from shardsim.specs.model.library import PRESETS


def test_dense_first_then_every_nth_layer_is_moe():
    a = replace(PRESETS["tiny-moe"], layers=8, dense_layers=2, moe_every=2)
    assert [i for i in range(8) if a.is_moe_layer(i)] == [2, 4, 6]
    assert a.moe_layers == 3


@pytest.mark.parametrize(
    ("change", "field"),
    [({"experts": 0}, "experts"), ({"top_k": 5}, "top_k"), ({"top_k": 0}, "top_k"),
     ({"moe_every": 0}, "moe_every"), ({"dense_layers": 4}, "dense_layers")],
)  # fmt: skip
def test_inconsistent_moe_fields_are_refused_by_name(change, field):
    with pytest.raises(ConfigError) as err:
        check_arch(replace(PRESETS["tiny-moe"], **change))
    assert err.value.field == field


def test_moe_fields_in_a_dense_family_are_refused():
    with pytest.raises(ConfigError) as err:
        arch_from_mapping({"family": "llama", "hidden": 64, "layers": 2, "heads": 4, "vocab": 8, "seq_len": 8,
                           "experts": 4}, "m.yaml")  # fmt: skip
    assert err.value.field == "experts"
