"""DeepGEMM's public Python API over cutegen's prebuilt kernels: engines written against DeepGEMM run unchanged.

Same names, argument order, keywords, defaults and semantics (tuple operands, D written in place,
None returned, recipes, layout utilities), for everything cutegen has a kernel for; nothing is
compiled at import or at the first call. The kernels come from the packaged catalogue of an
installed cutegen wheel, ``$CUTEGEN_BUILD_DIR`` or ``./build`` (`cutegen.runtime.catalogue`).
What cutegen has no kernel for raises `NotImplementedError` naming the function. The separate
``deep_gemm`` distribution in ``compat/deep_gemm`` re-exports this module under DeepGEMM's own
import name.
"""

from __future__ import annotations

from . import testing, utils
from .config import *  # noqa: F401,F403
from .gemm import *  # noqa: F401,F403
from .unsupported import *  # noqa: F401,F403
from .utils import *  # noqa: F401,F403
from .utils.layout import transform_sf_into_required_layout  # noqa: F401

# DeepGEMM's version whose API this module follows.
__version__ = "2.6.1"
