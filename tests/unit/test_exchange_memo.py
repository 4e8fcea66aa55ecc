"""An MoE plan's exchanges are built once: the same object for the same arguments, the same shares."""

from __future__ import annotations

import pytest

from shardsim.core.errors import ConfigError
from shardsim.simulator.network.alltoall import Exchange


def test_busiest_gives_one_object_per_arguments_with_the_shares_it_computes() -> None:
    a = Exchange.busiest(8, 2.5)
    assert Exchange.busiest(8, 2.5) is a
    hot, rest = 2.5 / 8, (1 - 2.5 / 8) / 7
    assert a.shares == tuple(tuple(hot if j == 0 else rest for j in range(8)) for _ in range(8))
    assert Exchange.busiest(8, 2.5, rank=3) is not a and Exchange.busiest(8, 2.5, rank=3).shares[0][3] == hot


def test_busiest_refuses_a_bad_factor_every_time() -> None:
    for _ in range(2):
        with pytest.raises(ConfigError, match="busiest-rank factor"):
            Exchange.busiest(8, 9.0)


def test_transposed_is_the_transpose_and_one_object() -> None:
    a = Exchange.busiest(4, 3.0)
    t = a.transposed()
    assert t is a.transposed()
    assert t.shares == tuple(tuple(a.shares[i][j] for i in range(4)) for j in range(4))
    assert t.transposed() == a
