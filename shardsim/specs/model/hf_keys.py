"""Typed reads of a Hugging Face ``config.json``'s keys, what each family's mapper reads from."""

from __future__ import annotations

from typing import Any

from shardsim.core.errors import ConfigError

# Tokens per sample when a config.json is read: its maximum positions are what the model can take,
# not what it is trained at (Llama 2 pre-trained at 4,096; most fine-tuning runs use 2,048-8,192).
DEFAULT_SEQ_LEN = 4096


class HFKeys:
    """Typed reads of a config.json's keys, errors naming the key and the file; `read` holds the
    keys a mapper looked at (the rest are named once as not modelled)."""

    def __init__(self, data: dict[str, Any], where: str, prefix: str = ""):
        self.data, self.where, self.prefix = data, where, prefix
        self.read: set[str] = {"model_type", "_name_or_path"}  # the family, the name (`model_name`)
        self.children: list[HFKeys] = []

    def get(self, name: str) -> Any:
        self.read.add(name)
        return self.data.get(name)

    def int(self, *names: str, default: int | None = None) -> int:
        self.read.update(names)
        for name in names:
            value = self.data.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"expected an integer, got {value!r}", where=self.where, field=self.prefix + name)
            if value < 0:
                raise ConfigError(
                    f"expected an integer >= 0, got {value!r}", where=self.where, field=self.prefix + name
                )
            return value
        if default is None:
            raise ConfigError("missing; expected an integer", where=self.where, field=self.prefix + names[0])
        return default

    def seq_len(self, *names: str, default: int | None = None) -> int:
        """`DEFAULT_SEQ_LEN`, or the model's maximum positions (the first of `names` given) if fewer."""
        return min(DEFAULT_SEQ_LEN, self.int(*names, default=default))

    def flag(self, name: str, default: bool) -> bool:
        self.read.add(name)
        value = self.data.get(name, default)
        if not isinstance(value, bool):
            raise ConfigError(f"expected true or false, got {value!r}", where=self.where, field=self.prefix + name)
        return value

    def encoder(self) -> dict[str, int]:
        """The `Arch` fields of a transformer's shape under Transformers' common key names."""
        return dict(
            hidden=self.int("hidden_size"),
            layers=self.int("num_hidden_layers"),
            heads=self.int("num_attention_heads"),
            ffn=self.int("intermediate_size"),
        )

    def text(self, tied: bool) -> dict[str, Any]:
        """A text model's vocabulary, sequence length and tied embeddings (`tied`: the type's default)."""
        return dict(
            vocab=self.int("vocab_size"),
            seq_len=self.seq_len("max_position_embeddings"),
            tied_embeddings=self.flag("tie_word_embeddings", tied),
        )

    def nested(self, name: str) -> HFKeys:
        """The keys of the object `name` holds (a multimodal model's ``text_config``), read on
        their own: the enclosing object's other keys stay unread (its other towers)."""
        value = self.get(name)
        if not isinstance(value, dict):
            raise ConfigError("expected an object", where=self.where, field=self.prefix + name)
        child = HFKeys(value, self.where, f"{self.prefix}{name}.")
        self.children.append(child)
        return child

    def unread(self) -> list[str]:
        """The keys no mapper looked at, nested ones by their path (``text_config.sliding_window``)."""
        own = [self.prefix + str(k) for k in self.data if k not in self.read]
        return own + [name for child in self.children for name in child.unread()]
