"""cutegen: warp-specialised NVIDIA kernels generated from declarative schedules, shipped as cubins."""

__version__ = "0.1.0"
