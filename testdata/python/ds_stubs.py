"""Stand-ins for the DeepSpeed classes that DeepSpeed checkpoints pickle.

DeepSpeed is not installed (and must not be): these classes only carry the
module paths and attribute layouts that `torch.save` records for DeepSpeed
0.14.4 objects, so Debian's python3-torch can read and write such files in
tests. Importing this module registers them in sys.modules.
"""
import dataclasses
import enum
import sys
import types


def _module(name):
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sub = ".".join(parts[:i])
        if sub not in sys.modules:
            sys.modules[sub] = types.ModuleType(sub)
        if i > 1:
            setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], sys.modules[sub])
    return sys.modules[name]


class LossScaler:
    """deepspeed.runtime.fp16.loss_scaler.LossScaler: {cur_scale, dynamic}."""

    def __init__(self, scale=1.0):
        self.cur_scale = scale
        self.dynamic = False


class DynamicLossScaler:
    """deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler (fp16 runs).

    Attributes are set in DeepSpeed's order (LossScalerBase.__init__ sets
    cur_scale and dynamic first), which is the order pickle records them in.
    """

    def __init__(self, init_scale=2**32, scale_factor=2.0, scale_window=1000, min_scale=1, delayed_shift=1,
                 consecutive_hysteresis=False, raise_error_at_min_scale=True, dtype=None):
        self.cur_scale = init_scale
        self.dynamic = False
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self.min_scale = min_scale
        self.delayed_shift = delayed_shift
        self.cur_hysteresis = delayed_shift
        self.consecutive_hysteresis = consecutive_hysteresis
        self.raise_error_at_min_scale = raise_error_at_min_scale
        self.dynamic = True
        self.dtype = dtype


class ZeroStageEnum(int, enum.Enum):
    """deepspeed.runtime.zero.config.ZeroStageEnum."""
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


@dataclasses.dataclass
class fragment_address:  # noqa: N801 (DeepSpeed's name)
    """deepspeed.utils.tensor_fragment.fragment_address."""
    numel: int
    start: int


@dataclasses.dataclass
class SubparamShape:
    """deepspeed.checkpoint.universal_checkpoint.SubparamShape."""
    patterns: list
    shape: tuple
    partition_dim: int


for _cls, _mod in [(LossScaler, "deepspeed.runtime.fp16.loss_scaler"),
                   (DynamicLossScaler, "deepspeed.runtime.fp16.loss_scaler"),
                   (ZeroStageEnum, "deepspeed.runtime.zero.config"),
                   (fragment_address, "deepspeed.utils.tensor_fragment"),
                   (SubparamShape, "deepspeed.checkpoint.universal_checkpoint")]:
    _cls.__module__ = _mod
    _cls.__qualname__ = _cls.__name__
    setattr(_module(_mod), _cls.__name__, _cls)
