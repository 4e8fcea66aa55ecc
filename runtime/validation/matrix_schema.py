"""The schema of a validation matrix file's own settings: how to run its rows (steps, warm-up,
timeout, the quiet-step bound, retries) and its description. The configuration fields it shares
with every row (workload, batch, precision, ...) and its topologies are checked as each row's
configuration is built (`matrix.load_matrix`), with the words the configuration's checks use."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from shardsim.simulator.documents import Document

Finite = Field(allow_inf_nan=False)


class MatrixDoc(Document):
    """A matrix file's settings (the keys it may hold are checked by `load_matrix`)."""

    description: str | None = None
    steps: Annotated[int, Field(ge=1)] = 4
    warmup: Annotated[int, Field(ge=0)] = 1
    timeout: Annotated[float, Field(ge=1), Finite] = 60.0
    max_steal: Annotated[float, Field(gt=0, le=1), Finite] | None = None
    retries: Annotated[int, Field(ge=0)] = 2
    topologies: dict[str, Any] | None = None
