"""One configuration tree for the simulator and the runtime.

`schema` holds its pydantic models (`RunConfig`; `strategy` the strategy's union of per-kind
models built by `Strategy`; `setting` and `frozen` what every node's fields and models are built
on); `file_form` puts a file's flat form in the tree; a configuration is read from a YAML file
(`load`), which also takes SageMaker model-parallel keys and FSDP's as users paste them (`smp`),
then overridden by command-line flags generated from the models' fields (`flags`), then checked
against its cluster and model (`resolve`).
"""

from shardsim.config.flags import add_config_arguments, config_from_args
from shardsim.config.load import build_config, load_config
from shardsim.config.resolve import resolve
from shardsim.config.schema import (
    BACKENDS,
    CHECKPOINTING,
    DATA_PARALLEL,
    FIELDS,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PRECISIONS,
    SAC_OP,
    SETTINGS,
    STRATEGIES,
    FlatSetting,
    Resolved,
    RunConfig,
)
from shardsim.config.setting import Setting
from shardsim.config.strategy import (
    SCHEDULES,
    DdpConfig,
    PipelineConfig,
    Strategy,
    StrategyConfig,
    Zero2DConfig,
    ZeroConfig,
)

__all__ = [
    "BACKENDS",
    "CHECKPOINTING",
    "DATA_PARALLEL",
    "FIELDS",
    "OPTIMIZERS",
    "OPTIMIZER_IMPLS",
    "PRECISIONS",
    "SAC_OP",
    "SCHEDULES",
    "SETTINGS",
    "STRATEGIES",
    "DdpConfig",
    "FlatSetting",
    "PipelineConfig",
    "Resolved",
    "RunConfig",
    "Setting",
    "Strategy",
    "StrategyConfig",
    "Zero2DConfig",
    "ZeroConfig",
    "add_config_arguments",
    "build_config",
    "config_from_args",
    "load_config",
    "resolve",
]
