"""``deep_gemm`` for engines written against DeepGEMM: `cutegen.deep_gemm` under DeepGEMM's import name.

Every submodule of `cutegen.deep_gemm` is also registered as ``deep_gemm.<name>`` (the same module
objects, so settings such as the contiguous-layout alignment are shared), which makes
``import deep_gemm.utils.layout`` and ``from deep_gemm.testing import bench_kineto`` work.
"""

import sys

import cutegen.deep_gemm as _impl
from cutegen.deep_gemm import *  # noqa: F401,F403
from cutegen.deep_gemm import __version__, testing, utils  # noqa: F401

_PREFIX = _impl.__name__ + "."
for _name, _module in list(sys.modules.items()):
    if _name.startswith(_PREFIX):
        sys.modules[__name__ + "." + _name[len(_PREFIX):]] = _module
del _name, _module
