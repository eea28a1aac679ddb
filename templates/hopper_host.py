"""The Hopper GEMM's host side: shared-memory layouts, the tiled MMA, the TMA atoms and the launch,
and the binding of each kernel parameter for the manifest.

Importing this module imports the CuTe DSL; only the generator does that.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from cutegen.schedules.contract import op_contract
from cutegen.schedules.spec import DType, scale_stage_elems
from cutegen.templates.gemm_contract import (
    plain_binding,
    scale_vector_tma_binding,
    shape_binding,
    swizzle_atom_elems,
    tma_binding,
    with_group_mode,
)
from cutegen.templates.hopper_producer import A_TAIL_SLICE_ROWS
from cutegen.templates.hopper_state import GemmArgs


class HopperHost:
    """What the host function builds before the launch, and what the manifest says of each
    parameter."""

    def _make_smem_layouts(self):
        tm, tn, tk = self.tile_shape_mnk
        layout = self.schedule.layout
        # K contiguous for A [M,K] and B [N,K] (ROW_MAJOR), or M (N) for an MN-major operand:
        # the swizzle atom then runs along M (N) and tiles the K blocks after it.
        a_major = LayoutEnum.COL_MAJOR if layout.a_mn_major else LayoutEnum.ROW_MAJOR
        b_major = LayoutEnum.COL_MAJOR if layout.b_mn_major else LayoutEnum.ROW_MAJOR
        a_atom = warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(a_major, self.a_dtype, tm if layout.a_mn_major else tk), self.a_dtype
        )
        a_staged = cute.tile_to_shape(
            a_atom, (tm, tk, self.schedule.stages), order=(1, 0, 2) if layout.a_mn_major else (0, 1, 2)
        )
        # The same bytes as a_tail_slices slices per stage: slice j of stage i is buffer
        # i·a_tail_slices + j (the swizzle atom spans 8 rows: a slice is a contiguous run).
        a_tail_staged = None
        if self.a_tail_slices:
            a_tail_staged = cute.tile_to_shape(
                a_atom, (A_TAIL_SLICE_ROWS, tk, self.a_tail_slices * self.schedule.stages), order=(0, 1, 2)
            )
        b_atom = warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(b_major, self.b_dtype, tn if layout.b_mn_major else tk), self.b_dtype
        )
        b_staged = cute.tile_to_shape(
            b_atom, (tn, tk, self.schedule.stages), order=(1, 0, 2) if layout.b_mn_major else (0, 1, 2)
        )
        if self.schedule.stages_quantized_rows:
            # One buffer of the tile's quantized rows, row-major with padded rows (no swizzle).
            row = self.schedule.quantized_row_bytes * 8 // self.c_dtype.width  # in elements
            rows = cute.make_composed_layout(
                cute.make_swizzle(0, 4, 3), 0, cute.make_layout((tm, row), stride=(row, 1))
            )
            return a_staged, a_tail_staged, b_staged, rows
        em, en = self.schedule.epi_tile
        # D's sub-tiles contiguous along the kernel's N (D's columns), or with swapped operand
        # roles along its M (D's columns again: the kernel writes Dᵀ).
        d_layout = self._d_layout()
        c_atom = warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(d_layout, self.c_dtype, em if d_layout.is_m_major_c() else en),
            self.c_dtype,
        )
        order = (1, 0, 2) if d_layout.is_m_major_c() else (0, 1, 2)
        epi_staged = cute.tile_to_shape(c_atom, (em, en, self.schedule.epilogue_stages), order=order)
        return a_staged, a_tail_staged, b_staged, epi_staged

    def _d_layout(self) -> LayoutEnum:
        """D in the kernel's (M, N) view: row-major, or column-major where the operand roles are
        swapped (the kernel's M runs along D's columns)."""
        return LayoutEnum.COL_MAJOR if self.schedule.swaps_ab else LayoutEnum.ROW_MAJOR

    def _make_tiled_mma(self, atom_layout_mnk=None):
        """The kernel's tiled WGMMA (its math warpgroups stacked along M; its atom as wide as
        the tile, or as one column wave), or one over `atom_layout_mnk` warpgroups (the
        per-warpgroup epilogue's copy takes one)."""
        layout = self.schedule.layout
        return sm90_utils.make_trivial_tiled_mma(
            self.a_dtype,
            self.b_dtype,
            OperandMajorMode.MN if layout.a_mn_major else OperandMajorMode.K,
            OperandMajorMode.MN if layout.b_mn_major else OperandMajorMode.K,
            self.acc_dtype,
            atom_layout_mnk or self.atom_layout_mnk,
            tiler_mn=(64, self.schedule.wave_columns),
        )

    def param_bindings(self) -> list[dict]:
        """The kernel's parameters in order, each with the binding the runtime fills it from.

        Valid after tracing (the swizzles are read off the shared-memory layouts the DSL built).
        One entry per `.param`: TMA atom → 128-byte tensor map; TMA coordinate tensor → its
        dynamic extents as 32-bit integers.
        """
        if self.smem_bytes is None:
            raise RuntimeError("param_bindings() is only known after the kernel has been traced")
        tm, tn, tk = self.tile_shape_mnk
        cm, cn = self.cluster_shape_mn
        em, en = self.schedule.epi_tile
        s = self.schedule

        def tma(operand: str, dtype: DType, box_rows: int, box_cols: int, mn_major: bool = False) -> dict:
            return tma_binding(operand, dtype.value, box_rows, box_cols, self.smem_swizzles[operand], mn_major)

        shape = shape_binding
        scale_vector_tma = scale_vector_tma_binding

        # With multicast over n CTAs each CTA loads 1/n of the box, cut along the last TMA dim:
        # the rows of a K-major operand, K of an MN-major one.
        a_share = cn if self.is_a_mcast else 1
        b_share = cm if self.is_b_mcast else 1
        a_box = (tm, tk // a_share) if s.layout.a_mn_major else (tm // a_share, tk)
        b_box = (tn, tk // b_share) if s.layout.b_mn_major else (tn // b_share, tk)
        # The kernel's A and B: the op's, or with swapped operand roles B and A (`_launch`).
        op_a, op_b = ("a", "M", s.a_dtype), ("b", "N", s.b_dtype)
        (a_name, a_rows, a_dtype), (b_name, b_rows, b_dtype) = (op_b, op_a) if s.swaps_ab else (op_a, op_b)
        # A [G, max_m, K] (masked) and B [G, N, K] (M-grouped) carry a group mode. The k-grouped
        # op's flat A and B are viewed as [M, KT] and [N, KT] (KT = 128 · Σ blocks): only a
        # template; the kernel rewrites address, extents and stride per group.
        k_extent = "KT" if self.schedule.op.is_k_grouped else "K"
        params = [
            {"name": "tma_a", **with_group_mode(tma(a_name, a_dtype, *a_box, s.layout.a_mn_major), self.schedule.op.is_masked)},
            {"name": "extents_a", **shape(a_name, [a_rows, k_extent], self.schedule.op.is_masked)},
            {"name": "tma_b", **with_group_mode(tma(b_name, b_dtype, *b_box, s.layout.b_mn_major), self.schedule.op.is_m_grouped)},
            {"name": "extents_b", **shape(b_name, [b_rows, k_extent], self.schedule.op.is_m_grouped)},
        ]
        if self.schedule.block_scaled:
            params += [
                {"name": "tma_sfa", **with_group_mode(scale_vector_tma("sfa", tm), self.schedule.op.is_masked)},
                {"name": "extents_sfa", **shape("sfa", ["M", "KB"], self.schedule.op.is_masked)},
            ]
            if self.schedule.op.scales_b_per_row:  # SFB [N, KB] per 1x128 of B, staged like SFA
                params += [
                    {"name": "tma_sfb", **scale_vector_tma("sfb", tn)},
                    {"name": "extents_sfb", **shape("sfb", ["N", "KB"])},
                ]
            else:
                params.append({"name": "sfb", "kind": "pointer", "operand": "sfb"})
        contract = {arg.name: arg for arg in op_contract(s)}
        if s.stages_quantized_rows:
            # The activation's rows go to D by bulk copies: D as a plain tensor.
            params.append(plain_binding(contract["d"]))
        elif s.swaps_ab:
            # D [M, N] row-major holds the kernel's Dᵀ: an (en rows of M) x (em columns of N) box,
            # copied once per swizzle atom along N, the sub-tile's contiguous side.
            recipe = tma("d", s.c_dtype, en, em)
            atom = swizzle_atom_elems(recipe["swizzle"], s.c_dtype.bytes)
            params += [
                {"name": "tma_d", **dict(recipe, box=[min(em, atom), en])},
                {"name": "extents_d", **shape("d", ["N", "M"])},
            ]
        else:
            params += [
                {"name": "tma_d", **with_group_mode(tma("d", s.c_dtype, em, en), self.d_grouped)},
                {"name": "extents_d", **shape("d", ["M", "N"], self.d_grouped)},
            ]
        if self.schedule.op.is_masked:
            params.append({"name": "masked_m", "kind": "pointer", "operand": "masked_m"})
        elif self.schedule.op.is_k_grouped:
            params += [
                {"name": "group_sizes", "kind": "pointer", "operand": "group_sizes"},
                {"name": "workspace", "kind": "pointer", "operand": "workspace"},
                # A and B again as plain pointers: the per-group descriptors start from them.
                {"name": "a_base", "kind": "pointer", "operand": "a"},
                {"name": "b_base", "kind": "pointer", "operand": "b"},
            ]
        elif self.schedule.op.is_m_grouped:
            params += [
                {"name": "m_indices", "kind": "pointer", "operand": "m_indices"},
                {"name": "zero_padding", "kind": "scalar", "dtype": "i32", "expr": "ZERO_PADDING"},
            ]
        if self.schedule.splits_k:
            params += [
                {"name": "split_counters", "kind": "pointer", "operand": "split_counters"},
                {"name": "split_partials", "kind": "pointer", "operand": "split_partials"},
                {"name": "k_splits", "kind": "scalar", "dtype": "i32", "expr": "K_SPLITS"},
            ]
        if self.schedule.splits_tail:
            params.append({"name": "tail_split", "kind": "scalar", "dtype": "i32", "expr": "TAIL_SPLIT"})
        if self.a_tail_slices:
            # A again, in A_TAIL_SLICE_ROWS-row boxes: the tile that holds row M - 1.
            params.append({"name": "tma_a_tail", **tma("a", s.a_dtype, A_TAIL_SLICE_ROWS, tk)})
        if s.stages_quantized_rows:
            params += [plain_binding(contract["d_sf"]), plain_binding(contract["eps"])]
        if s.adds_bias:
            params.append(plain_binding(contract["bias"]))
        return params

    @cute.jit
    def _launch(
        self, a, b, c, sfa, sfb, max_active_clusters, stream, m_indices=None, zero_padding=None,
        masked_m=None, group_sizes=None, workspace=None, split_counters=None, split_partials=None,
        k_splits=None, tail_split=None, d_sf=None, eps=None, bias=None,
    ):
        tm, tn, tk = self.tile_shape_mnk
        cm, cn = self.cluster_shape_mn
        if cutlass.const_expr(self.schedule.swaps_ab):
            # B's rows are the MMA's M side: the kernel computes Dᵀ = B·Aᵀ into D viewed
            # column-major ([N, M], stride 1 along N).
            a, b = b, a
            c = cute.make_tensor(
                c.iterator, cute.make_layout((c.shape[1], c.shape[0]), stride=(c.stride[1], c.stride[0]))
            )
        a_staged, a_tail_staged, b_staged, epi_staged = self._make_smem_layouts()
        self.smem_swizzles = {
            "a": str(a_staged.inner),
            "b": str(b_staged.inner),
            "d": str(epi_staged.inner),
        }

        a_op = cpasync.CopyBulkTensorTileG2SMulticastOp() if self.is_a_mcast else cpasync.CopyBulkTensorTileG2SOp()
        b_op = cpasync.CopyBulkTensorTileG2SMulticastOp() if self.is_b_mcast else cpasync.CopyBulkTensorTileG2SOp()
        tma_atom_a_tail = None
        if cutlass.const_expr(self.a_tail_slices > 0):
            tma_atom_a_tail, _ = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp(),
                a,
                cute.slice_(a_tail_staged, (None, None, 0)),
                (A_TAIL_SLICE_ROWS, tk),
            )
        tma_atom_a, tma_tensor_a = cpasync.make_tiled_tma_atom(
            a_op,
            a,
            cute.slice_(a_staged, (None, None, 0)),
            (tm, tk),
            num_multicast=cn if self.is_a_mcast else 1,
        )
        tma_atom_b, tma_tensor_b = cpasync.make_tiled_tma_atom(
            b_op,
            b,
            cute.slice_(b_staged, (None, None, 0)),
            (tn, tk),
            num_multicast=cm if self.is_b_mcast else 1,
        )
        # D += tile (TMA reduce-add) where the schedule adds into D, else a plain TMA store.
        store_op = (
            cpasync.CopyReduceBulkTensorTileS2GOp()
            if self.schedule.adds_into_d
            else cpasync.CopyBulkTensorTileS2GOp()
        )
        tma_atom_c = None
        tma_tensor_c = c  # the activation epilogue's D: a plain tensor, written by bulk copies per row
        if cutlass.const_expr(not self.schedule.stages_quantized_rows):
            tma_atom_c, tma_tensor_c = cpasync.make_tiled_tma_atom(
                store_op,
                c,
                cute.slice_(epi_staged, (None, None, 0)),
                self.schedule.epi_tile,
            )
        # SFA: one column of tile_m scales per stage, contiguous along M (no swizzle); each stage
        # starts 128-byte aligned, as a TMA destination must.
        sfa_stride = scale_stage_elems(tm)
        sfa_staged = cute.make_layout((tm, 1, self.schedule.stages), stride=(1, 0, sfa_stride))
        tma_atom_sfa = None
        tma_tensor_sfa = None
        if cutlass.const_expr(self.schedule.block_scaled):
            tma_atom_sfa, tma_tensor_sfa = self._scale_vector_tma(sfa, tm)
        sfa_elems = sfa_stride * self.schedule.stages if self.schedule.block_scaled else 1
        # SFB per row (weight gradients): 112- or 144-wide tiles pad each stage to 128 bytes.
        sfb_stride = scale_stage_elems(tn)
        sfb_staged = cute.make_layout((tn, 1, self.schedule.stages), stride=(1, 0, sfb_stride))
        tma_atom_sfb = None
        tma_tensor_sfb = None
        sfb_arg = sfb
        if cutlass.const_expr(self.schedule.op.scales_b_per_row):
            tma_atom_sfb, tma_tensor_sfb = self._scale_vector_tma(sfb, tn)
            sfb_arg = None
        sfb_elems = sfb_stride * self.schedule.stages if self.schedule.op.scales_b_per_row else 1

        epi_elems = cute.cosize(epi_staged)

        @cute.struct
        class SharedStorage:
            mainloop_barriers: cute.struct.MemRange[cutlass.Int64, self.schedule.stages * 2]
            sA: cute.struct.Align[
                cute.struct.MemRange[self.a_dtype, cute.cosize(a_staged)],
                self.buffer_align_bytes,
            ]
            sB: cute.struct.Align[
                cute.struct.MemRange[self.b_dtype, cute.cosize(b_staged)],
                self.buffer_align_bytes,
            ]
            sC: cute.struct.Align[
                cute.struct.MemRange[self.c_dtype, epi_elems],
                self.buffer_align_bytes,
            ]
            sSFA: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, sfa_elems], 128]
            # Without per-row SFB its one word holds the split-K arrival count that a tile's first
            # math thread read, for the others (split-K kernels only).
            sSFB: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, sfb_elems], 128]

        self.shared_storage = SharedStorage
        self.smem_bytes = SharedStorage.size_in_bytes()

        persistent = self._persistent_clusters(self._tile_space(c), self.d_grouped, max_active_clusters, k_splits)
        if cutlass.const_expr(self.schedule.splits_tail):
            # Every cluster the GPU holds when the last wave may be split: with fewer tiles than
            # clusters, the idle ones take shares of the tiles' K blocks.
            persistent = cutlass.min(persistent + tail_split * max_active_clusters, max_active_clusters)

        # The kernel's parameters as one named structure (the kernel's own signature lists them
        # flat: the entry symbol of every cubin is named after it).
        args = GemmArgs(
            tma_atom_a=tma_atom_a,
            mA_mk=tma_tensor_a,
            tma_atom_b=tma_atom_b,
            mB_nk=tma_tensor_b,
            tma_atom_sfa=tma_atom_sfa,
            mSFA_mk=tma_tensor_sfa,
            sfb_ptr=sfb_arg,
            tma_atom_sfb=tma_atom_sfb,
            mSFB_nk=tma_tensor_sfb,
            tma_atom_c=tma_atom_c,
            mC_mn=tma_tensor_c,
            m_indices_ptr=m_indices,
            zero_padding=zero_padding,
            masked_m_ptr=masked_m,
            group_sizes_ptr=group_sizes,
            workspace_ptr=workspace,
            split_counters_ptr=split_counters,
            split_partials_ptr=split_partials,
            k_splits=k_splits,
            a_base_ptr=a.iterator if self.schedule.op.is_k_grouped else None,
            b_base_ptr=b.iterator if self.schedule.op.is_k_grouped else None,
            tail_split=tail_split,
            tma_atom_a_tail=tma_atom_a_tail,
            a_smem_layout_staged=a_staged,
            a_tail_layout_staged=a_tail_staged,
            b_smem_layout_staged=b_staged,
            sfa_smem_layout_staged=sfa_staged,
            sfb_smem_layout_staged=sfb_staged,
            epi_smem_layout_staged=epi_staged,
            d_sf=d_sf,
            eps=eps,
            bias=bias,
        )
        kernel_call = self.kernel(*args)
        self._launch_persistent(kernel_call, persistent, stream)

    @cute.jit
    def _tile_space(self, d):
        """What the tiles are walked over: D, or for an activation that pairs gate and up columns
        the [M, N(, G)] coordinates of the GEMM's sum, two columns per column of D."""
        if cutlass.const_expr(self.schedule.activation.pairs_columns):
            return cute.make_identity_tensor((d.shape[0], d.shape[1] * 2, *d.shape[2:]))
        return d

    def _scale_vector_tma(self, scales, rows: int):
        """TMA load of one K block's column of `rows` fp32 scales (contiguous along M or N)."""
        return cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), scales, cute.make_layout((rows, 1)), (rows, 1)
        )

    @cute.jit
    def _partition_scale_vector(self, tma_atom, s_staged, m_scales, rows: int):
        """(stage buffers, global tiles) of a scale vector for its TMA copy; the global side is
        (TMA, tiles, K blocks[, groups]) — a group mode when the scales have one (masked SFA)."""
        tiler = (None,) * cute.rank(m_scales)
        g_tiles = cute.local_tile(m_scales, (rows, 1), tiler)
        return cpasync.tma_partition(
            tma_atom, 0, cute.make_layout(1), cute.group_modes(s_staged, 0, 2), cute.group_modes(g_tiles, 0, 2)
        )
