"""``deep_gemm.testing``: DeepGEMM's benchmark, numeric and test helpers, at the same names."""

from . import bench as _bench_module
from . import numeric, utils
from .bench import *  # noqa: F401,F403  (its function `bench` takes the submodule's name, as in DeepGEMM)
from .numeric import *  # noqa: F401,F403
from .utils import *  # noqa: F401,F403

__all__ = [*_bench_module.__all__, *numeric.__all__, *utils.__all__]
