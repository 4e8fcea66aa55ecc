"""Build functions for `simulator.measure.measure_import_path` tests (``tests.fixtures_models:NAME``)."""

from __future__ import annotations

import torch
from torch import nn

from shardsim.runtime.models.builders import build_model
from shardsim.specs.model.library import PRESETS

IN, HID, OUT = 8, 16, 4


class TwoBlockNet(nn.Module):
    """A hand-written model following the protocol: no embed, two blocks, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = None
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.Linear(IN, HID), nn.ReLU()), nn.Sequential(nn.Linear(HID, HID), nn.ReLU())]
        )
        self.head = nn.Linear(HID, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)

    def example_input(self, batch: int) -> torch.Tensor:
        return torch.randn(batch, IN)


def build_two_block() -> TwoBlockNet:
    return TwoBlockNet()


def build_tiny_gpt() -> nn.Module:
    return build_model(PRESETS["tiny-gpt"])


def build_broken() -> nn.Module:
    raise RuntimeError("checkpoint shard missing\nsecond line that must not reach the user")


def build_no_blocks() -> nn.Module:
    return nn.Linear(4, 4)


class _NoInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = None
        self.blocks = nn.ModuleList([nn.Linear(4, 4)])
        self.head = nn.Linear(4, 2)


def build_no_input() -> nn.Module:
    return _NoInput()


def build_not_a_module() -> dict:
    return {"blocks": []}


not_callable = 3
