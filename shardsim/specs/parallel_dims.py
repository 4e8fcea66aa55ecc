"""The device mesh: the named parallel dimensions of a run, their order and where each rank sits.

Dimensions, each of a size (1 = not used): ``pp`` (pipeline stages), ``dp_replicate`` (data-
parallel replicas), ``dp_shard`` (the ranks a parameter is sharded over), ``cp`` (context
parallelism), ``ep`` (expert parallelism) and ``tp`` (tensor parallelism). The world is their
product, ranks laid out row-major over them in `order`, outermost first: a rank's coordinate in
a dimension is ``rank // stride % size``, its group in a dimension the ranks that differ from it
only there. A configuration's mesh order names the dimensions coarsely (``pp,dp,tp``); `ORDERS`
spells each one out. Dimensions of size 1 take no place in the layout, so adding one changes no
rank's group.

Expert parallelism borrows its ranks as torchtitan's ``ParallelDims`` does (with its
``expert_tensor_parallel_degree``, `etp`: 1, torchtitan's default, or tp): the experts' mesh
unflattens each (pp, dp_replicate) block's dp_shard x cp x ep x tp ranks, tp innermost, into
(efsdp, ep, etp). With etp = tp an EP group takes `ep` data-parallel ranks, tp apart, and the
experts are tensor-parallel too; with etp = 1 it takes `ep` consecutive ranks, tensor-parallel
ones among them (ep / tp data-parallel ranks, or a tp / ep-th of a tensor-parallel group), and
the experts are whole (`etp` None: tp). The dense mesh's ``ep`` dimension is the data-parallel
ranks an EP group takes (`ep_dp`), so ``size("ep")`` is that and the field `ep` the EP degree.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property
from math import prod

# every dimension, in the default order (outermost first); the data-parallel ones adjacent
DIMENSIONS: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "cp", "ep", "tp")
DATA = ("dp_replicate", "dp_shard")  # the data-parallel dimensions: a batch split across them
# a configuration's mesh order (its coarse names, outermost first) → the dimensions it orders
_COARSE = {"pp": ("pp",), "dp": ("dp_replicate", "dp_shard", "cp", "ep"), "tp": ("tp",)}
ORDERS: dict[str, tuple[str, ...]] = {
    o: tuple(d for part in o.split(",") for d in _COARSE[part]) for o in ("pp,dp,tp", "pp,tp,dp")
}
DEFAULT_ORDER = "pp,dp,tp"
# dimensions a strategy's label names by size (``tp=2``) when above 1; the kinds name pp and the
# data-parallel degree themselves
LABELLED = ("cp", "ep", "tp")


@dataclass(frozen=True)
class ParallelDims:
    """The sizes of the mesh's dimensions and their order (a configuration's `mesh_order`)."""

    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    ep: int = 1
    tp: int = 1
    mesh_order: str = DEFAULT_ORDER
    etp: int | None = None  # the experts' tensor-parallel degree under EP: 1 or tp (None: tp, EP on dp ranks only)

    def __post_init__(self) -> None:
        bad = [f"{d}={self.size(d)!r}" for d in DIMENSIONS if not isinstance(self.size(d), int) or self.size(d) < 1]
        if bad:
            raise ValueError(f"parallel dimensions must be positive integers: {', '.join(bad)}")
        if self.mesh_order not in ORDERS:
            raise ValueError(f"mesh order {self.mesh_order!r} is none of {', '.join(ORDERS)}")
        e = self.etp
        if e is not None and (e not in (1, self.tp) or (e == 1 and self.ep % self.tp and self.tp % self.ep)):
            raise ValueError(f"etp {self.etp} with ep {self.ep} and tp {self.tp} is not a mesh torchtitan builds here")

    # sizes and order

    def size(self, name: str) -> int:
        """The size of dimension `name` in the dense mesh (``ep``: `ep_dp`)."""
        if name not in DIMENSIONS:
            raise KeyError(f"no parallel dimension {name!r} (known: {', '.join(DIMENSIONS)})")
        return self.ep_dp if name == "ep" else getattr(self, name)

    # the experts' mesh

    @property
    def expert_tp(self) -> int:
        """The tensor-parallel degree of the routed experts: tp without EP or `etp`, else `etp`."""
        return self.tp if self.ep == 1 or self.etp is None else self.etp

    @property
    def ep_dp(self) -> int:
        """Data-parallel ranks an EP group takes: ep, or with etp = 1 ep / tp (at least 1)."""
        return self.ep if self.expert_tp == self.tp else max(1, self.ep // self.tp)

    @property
    def efsdp(self) -> int:
        """Ranks FSDP2 shards each expert over (torchtitan's efsdp): dp_shard x cp x tp / (ep x etp)."""
        return self.dp_shard * self.ep_dp * self.cp * self.tp // (self.ep * self.expert_tp)

    def expert_groups(self, name: str) -> list[tuple[int, ...]]:
        """Every group of the experts' mesh dimension `name` (``ep``, ``efsdp`` or ``etp``), as
        torchtitan unflattens it: each (pp, dp_replicate) block's ranks, consecutive in mesh order
        pp,dp,tp, read row-major as (efsdp, ep, etp)."""
        shape = {"efsdp": self.efsdp, "ep": self.ep, "etp": self.expert_tp}
        if name not in shape:
            raise KeyError(f"no dimension {name!r} of the experts' mesh (known: {', '.join(shape)})")
        assert self.tp_inner, "the experts' mesh is torchtitan's: tp innermost"
        n = self.world // (self.pp * self.dp_replicate)
        axes = list(shape)
        stride = prod(shape[a] for a in axes[axes.index(name) + 1 :])
        firsts = [r for r in range(self.world) if r % n // stride % shape[name] == 0]
        out = [tuple(r + k * stride for k in range(shape[name])) for r in firsts]
        return sorted(out)

    @property
    def order(self) -> tuple[str, ...]:
        """Every dimension's name, outermost first."""
        return ORDERS[self.mesh_order]

    @property
    def sizes(self) -> dict[str, int]:
        """{name: size} of every dimension, outermost first."""
        return {d: self.size(d) for d in self.order}

    @cached_property  # asked for by every collective a plan adds
    def world(self) -> int:
        """Ranks in all: the product of the sizes."""
        return prod(self.sizes.values())

    @property
    def dp(self) -> int:
        """Data-parallel ranks: the ranks that split a batch (dp_replicate × dp_shard)."""
        return self.dp_replicate * self.dp_shard

    @property
    def tp_inner(self) -> bool:
        """Tensor parallelism innermost: a tensor-parallel group's ranks consecutive."""
        return self.order[-1] == "tp"

    @classmethod
    def of_world(cls, world: int, *, mesh_order: str = DEFAULT_ORDER, **sizes: int) -> ParallelDims:
        """The dims of `world` ranks with `sizes` given: dp_replicate takes the ranks left over."""
        rest = prod(sizes.values())
        if world % rest:
            raise ValueError(f"{' x '.join(f'{k} {v}' for k, v in sizes.items())} does not divide {world} ranks")
        return cls(**sizes, dp_replicate=world // rest, mesh_order=mesh_order)

    def replace(self, **sizes: int) -> ParallelDims:
        """These dimensions with some sizes (or the mesh order) changed."""
        return ParallelDims(**({f.name: getattr(self, f.name) for f in fields(self)} | sizes))

    # where the ranks sit

    def stride(self, name: str) -> int:
        """Rank distance between neighbours in dimension `name` (the product of the sizes inside it)."""
        order = self.order
        return prod(self.size(d) for d in order[order.index(name) + 1 :])

    def coords(self, rank: int) -> dict[str, int]:
        """A rank's coordinate in every dimension, outermost first."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} is outside the world of {self.world}")
        return {d: rank // self.stride(d) % self.size(d) for d in self.order}

    def rank(self, coords: dict[str, int]) -> int:
        """The rank at `coords` (dimensions left out: coordinate 0)."""
        return sum(coords.get(d, 0) * self.stride(d) for d in self.order)

    def group(self, rank: int, *names: str) -> tuple[int, ...]:
        """The ranks of `rank`'s group in dimensions `names` (together, row-major in mesh order):
        those that differ from it in these dimensions only, `rank` among them."""
        c = self.coords(rank)
        base = self.rank({d: v for d, v in c.items() if d not in names})
        return tuple(base + off for off in self._offsets(names))

    def groups(self, *names: str) -> list[tuple[int, ...]]:
        """Every group of dimensions `names`: a partition of the world, in rank order of the first member."""
        others = [d for d in self.order if d not in names]
        offs = self._offsets(names)
        bases = [0]
        for d in others:
            bases = [b + k * self.stride(d) for b in bases for k in range(self.size(d))]
        return [tuple(b + o for o in offs) for b in sorted(bases)]

    def _offsets(self, names: tuple[str, ...]) -> list[int]:
        for n in names:
            self.size(n)
        offs = [0]
        for d in (d for d in self.order if d in names):
            offs = [o + k * self.stride(d) for o in offs for k in range(self.size(d))]
        return offs

    def within_node(self, devices_per_node: int, *names: str) -> bool:
        """Whether every group of dimensions `names` lies within one node of `devices_per_node` ranks."""
        return all(g[0] // devices_per_node == g[-1] // devices_per_node for g in self.groups(*names))

    # what a DeviceMesh takes, and the names tables use

    def mesh(self, *keep: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """The (shape, dimension names) of a DeviceMesh over the world (`init_device_mesh`): the
        dimensions above size 1 and those in `keep`, outermost first."""
        used = [d for d in self.order if self.size(d) > 1 or d in keep]
        return tuple(self.size(d) for d in used), tuple(used)

    @property
    def layout(self) -> str:
        """The layout as tables name it: ``tp × pp × dp(dp_shard)`` (``2 × 1 × 4(2)``: data-parallel
        ranks of a stage, the ranks a parameter is sharded over among them), then `` × cp 2`` for
        each dimension of `LABELLED` but tp above 1."""
        extra = "".join(f" × {d} {getattr(self, d)}" for d in LABELLED if d != "tp" and getattr(self, d) > 1)
        return f"{self.tp} × {self.pp} × {self.dp}({self.dp_shard})" + extra + self._etp_label(" × etp ")

    @property
    def spelled(self) -> str:
        """The layout in words: ``tp 2 x pp 1 x dp 4, sharded over 2`` (``sharded over 2 x cp 2``
        with context parallelism: FSDP's group is dp_shard × cp; and ``, ep 2`` above 1)."""
        shard = f"{self.dp_shard}" + (f" x cp {self.cp}" if self.cp > 1 else "")
        extra = "".join(f", {d} {getattr(self, d)}" for d in LABELLED if d not in ("tp", "cp") and getattr(self, d) > 1)
        return f"tp {self.tp} x pp {self.pp} x dp {self.dp}, sharded over {shard}" + extra + self._etp_label(", etp ")

    def label(self) -> str:
        """The label part of the dimensions a kind does not name itself (`` tp=2``; "" when all are 1)."""
        return "".join(f" {d}={getattr(self, d)}" for d in LABELLED if getattr(self, d) > 1) + self._etp_label(" etp=")

    def _etp_label(self, prefix: str) -> str:
        """`prefix` and etp where the experts are tensor-parallel under EP (etp = tp > 1), else ""."""
        return f"{prefix}{self.etp}" if self.ep > 1 and self.etp is not None and self.etp > 1 else ""
