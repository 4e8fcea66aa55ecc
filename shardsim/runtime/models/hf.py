"""The seed article's Hugging Face ViT (`ViTForImageClassification` from a `ViTConfig`, nothing
downloaded), in the runtime's block structure: embeddings, encoder layers, head.

An optional extra: it needs ``transformers`` (``pip install shardsim[hf]``). Use it as the
workload ``shardsim.runtime.models.hf:build_hf_vit`` (the seed's 630M configuration) or
``shardsim.runtime.models.hf:build_hf_vit_tiny`` (seconds on a CPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# The seed's model arguments. The seed sets image_size 256 but feeds 224 x 224 images (its
# FakeDataset); 224 here, as the data and as the `vit-630m` preset.
SEED_VIT = {
    "image_size": 224,
    "patch_size": 16,
    "hidden_size": 1024,
    "num_hidden_layers": 50,
    "num_attention_heads": 16,
    "intermediate_size": 4 * 1024,
    "num_labels": 1000,
}
TINY_VIT = {
    "image_size": 32,
    "patch_size": 8,
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "num_labels": 10,
}


class _Layer(nn.Module):
    """A ViTLayer that returns a tensor (transformers versions return a tensor or a tuple)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer(x)
        return out[0] if isinstance(out, tuple) else out


class _Head(nn.Module):
    def __init__(self, layernorm: nn.Module, classifier: nn.Module):
        super().__init__()
        self.layernorm = layernorm
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.layernorm(x)[:, 0])


class HFViT(nn.Module):
    """ViTForImageClassification split into embed / blocks / head (same parameters)."""

    def __init__(self, **config):
        super().__init__()
        from transformers import ViTConfig, ViTForImageClassification

        self.config = ViTConfig(**config)
        vit = ViTForImageClassification(self.config)
        self.embed = vit.vit.embeddings
        encoder = getattr(vit.vit, "encoder", None)  # transformers 4: vit.encoder.layer; 5: vit.layers
        layers = encoder.layer if encoder is not None else vit.vit.layers
        self.blocks = nn.ModuleList(_Layer(layer) for layer in layers)
        self.head = _Head(vit.vit.layernorm, vit.classifier)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.embed(pixel_values)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target)

    def sample_batch(self, batch: int, generator: torch.Generator | None = None):
        """Random images and labels, as the seed's FakeDataset (seeded through `generator`)."""
        c = self.config
        img = torch.randn(batch, c.num_channels, c.image_size, c.image_size, generator=generator)
        return img, torch.randint(0, c.num_labels, (batch,), generator=generator)


def build_hf_vit() -> nn.Module:
    """The seed's Hugging Face ViT (630M parameters); needs ``transformers``."""
    return HFViT(**SEED_VIT)


def build_hf_vit_tiny() -> nn.Module:
    """A small Hugging Face ViT for CPU runs and tests; needs ``transformers``."""
    return HFViT(**TINY_VIT)
