"""Schedule-file text the CPU tests write: a Hopper bf16 GEMM family with the sweep they choose."""

from __future__ import annotations

# Every field of a Hopper bf16 GEMM schedule but the tile (and the cluster, which families add).
BF16_BASE_TOML = """
arch = "sm_90a"
op = "bf16_gemm_nt"
a_dtype = "bf16"
b_dtype = "bf16"
c_dtype = "bf16"
acc_dtype = "f32"
scale = "none"
tile_k = 64
stages = "auto"
producer_regs = 40
consumer_regs = 232
epilogue = "tma_store"
raster = "along_m"
group_size = 8
"""
ONE_CTA_CLUSTER = 'cluster_m = 1\ncluster_n = 1\nmulticast = "none"\n'


def bf16_family(name: str = "fam", sweep: str = "", base_extra: str = "", description: str = "test") -> str:
    """A [[family]] of BF16_BASE_TOML plus `base_extra`, swept over `sweep` (TOML lines)."""
    return (
        f'[[family]]\nname = "{name}"\ndescription = "{description}"\n'
        f"[family.base]\n{BF16_BASE_TOML}{base_extra}\n"
        + (f"[family.sweep]\n{sweep}\n" if sweep else "")
    )
