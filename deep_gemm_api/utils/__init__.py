"""``deep_gemm.utils``: DeepGEMM's math and layout helpers (`math`, `layout`)."""

from . import layout, math
from .layout import *  # noqa: F401,F403
from .math import *  # noqa: F401,F403

__all__ = [*layout.__all__, *math.__all__, "layout", "math"]
