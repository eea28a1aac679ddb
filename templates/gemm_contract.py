"""The launch contract of the GEMM templates, shared by Hopper and Blackwell: the fake arguments a
kernel is traced with, its operands, its grid rule and its launch facts. Kernels of one op take the
same torch operands on every architecture; only the parameter bindings (how each operand reaches
the kernel: TMA descriptor, plain tensor, pointer) are the kernel's own.

Importing this module imports the CuTe DSL; only the generator does that.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from cutegen.schedules.spec import SCALE_BLOCK, DType, ScaleFormat, Schedule
from cutegen.templates.dtypes import cute_dtype

# A TMA descriptor (CUtensorMap) is 128 bytes; the k-grouped kernels keep two per CTA (A and B)
# in a global workspace, as 16 Int64 words each.
TENSORMAP_BYTES = 128
TENSORMAP_WORDS = TENSORMAP_BYTES // 8


def swizzle_bytes(swizzle: str) -> str:
    """Map a CuTe swizzle functor as printed ("S<3,4,3>") to the TMA swizzle mode."""
    table = {"S<3,4,3>": "128B", "S<2,4,3>": "64B", "S<1,4,3>": "32B", "S<0,4,3>": "none"}
    if swizzle not in table:
        raise ValueError(f"shared-memory swizzle {swizzle} has no TMA swizzle mode")
    return table[swizzle]


# ---- parameter-binding recipes (the manifest's `binding` of one kernel parameter) -------------


def tma_binding(operand: str, dtype: str, box_rows: int, box_cols: int, smem_swizzle: str) -> dict:
    """A 2-D TMA descriptor of a K-major (or N-major, for D) operand: its contiguous mode is TMA
    dimension 0; the box is one CTA's share; the swizzle is read off the shared-memory layout."""
    return {
        "kind": "tma",
        "operand": operand,
        "dtype": dtype,
        "modes": [1, 0],
        "box": [box_cols, box_rows],
        "swizzle": swizzle_bytes(smem_swizzle),
        "interleave": "none",
        "l2_promotion": "128B",
        "oob_fill": "none",
    }


def scale_vector_tma_binding(operand: str, rows: int) -> dict:
    """A TMA descriptor of an MN-major fp32 scale tensor [rows, KB]: one column of `rows` scales
    per box, contiguous along the rows (TMA dimension 0)."""
    return {
        "kind": "tma",
        "operand": operand,
        "dtype": "f32",
        "modes": [0, 1],
        "box": [rows, 1],
        "swizzle": "none",
        "interleave": "none",
        "l2_promotion": "128B",
        "oob_fill": "none",
    }


def with_group_mode(recipe: dict, grouped: bool) -> dict:
    """A torch operand [G, X, Y] is the kernel's (X, Y, G): torch dims shift by one and the group
    is the last TMA dimension, one per box."""
    if not grouped:
        return recipe
    return dict(recipe, modes=[m + 1 for m in recipe["modes"]] + [0], box=recipe["box"] + [1])


def shape_binding(operand: str, values: list[str], grouped: bool = False) -> dict:
    """The dynamic extents of a TMA coordinate tensor, as 32-bit integers (plus G when grouped)."""
    return {"kind": "shape", "operand": operand, "values": values + ["G"] * grouped, "width": 32}


def requirement(symbol: str, relation: str, expr: str) -> dict:
    """One entry of a manifest's ``requires`` (`cutegen.runtime.manifest.Requirement`)."""
    return {"symbol": symbol, "relation": relation, "expr": expr}


class GemmContract:
    """The generator's view of a GEMM template: fake arguments, operands, grid rule, launch facts
    and the kernel's parameter bindings. A subclass sets ``self.kernel`` (a traced kernel object
    with ``smem_bytes`` and ``param_bindings()``)."""

    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        self.block_scaled = schedule.scale != ScaleFormat.NONE
        self.m_grouped = schedule.op.is_m_grouped
        self.masked = schedule.op.is_masked
        self.sfb_per_row = schedule.op.scales_b_per_row
        self.k_grouped = schedule.op.is_k_grouped
        self.split_k = schedule.epilogue.splits_k
        # UE8M0 scales: four exponent bytes per int32 along K, so the scale tensors have
        # KW = ⌈KB/4⌉ int32 columns where fp32 scales have KB fp32 columns.
        self.ue8m0 = schedule.scale == ScaleFormat.UE8M0
        self.scale_dtype = "i32" if self.ue8m0 else "f32"
        self.scale_columns = "KW" if self.ue8m0 else "KB"
        self.kernel = None

    def fake_arguments(self) -> tuple:
        """Arguments for `cute.compile`: dynamic M, N, K and leading strides (16-byte aligned)."""
        from cutlass.cute.runtime import make_fake_tensor
        from cutlass.runtime import make_fake_stream

        s = self.schedule
        m = cute.sym_int32(symbol="M")
        n = cute.sym_int32(symbol="N")
        k = cute.sym_int32(symbol="K")

        def ld(dtype: DType):
            return cute.sym_int64(divisibility=16 // dtype.bytes)

        g = cute.sym_int32(symbol="G")
        if self.k_grouped:
            return self._k_grouped_fake_arguments(m, n, g, ld)
        if self.masked:
            a = make_fake_tensor(
                cute_dtype(s.a_dtype), (m, k, g), (ld(s.a_dtype), 1, ld(s.a_dtype)), assumed_align=16
            )
        else:
            a = make_fake_tensor(cute_dtype(s.a_dtype), (m, k), (ld(s.a_dtype), 1), assumed_align=16)
        if self.m_grouped:
            b = make_fake_tensor(
                cute_dtype(s.b_dtype), (n, k, g), (ld(s.b_dtype), 1, ld(s.b_dtype)), assumed_align=16
            )
        else:
            b = make_fake_tensor(cute_dtype(s.b_dtype), (n, k), (ld(s.b_dtype), 1), assumed_align=16)
        if self.masked:
            d = make_fake_tensor(
                cute_dtype(s.c_dtype), (m, n, g), (ld(s.c_dtype), 1, ld(s.c_dtype)), assumed_align=16
            )
        else:
            d = make_fake_tensor(cute_dtype(s.c_dtype), (m, n), (ld(s.c_dtype), 1), assumed_align=16)
        if not self.block_scaled:
            return (a, b, d, cutlass.Int32(1), make_fake_stream())
        from cutlass.cute.runtime import make_ptr

        # SFA [M, ⌈K/128⌉] (UE8M0: [M, ⌈K/512⌉] int32 words), MN-major with a 16-byte aligned
        # column stride (align(M, 4)).
        kb = cute.sym_int32(symbol=self.scale_columns)
        scale_type = cutlass.Int32 if self.ue8m0 else cutlass.Float32
        if self.masked:
            sfa = make_fake_tensor(
                scale_type, (m, kb, g), (1, cute.sym_int64(divisibility=4), cute.sym_int64(divisibility=4)),
                assumed_align=16,
            )
        else:
            sfa = make_fake_tensor(scale_type, (m, kb), (1, cute.sym_int64(divisibility=4)), assumed_align=16)
        if self.sfb_per_row:
            sfb = make_fake_tensor(cutlass.Float32, (n, kb), (1, cute.sym_int64(divisibility=4)), assumed_align=16)
            # The weight gradient's tail-split switch (TAIL_SPLIT) before max_active_clusters.
            return (a, sfa, b, sfb, d, cutlass.Int32(1), cutlass.Int32(1), make_fake_stream())
        sfb = make_ptr(scale_type, 0, cute.AddressSpace.gmem, assumed_align=4)
        if self.masked:
            masked_m = make_ptr(cutlass.Int32, 0, cute.AddressSpace.gmem, assumed_align=4)
            return (a, sfa, b, sfb, d, masked_m, cutlass.Int32(1), make_fake_stream())
        if self.m_grouped:
            m_indices = make_ptr(cutlass.Int32, 0, cute.AddressSpace.gmem, assumed_align=4)
            return (a, sfa, b, sfb, d, m_indices, cutlass.Int32(1), cutlass.Int32(1), make_fake_stream())
        if self.split_k:
            counters = make_ptr(cutlass.Int32, 0, cute.AddressSpace.gmem, assumed_align=4)
            partials = make_ptr(cutlass.Float32, 0, cute.AddressSpace.gmem, assumed_align=16)
            return (a, sfa, b, sfb, d, counters, partials, cutlass.Int32(1), cutlass.Int32(1), make_fake_stream())
        return (a, sfa, b, sfb, d, cutlass.Int32(1), make_fake_stream())

    def _k_grouped_fake_arguments(self, m, n, g, ld) -> tuple:
        from cutlass.cute.runtime import make_fake_tensor, make_ptr
        from cutlass.runtime import make_fake_stream

        s = self.schedule
        kt = cute.sym_int32(symbol="KT")
        kb = cute.sym_int32(symbol="KB")
        # The flat A and B as [M, KT] and [N, KT] row-major (templates for the per-group maps).
        a = make_fake_tensor(cute_dtype(s.a_dtype), (m, kt), (kt, 1), assumed_align=16)
        b = make_fake_tensor(cute_dtype(s.b_dtype), (n, kt), (kt, 1), assumed_align=16)
        # Scales [Σ blocks, M] and [Σ blocks, N] row-major = (M, KB) and (N, KB) MN-major.
        sfa = make_fake_tensor(cutlass.Float32, (m, kb), (1, cute.sym_int64(divisibility=4)), assumed_align=16)
        sfb = make_fake_tensor(cutlass.Float32, (n, kb), (1, cute.sym_int64(divisibility=4)), assumed_align=16)
        d = make_fake_tensor(
            cute_dtype(s.c_dtype), (m, n, g), (ld(s.c_dtype), 1, ld(s.c_dtype)), assumed_align=16
        )
        group_sizes = make_ptr(cutlass.Int32, 0, cute.AddressSpace.gmem, assumed_align=4)
        workspace = make_ptr(cutlass.Int64, 0, cute.AddressSpace.gmem, assumed_align=TENSORMAP_BYTES)
        return (a, sfa, b, sfb, d, group_sizes, workspace, cutlass.Int32(1), make_fake_stream())

    def operands(self) -> list[dict]:
        s = self.schedule
        if self.k_grouped:
            return [
                {"name": "a", "dtype": s.a_dtype.value, "shape": ["M", "KT"], "contiguous_mode": 1, "align_bytes": 16},
                {"name": "b", "dtype": s.b_dtype.value, "shape": ["N", "KT"], "contiguous_mode": 1, "align_bytes": 16},
                {"name": "sfa", "dtype": "f32", "shape": ["M", "KB"], "contiguous_mode": 0, "align_bytes": 16},
                {"name": "sfb", "dtype": "f32", "shape": ["N", "KB"], "contiguous_mode": 0, "align_bytes": 16},
                {"name": "d", "dtype": s.c_dtype.value, "shape": ["G", "M", "N"], "contiguous_mode": 2, "align_bytes": 16, "written": True},
                {"name": "group_sizes", "dtype": "i32", "shape": ["G"], "contiguous_mode": 0, "align_bytes": 4},
                # Two 128-byte TMA descriptors per CTA of the grid (see workspace_words()).
                {"name": "workspace", "dtype": "i64", "shape": ["W"], "contiguous_mode": 0, "align_bytes": TENSORMAP_BYTES, "written": True},
            ]
        kc = self.scale_columns
        b_shape, sfb_shape = (["G", "N", "K"], ["G", "NB", kc]) if self.m_grouped else (["N", "K"], ["NB", kc])
        a_shape, sfa_shape, d_shape = (
            (["G", "M", "K"], ["G", "M", kc], ["G", "M", "N"]) if self.masked else (["M", "K"], ["M", kc], ["M", "N"])
        )
        ops = [
            {"name": "a", "dtype": s.a_dtype.value, "shape": a_shape, "contiguous_mode": len(a_shape) - 1, "align_bytes": 16},
            {"name": "b", "dtype": s.b_dtype.value, "shape": b_shape, "contiguous_mode": len(b_shape) - 1, "align_bytes": 16},
        ]
        if self.block_scaled:
            ops += [
                {"name": "sfa", "dtype": self.scale_dtype, "shape": sfa_shape, "contiguous_mode": len(sfa_shape) - 2, "align_bytes": 16},
                # Row-major and contiguous; the kernel derives its strides from N and K. The
                # weight-gradient recipe's SFB [N, KB] is MN-major and TMA-aligned like SFA.
                {"name": "sfb", "dtype": "f32", "shape": ["N", "KB"], "contiguous_mode": 0, "align_bytes": 16}
                if self.sfb_per_row
                else {"name": "sfb", "dtype": self.scale_dtype, "shape": sfb_shape, "contiguous_mode": len(sfb_shape) - 1, "align_bytes": 4,
                      "packed": True},
            ]
        ops.append(
            {"name": "d", "dtype": s.c_dtype.value, "shape": d_shape, "contiguous_mode": len(d_shape) - 1, "align_bytes": 16, "written": True}
        )
        if self.masked:
            ops.append({"name": "masked_m", "dtype": "i32", "shape": ["G"], "contiguous_mode": 0, "align_bytes": 4})
        elif self.m_grouped:
            ops.append({"name": "m_indices", "dtype": "i32", "shape": ["M"], "contiguous_mode": 0, "align_bytes": 4})
        if self.split_k:
            # One counter per CTA tile of the cluster-padded tile grid (zero before a launch, left
            # zero after it) and K_SPLITS fp32 partial tiles per CTA tile: see
            # cutegen.runtime.split_k.workspace_extents().
            ops += [
                {"name": "split_counters", "dtype": "i32", "shape": ["TILES"], "contiguous_mode": 0, "align_bytes": 4, "written": True},
                {"name": "split_partials", "dtype": "f32", "shape": ["PARTIALS"], "contiguous_mode": 0, "align_bytes": 16, "written": True},
            ]
        return ops

    def requires(self) -> list[dict]:
        """Relations between the operands' extent symbols that the kernel relies on (the
        manifest's ``requires``): the scale tensors' block counts, the workspaces' sizes."""
        s = self.schedule
        if self.k_grouped:
            # A and B are [rows, 128·S], their scales [rows, S]; two descriptors per CTA.
            words = f"{2 * TENSORMAP_WORDS * s.cluster_m * s.cluster_n} * max_active_clusters"
            return [requirement("KT", "==", f"KB * {SCALE_BLOCK}"), requirement("W", ">=", words)]
        out = []
        if self.block_scaled:
            out.append(requirement(self.scale_columns, "==", f"ceil_div(K, {SCALE_BLOCK * (4 if self.ue8m0 else 1)})"))
            if not self.sfb_per_row:
                out.append(requirement("NB", "==", f"ceil_div(N, {SCALE_BLOCK})"))
        if self.split_k:
            # cutegen.runtime.split_k.workspace_extents
            tiles = (
                f"ceil_div(ceil_div(M, {s.tile_m}), {s.cluster_m}) * {s.cluster_m} * "
                f"ceil_div(ceil_div(N, {s.tile_n}), {s.cluster_n}) * {s.cluster_n}"
            )
            out += [
                requirement("TILES", ">=", tiles),
                requirement("PARTIALS", ">=", f"{tiles} * K_SPLITS * {s.tile_m * s.tile_n}"),
            ]
        return out

    def grid_rule(self) -> dict:
        s = self.schedule
        tiles = {"tile_m": s.tile_m, "tile_n": s.tile_n, "cluster_m": s.cluster_m, "cluster_n": s.cluster_n}
        cluster_tiles = (
            f"ceil_div(ceil_div(M, {s.tile_m}), {s.cluster_m}) * ceil_div(ceil_div(N, {s.tile_n}), {s.cluster_n})"
        )
        if self.split_k:
            # K_SPLITS work units per cluster tile.
            units = f"{cluster_tiles} * K_SPLITS"
        elif s.op.splits_last_wave:
            # With TAIL_SPLIT = 1, every cluster the GPU holds (fewer tiles than clusters: the
            # idle ones take shares of the tiles' K blocks), else one per cluster tile.
            units = f"{cluster_tiles} + TAIL_SPLIT * max_active_clusters"
        elif self.masked or self.k_grouped:
            # Every group counted full (the host never reads masked_m or the group sizes); idle
            # clusters exit at once. The tile fields feed the heuristic.
            units = f"G * {cluster_tiles}"
        else:
            return {"kind": "persistent_clusters", **tiles, "extent_m": "M", "extent_n": "N"}
        clusters = f"max(min({units}, max_active_clusters), 1)"
        return {"kind": "blocks", **tiles, "blocks": [str(s.cluster_m), str(s.cluster_n), clusters]}

    def launch_facts(self) -> dict:
        s = self.schedule
        if self.kernel.smem_bytes is None:
            raise RuntimeError("launch_facts() is only known after the kernel has been traced")
        return {
            "block": [s.threads_per_cta, 1, 1],
            "cluster": [s.cluster_m, s.cluster_n, 1],
            "smem_bytes": int(self.kernel.smem_bytes),
            "pdl": False,
            "cooperative": False,
        }

    def param_bindings(self) -> list[dict]:
        return self.kernel.param_bindings()
