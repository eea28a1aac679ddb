"""Blackwell (sm_100a) persistent FP8 / FP4 GEMM whose block scales the tensor cores apply: the
block-scaled tcgen05 MMA (`kind::mxf8f6f4`, one UE8M0 scale per 32 elements along K; NVFP4's
`kind::mxf4nvf4`, one E4M3 scale per 16), the scales held in tensor memory, so the accumulator sums
every K block in the MMA and no warp promotes.

Importing this module imports the CuTe DSL; only the generator does that.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.blackwell_helpers as sm100_utils
import cutlass.utils.blockscaled_layout as blockscaled
from cutlass._mlir.dialects.nvvm import MemScopeKind
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, tcgen05
from cutlass.memory import SmemAllocator
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait
from cutlass.tensor_utils import LayoutEnum

from cutegen.schedules.spec import (
    MX_ATOM_BYTES,
    MX_ATOM_ROWS,
    MX_ATOM_TMEM_COLUMNS,
    SM100_TMEM_COLUMNS,
    TMA_FP4_PACKED,
    Raster,
    ScaleFormat,
    Schedule,
)
from cutegen.templates.dtypes import cute_dtype
from cutegen.templates.gemm_contract import shape_binding, tma_binding, with_group_mode
from cutegen.templates.gemm_entries import (
    Fp8GemmNtMxEntry,
    Fp8WgradMxEntry,
    KGroupedTnMxEntry,
    MGroupedContiguousMxEntry,
    MGroupedMaskedMxEntry,
    Nvfp4GemmNtEntry,
)
from cutegen.templates.blackwell_common import (
    EPILOGUE_BARRIER_ID,
    EPILOGUE_WARPS,
    LOAD_WARP,
    MMA_WARP,
    SCALE_RELAY_WARP,
    THREADS_PER_WARP,
    BlackwellRoles,
)
from cutegen.templates.hopper_k_grouped import KGroupedFamily
from cutegen.templates.tile_order import TileOrder


class BlackwellBlockScaledKernel(BlackwellRoles, KGroupedFamily, TileOrder):
    """Persistent warp-specialised block-scaled tcgen05 FP8 GEMM, one CTA per MMA (cluster 1x1) or
    a CTA pair (cluster 2x1) issuing one 2-CTA MMA of 256 x tile_n.

    Operands: A [M, K] e4m3 and B [N, K] e4m3 or e2m1 (FP4, two per byte; the TMA unpacks each
    to a byte in shared memory, as `kind::mxf8f6f4` reads a narrower operand beside a wider one)
    K-major through TMA (the k-grouped weight gradient: A [M, KT] and B [N, KT] MN-major, tokens
    first); D [M, N] bf16 through TMA stores (the weight gradients: fp32, reduce-added); the scales as the MMA reads them, in the blocked layout
    (`cutegen.runtime.mx_reference.to_blocked`): SFA [⌈M/128⌉ · ⌈K/128⌉ · 512] and SFB
    [⌈N/128⌉ · ⌈K/128⌉ · 512] bytes of UE8M0, one 512-byte atom per 128 rows and K tile.

    NVFP4 (`nvfp4_gemm_nt`, scale nv): A and B FP4 both, packed two per byte in shared memory as
    `kind::mxf4nvf4` reads them; K tiles of 256 elements (one 128-byte swizzle row), each with
    four atoms of E4M3 scales per 128 rows (one per 16 elements), contiguous in the blocked layout
    and loaded by one bulk copy of 2048 bytes; the epilogue multiplies by ``alpha`` (fp32, read
    once per CTA).

    Roles:
      - warp 4 — **loads**: per K tile, waits for a free stage, loads A and B (TMA) and the tile's
        scale atoms (one-dimensional bulk copies of 512 bytes) into it; all of them complete on
        the stage's full barrier.
      - warp 5 — **MMA**: per tile, waits for a free accumulator stage; per K tile, waits for the
        stage, copies its scale atoms into tensor memory (`tcgen05.cp` 32x128b.warpx4), issues the
        tile's four block-scaled MMAs (K = 32 each; ACCUMULATE off for the tile's first), releases
        the stage; commits the accumulator stage after the tile's last K tile.
      - warps 0-3 — **epilogue**: thread i owns row i of the accumulator (TMEM lane i); per tile,
        waits for the accumulator stage, loads it in 32-column chunks, converts to bf16 into a
        swizzled shared-memory ring of sub-tiles that warp 0 TMA-stores; releases the stage.
        Warp 0 allocates and frees the tensor memory.

    Tensor memory: `tmem_accumulator_stages` x tile_n accumulator columns, then the scale
    columns (4 for SFA's 128 rows, 4 per 128 columns of SFB), allocated as a power of two.
    The scales in tensor memory are single-buffered: the MMA warp's `tcgen05.cp` of the next K
    tile and its MMAs run in order in the tensor pipe.

    A CTA pair (`mma_ctas` 2, DeepGEMM's and CUTLASS's 2-SM block-scaled form): each CTA loads its
    own 128 rows of A, half of the tile's rows of B (both by 2-CTA TMA loads, whose bytes land on
    the leader's full barrier), its own SFA atom and every SFB atom of the tile; the leader's MMA
    warp issues `tcgen05.cp.cta_group::2` (each CTA's atoms from its own shared memory into its
    own tensor memory) and the 2-CTA MMAs, whose commits free the stage and fill the accumulator
    stage in both CTAs; each CTA's epilogue stores its own 128 rows and releases the stage on the
    leader's barrier. The scale atoms come by bulk copies, which complete on a barrier of the CTA
    they land in, so per stage:
      - `scale_landed` (each CTA; one arrival + the atoms' bytes): the load warp's bulk copies;
      - `scale_ready` (the leader's; two arrivals): warp 6 of each CTA — the **scale relay** —
        waits for its CTA's `scale_landed` and arrives on the leader's `scale_ready` (release at
        cluster scope); the leader's MMA warp waits for it beside the operands' full barrier.
    The stage is reused only after the MMA's commit frees it, so the relay's phases follow the
    operands'.
    """

    def __init__(self, schedule: Schedule):
        s = schedule
        self.schedule = s
        self.a_dtype = cute_dtype(s.a_dtype)
        self.b_dtype = cute_dtype(s.b_dtype)
        # FP4 weights beside FP8 activations: the TMA unpacks them to a byte each in shared memory
        # (NVFP4's operands, both FP4, stay packed).
        self.b_unpacked = s.smem_bits(s.b_dtype) != s.b_dtype.bits
        self.b_smem_dtype = cutlass.Int8 if self.b_unpacked else self.b_dtype
        self.c_dtype = cute_dtype(s.c_dtype)
        self.acc_dtype = cute_dtype(s.acc_dtype)
        self.nvfp4 = s.scale == ScaleFormat.NV
        self.sf_dtype = cutlass.Float8E4M3FN if self.nvfp4 else cutlass.Float8E8M0FNU
        self.sf_vector = s.scale.mma_vector
        # The scale bytes of one 128-row block and K tile: its atoms along K, one after another.
        self.row_block_scale_bytes = MX_ATOM_BYTES * s.mx_atoms_per_k_tile
        self.tile_shape_mnk = (s.tile_m, s.tile_n, s.tile_k)
        self.mma_ctas = s.mma_ctas
        self.pair = s.mma_ctas == 2
        self.cta_group = tcgen05.CtaGroup.TWO if self.pair else tcgen05.CtaGroup.ONE
        # The MMA tile: a CTA pair's MMA covers both CTAs' rows.
        self.mma_tiler = (s.tile_m * s.mma_ctas, s.tile_n, s.tile_k)
        self.cluster_shape_mn = (s.cluster_m, s.cluster_n)
        self.threads_per_cta = s.threads_per_cta
        self.group_size = s.group_size
        self.raster_along_m = s.raster == Raster.ALONG_M
        # A scheduled tile of the masked layout is one MMA tile (a pair's 256 rows).
        self.masked_tile_rows = s.tile_m * s.mma_ctas
        self.m_grouped = s.op.is_m_grouped
        self.masked = s.op.is_masked
        self.contiguous = self.m_grouped and not self.masked
        # The weight gradients: D (fp32) += the tile, by a TMA reduce-add.
        self.wgrad = s.op.scales_b_per_row
        # The k-grouped one: the tiles of every group with tokens, each over its group's 128-token
        # blocks (group sizes read on the GPU); D carries a group mode.
        self.k_grouped = s.op.is_k_grouped
        self.d_grouped = self.masked or self.k_grouped
        self.a_major = OperandMajorMode.MN if s.layout.a_mn_major else OperandMajorMode.K
        self.b_major = OperandMajorMode.MN if s.layout.b_mn_major else OperandMajorMode.K
        self.buffer_align_bytes = 1024
        # Scale atoms per stage (SFA's, SFB's) and the accumulator stages that fit beside their
        # tensor-memory columns.
        self.sfa_atoms, self.sfb_atoms = s.mx_scale_atoms
        self.sfb_row_blocks = -(-s.tile_n // MX_ATOM_ROWS)
        self.acc_stages = s.tmem_accumulator_stages
        self.raster_divisors = None
        self.smem_bytes: int | None = None

    def _make_tiled_mma(self):
        return sm100_utils.make_blockscaled_trivial_tiled_mma(
            self.a_dtype, self.b_dtype, self.a_major, self.b_major, self.sf_dtype, self.sf_vector,
            self.cta_group, self.mma_tiler[:2],
        )

    # ---- launch contract ----------------------------------------------------------------------
    def param_bindings(self) -> list[dict]:
        """The kernel's parameters in order, each with the binding the runtime fills it from: A, B
        and D through TMA descriptors (with their extents), the blocked scales as addresses."""
        if self.smem_bytes is None:
            raise RuntimeError("param_bindings() is only known after the kernel has been traced")
        s = self.schedule
        tm, tn, tk = self.tile_shape_mnk
        em, en = s.epi_tile

        def tma(operand: str, dtype: str, box_rows: int, box_cols: int, grouped: bool, mn_major: bool = False) -> dict:
            # FP4 stays packed in shared memory where both operands are FP4 (NVFP4).
            tma_dtype = TMA_FP4_PACKED if dtype == "e2m1" and s.fp4_packed_in_smem else dtype
            recipe = tma_binding(operand, tma_dtype, box_rows, box_cols, self.smem_swizzles[operand], mn_major)
            return with_group_mode(recipe, grouped)

        k_extent = "KT" if self.k_grouped else "K"
        params = [
            {"name": "tma_a", **tma("a", s.a_dtype.value, tm, tk, self.masked, s.layout.a_mn_major)},
            {"name": "extents_a", **shape_binding("a", ["M", k_extent], self.masked)},
            {"name": "tma_b", **tma("b", s.b_dtype.value, tn // self.mma_ctas, tk, self.m_grouped, s.layout.b_mn_major)},
            {"name": "extents_b", **shape_binding("b", ["N", k_extent], self.m_grouped)},
            {"name": "sfa", "kind": "pointer", "operand": "sfa"},
            {"name": "sfb", "kind": "pointer", "operand": "sfb"},
            {"name": "tma_d", **tma("d", s.c_dtype.value, em, en, self.d_grouped)},
            {"name": "extents_d", **shape_binding("d", ["M", "N"], self.d_grouped)},
        ]
        if self.k_grouped:
            params.append({"name": "group_sizes", "kind": "pointer", "operand": "group_sizes"})
        elif self.masked:
            params.append({"name": "masked_m", "kind": "pointer", "operand": "masked_m"})
        elif self.contiguous:
            params += [
                {"name": "m_indices", "kind": "pointer", "operand": "m_indices"},
                {"name": "zero_padding", "kind": "scalar", "dtype": "i32", "expr": "ZERO_PADDING"},
            ]
        elif s.op.splits_last_wave:
            params.append({"name": "tail_split", "kind": "scalar", "dtype": "i32", "expr": "TAIL_SPLIT"})
        if self.nvfp4:
            params.append({"name": "alpha", "kind": "pointer", "operand": "alpha"})
        return params

    # ---- host side --------------------------------------------------------------------------
    @cute.jit
    def _launch(self, a, b, c, sfa_ptr, sfb_ptr, max_active_clusters, stream, m_indices=None, zero_padding=None,
                masked_m=None, tail_split=None, group_sizes=None, alpha=None):
        s = self.schedule
        tiled_mma = self._make_tiled_mma()
        # (V, M, N, K) view of the cluster: V = the CTAs of one MMA.
        cluster_layout_vmnk = cute.tiled_divide(cute.make_layout((*self.cluster_shape_mn, 1)), (tiled_mma.thr_id.shape,))
        a_staged = sm100_utils.make_smem_layout_a(tiled_mma, self.mma_tiler, self.a_dtype, s.stages)
        b_staged = sm100_utils.make_smem_layout_b(tiled_mma, self.mma_tiler, self.b_smem_dtype, s.stages)
        sfa_staged = blockscaled.make_smem_layout_sfa(tiled_mma, self.mma_tiler, self.sf_vector, s.stages)
        sfb_staged = blockscaled.make_smem_layout_sfb(tiled_mma, self.mma_tiler, self.sf_vector, s.stages)
        epi_staged = sm100_utils.make_smem_layout_epi(
            self.c_dtype, LayoutEnum.ROW_MAJOR, s.epi_tile, s.epilogue_stages
        )
        self.smem_swizzles = {"a": str(a_staged.inner), "b": str(b_staged.inner), "d": str(epi_staged.inner)}
        a_one_stage = cute.slice_(a_staged, (None, None, None, 0))
        b_one_stage = cute.slice_(b_staged, (None, None, None, 0))
        load_op = cpasync.CopyBulkTensorTileG2SOp(self.cta_group)
        tma_atom_a, tma_tensor_a = cute.nvgpu.make_tiled_tma_atom_A(
            load_op, a, a_one_stage, self.mma_tiler, tiled_mma, cluster_layout_vmnk.shape
        )
        tma_atom_b, tma_tensor_b = cute.nvgpu.make_tiled_tma_atom_B(
            load_op, b, b_one_stage, self.mma_tiler, tiled_mma, cluster_layout_vmnk.shape,
            internal_type=self.b_smem_dtype if self.b_unpacked else None,
        )
        # The transaction counts the bytes read from global memory (FP4: half a byte each); a
        # pair's A and B bytes of both CTAs land on the leader's barrier, its scale atoms on each
        # CTA's own `scale_landed`.
        self.scale_bytes = MX_ATOM_BYTES * (self.sfa_atoms + self.sfb_atoms)
        operand_bytes = cute.size_in_bytes(self.a_dtype, a_one_stage) + cute.size_in_bytes(self.b_dtype, b_one_stage)
        self.tma_bytes = operand_bytes * self.mma_ctas if self.pair else operand_bytes + self.scale_bytes
        store_op = cpasync.CopyReduceBulkTensorTileS2GOp() if self.wgrad else cpasync.CopyBulkTensorTileS2GOp()
        tma_atom_c, tma_tensor_c = cpasync.make_tiled_tma_atom(
            store_op, c, cute.slice_(epi_staged, (None, None, 0)), s.epi_tile
        )

        def aligned(dtype, layout, align):
            return cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(layout)], align]

        # A pair's CTAs also hold the scale relay's barriers and the TMEM free handshake.
        pair_barriers = {
            "scale_landed": cute.struct.MemRange[cutlass.Int64, s.stages],
            "scale_ready": cute.struct.MemRange[cutlass.Int64, s.stages],
            "tmem_dealloc_barrier": cutlass.Int64,
        } if self.pair else {}
        fields = {
            "operand_barriers": cute.struct.MemRange[cutlass.Int64, s.stages * 2],
            "accumulator_barriers": cute.struct.MemRange[cutlass.Int64, self.acc_stages * 2],
            **pair_barriers,
            "tmem_address": cutlass.Int32,
            "sC": aligned(self.c_dtype, epi_staged.outer, self.buffer_align_bytes),
            "sA": aligned(self.a_dtype, a_staged.outer, self.buffer_align_bytes),
            "sB": aligned(self.b_smem_dtype, b_staged.outer, self.buffer_align_bytes),
            "sSFA": aligned(self.sf_dtype, sfa_staged, 128),
            "sSFB": aligned(self.sf_dtype, sfb_staged, 128),
        }
        self.shared_storage = cute.struct(type("SharedStorage", (), {"__annotations__": fields}))
        self.smem_bytes = self.shared_storage.size_in_bytes()
        persistent = self._persistent_clusters(c, self.d_grouped, max_active_clusters)
        if cutlass.const_expr(self.schedule.op.splits_last_wave):
            # The op's grid rule: with TAIL_SPLIT 1, every cluster the GPU holds; this kernel
            # splits no tile, so the clusters past the tiles exit at once.
            persistent = cutlass.min(persistent + tail_split * max_active_clusters, max_active_clusters)
        kernel_call = self.kernel(
            tma_atom_a, tma_tensor_a, tma_atom_b, tma_tensor_b, sfa_ptr, sfb_ptr, tma_atom_c, tma_tensor_c,
            m_indices, zero_padding, masked_m, tail_split, group_sizes, alpha,
            a_staged, b_staged, sfa_staged, sfb_staged, epi_staged, cluster_layout_vmnk,
        )
        self._launch_persistent(kernel_call, persistent, stream)

    # ---- device side ------------------------------------------------------------------------
    @cute.jit
    def _group_views(self, mB, mC, m_indices_ptr, masked_m_ptr, group_sizes_ptr):
        """The masked layout's masked_m [G], the contiguous layout's m_indices [M] or the
        k-grouped layout's group sizes [G] (None otherwise: one view, the others None), and the
        bounds metadata read on the GPU is taken into: (rows of A and D, groups of B). Built
        inside each role."""
        mIdx = None
        mMasked = None
        mSizes = None
        if cutlass.const_expr(self.masked):
            mMasked = cute.make_tensor(masked_m_ptr, cute.make_layout(mB.shape[2]))
        elif cutlass.const_expr(self.contiguous):
            mIdx = cute.make_tensor(m_indices_ptr, cute.make_layout(mC.shape[0]))
        elif cutlass.const_expr(self.k_grouped):
            mSizes = cute.make_tensor(group_sizes_ptr, cute.make_layout(mC.shape[2]))
        return mIdx, mMasked, mSizes, (mC.shape[0], mB.shape[2] if self.m_grouped else 1)

    @cute.jit
    def _tile_walk(self, gA, gC, mMasked, mSizes, group_bounds):
        """(K tiles of A, tiles along M and N, tiles in all, this CTA's first tile, the stride);
        the masked layout counts each group's tiles of its masked_m rows, the k-grouped one the
        tiles of every group with tokens (`KGroupedFamily`; a K tile is a 128-token block)."""
        k_tiles = cute.size(gA, mode=[3])
        ct_m = cute.size(gC, mode=[2])
        ct_n = cute.size(gC, mode=[3])
        num_tiles = ct_m * ct_n
        if cutlass.const_expr(self.masked):
            num_tiles = self._masked_total(mMasked, group_bounds[0], ct_n)
        elif cutlass.const_expr(self.k_grouped):
            num_tiles = self._k_grouped_total(mSizes, ct_m * ct_n, k_tiles)
        _, _, first_tile = cute.arch.block_idx()
        _, _, tile_stride = cute.arch.grid_dim()
        return k_tiles, ct_m, ct_n, num_tiles, first_tile, tile_stride

    @cute.jit
    def _locate(self, t, ct_m, ct_n, k_tiles, mMasked, mIdx, mSizes, group_bounds):
        """Scheduled tile t → (group, tile m, tile n, whether it computes, its first K tile, its K
        tiles): a contiguous tile whose first row names no group is padding (no loads, no MMA;
        its rows of D are zeros or left); a k-grouped tile runs over its group's blocks only."""
        max_m, num_groups = group_bounds
        group = cutlass.Int32(0)
        first_k = cutlass.Int32(0)
        tile_k_tiles = k_tiles
        if cutlass.const_expr(self.masked):
            group, tile_m, tile_n = self._masked_locate(t, mMasked, max_m, ct_n)
        elif cutlass.const_expr(self.k_grouped):
            group, local, first_k, tile_k_tiles = self._k_grouped_locate(t, mSizes, ct_m * ct_n, k_tiles)
            tile_m, tile_n = self._cluster_tile_coord(local, ct_m, ct_n)
        else:
            tile_m, tile_n = self._cluster_tile_coord(t, ct_m, ct_n)
        computes = cutlass.Int32(1)
        if cutlass.const_expr(self.contiguous):
            group = self._tile_group(mIdx, tile_m, num_groups)
            computes = cutlass.Int32(1) if group >= 0 else cutlass.Int32(0)
        return group, tile_m, tile_n, computes, first_k, tile_k_tiles

    @cute.jit
    def _scale_atom(self, ptr, row_block, k_tile, k_tiles):
        """The blocked scale atoms of (128-row block, K tile) at byte pointer `ptr` (one 512-byte
        atom, NVFP4's four), as a global tensor of scales. A group's atoms follow the previous
        group's: its row blocks are counted on from theirs."""
        offset = (row_block * k_tiles + k_tile) * self.row_block_scale_bytes
        return cute.make_tensor(
            cute.recast_ptr(ptr + offset, dtype=self.sf_dtype), cute.make_layout(self.row_block_scale_bytes)
        )

    @cute.kernel
    def kernel(
        self,
        tma_atom_a: cute.CopyAtom,
        mA: cute.Tensor,
        tma_atom_b: cute.CopyAtom,
        mB: cute.Tensor,
        sfa_ptr: cute.Pointer,
        sfb_ptr: cute.Pointer,
        tma_atom_c: cute.CopyAtom,
        mC: cute.Tensor,
        m_indices_ptr,
        zero_padding,
        masked_m_ptr,
        tail_split,  # the weight gradient's: it sizes the grid only (see `_launch`)
        group_sizes_ptr,
        alpha_ptr,
        a_staged: cute.ComposedLayout,
        b_staged: cute.ComposedLayout,
        sfa_staged: cute.Layout,
        sfb_staged: cute.Layout,
        epi_staged: cute.ComposedLayout,
        cluster_layout_vmnk: cute.Layout,
    ):
        s = self.schedule
        tm, tn, _ = self.tile_shape_mnk
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == LOAD_WARP:
            cpasync.prefetch_descriptor(tma_atom_a)
            cpasync.prefetch_descriptor(tma_atom_b)
            cpasync.prefetch_descriptor(tma_atom_c)

        tiled_mma = self._make_tiled_mma()
        storage = SmemAllocator().allocate(self.shared_storage)
        # One CTA leads its MMAs; in a pair, the leader (V coordinate 0) issues the pair's.
        is_leader_cta = True
        if cutlass.const_expr(self.pair):
            mma_coord_v, is_leader_cta, cluster_coord_vmnk = self._cluster_coordinates(cluster_layout_vmnk)
            operand_pipeline, accumulator_pipeline, tmem = self._pipelines(
                storage, s.stages, self.tma_bytes, self.acc_stages, EPILOGUE_WARPS * self.mma_ctas,
                cluster_layout_vmnk, True, storage.tmem_dealloc_barrier.ptr,
            )
            scale_landed = storage.scale_landed.data_ptr()
            scale_ready = storage.scale_ready.data_ptr()
            if warp_idx == LOAD_WARP:
                with cute.arch.elect_one():
                    for i in cutlass.range_constexpr(s.stages):
                        cute.arch.mbarrier_init(scale_landed + i, 1)
                        cute.arch.mbarrier_init(scale_ready + i, self.mma_ctas)
                cute.arch.mbarrier_init_fence()
        else:
            operand_pipeline, accumulator_pipeline, tmem = self._pipelines(
                storage, s.stages, self.tma_bytes, self.acc_stages, EPILOGUE_WARPS, cluster_layout_vmnk
            )
        pipeline_init_arrive(cluster_shape_mn=self.cluster_shape_mn, is_relaxed=True)

        sA = storage.sA.get_tensor(a_staged.outer, swizzle=a_staged.inner)
        sB = storage.sB.get_tensor(b_staged.outer, swizzle=b_staged.inner)
        sC = storage.sC.get_tensor(epi_staged.outer, swizzle=epi_staged.inner)
        sSFA = storage.sSFA.get_tensor(sfa_staged)
        sSFB = storage.sSFB.get_tensor(sfb_staged)

        # (rows, cols, tiles m, tiles k[, group]): A and D have a group mode in the masked layout,
        # B in both M-grouped layouts, D alone in the k-grouped one.
        rest_a = (None, None, None) if self.masked else (None, None)
        rest_b = (None, None, None) if self.m_grouped else (None, None)
        rest_c = (None, None, None) if self.d_grouped else (None, None)
        gA = cute.local_tile(mA, cute.slice_(self.mma_tiler, (None, 0, None)), rest_a)
        gB = cute.local_tile(mB, cute.slice_(self.mma_tiler, (0, None, None)), rest_b)
        gC = cute.local_tile(mC, cute.slice_(self.mma_tiler, (None, None, 0)), rest_c)
        thr_mma = tiled_mma.get_slice(mma_coord_v if self.pair else 0)
        tCgA = thr_mma.partition_A(gA)
        tCgB = thr_mma.partition_B(gB)
        tCgC = thr_mma.partition_C(gC)
        if cutlass.const_expr(self.pair):
            tAsA, tAgA, tBsB, tBgB = self._cluster_tma_partitions(
                tma_atom_a, tma_atom_b, sA, sB, tCgA, tCgB, cluster_layout_vmnk, cluster_coord_vmnk
            )
        else:
            one_cta = cute.make_layout(1)
            tAsA, tAgA = cpasync.tma_partition(
                tma_atom_a, 0, one_cta, cute.group_modes(sA, 0, 3), cute.group_modes(tCgA, 0, 3)
            )
            tBsB, tBgB = cpasync.tma_partition(
                tma_atom_b, 0, one_cta, cute.group_modes(sB, 0, 3), cute.group_modes(tCgB, 0, 3)
            )
        tCrA = tiled_mma.make_fragment_A(sA)
        tCrB = tiled_mma.make_fragment_B(sB)
        acc_shape = tiled_mma.partition_shape_C(self.mma_tiler[:2])
        tCtAcc_layout = tiled_mma.make_fragment_C(cute.append(acc_shape, self.acc_stages)).layout
        sfa_stage = cute.slice_(sfa_staged, (None, None, None, 0))
        sfb_stage = cute.slice_(sfb_staged, (None, None, None, 0))
        tCtSFA_layout = blockscaled.make_tmem_layout_sfa(tiled_mma, self.mma_tiler, self.sf_vector, sfa_stage)
        tCtSFB_layout = blockscaled.make_tmem_layout_sfb(tiled_mma, self.mma_tiler, self.sf_vector, sfb_stage)

        pipeline_init_wait(cluster_shape_mn=self.cluster_shape_mn)

        if warp_idx >= EPILOGUE_WARPS:
            cute.arch.setmaxregister_decrease(s.producer_regs)

        # ---- loads ---------------------------------------------------------------------------
        if warp_idx == LOAD_WARP:
            mIdx, mMasked, mSizes, group_bounds = self._group_views(mB, mC, m_indices_ptr, masked_m_ptr, group_sizes_ptr)
            k_tiles, ct_m, ct_n, num_tiles, first_tile, tile_stride = self._tile_walk(gA, gC, mMasked, mSizes, group_bounds)
            chunk_bytes = self.row_block_scale_bytes
            bulk = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), self.sf_dtype, num_bits_per_copy=chunk_bytes * 8)
            sfa_atoms = cute.make_tensor(sSFA.iterator, cute.make_layout((chunk_bytes, s.stages)))
            sfb_atoms = cute.make_tensor(
                sSFB.iterator, cute.make_layout((chunk_bytes, self.sfb_row_blocks, s.stages))
            )
            n_blocks = (mC.shape[1] + MX_ATOM_ROWS - 1) // MX_ATOM_ROWS
            a_mask, b_mask = None, None
            if cutlass.const_expr(self.pair):
                m_blocks = (mC.shape[0] + MX_ATOM_ROWS - 1) // MX_ATOM_ROWS
                a_mask, b_mask = self._pair_multicast_masks(cluster_layout_vmnk, cluster_coord_vmnk)
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, s.stages)
            # A group's scale atoms come after the previous groups': the masked layout's SFA has
            # ⌈max_m/128⌉ row blocks per group, SFB ⌈N/128⌉ per group in both M-grouped layouts;
            # the k-grouped layout's are those of every row and 128-token block (K tile).
            t = first_tile
            while t < num_tiles:
                group, tile_m, tile_n, computes, first_k, tile_k_tiles = self._locate(
                    t, ct_m, ct_n, k_tiles, mMasked, mIdx, mSizes, group_bounds
                )
                b_group = cutlass.max(group, 0)
                sfb_group = 0 if self.k_grouped else b_group
                sfa_block = tile_m
                if cutlass.const_expr(self.masked):
                    tAgA_t = tAgA[(None, tile_m, None, group)]
                    sfa_block = group * ct_m + tile_m
                else:
                    tAgA_t = tAgA[(None, tile_m, None)]
                if cutlass.const_expr(self.pair):
                    # This CTA's 128 rows of the pair's tile; past the rows (loaded as zeros), the
                    # last atom again, so no SFA read leaves the buffer.
                    sfa_block = cutlass.min(tile_m * self.mma_ctas + mma_coord_v, m_blocks - 1)
                    if cutlass.const_expr(self.masked):
                        sfa_block = group * m_blocks + sfa_block
                if cutlass.const_expr(self.m_grouped):
                    tBgB_t = tBgB[(None, tile_n, None, b_group)]
                else:
                    tBgB_t = tBgB[(None, tile_n, None)]
                state.reset_count()
                for _k in range(tile_k_tiles * computes):
                    operand_pipeline.producer_acquire(state)
                    barrier = operand_pipeline.producer_get_barrier(state)
                    k_tile = first_k + state.count
                    cute.copy(
                        tma_atom_a, tAgA_t[(None, k_tile)], tAsA[(None, state.index)], tma_bar_ptr=barrier,
                        mcast_mask=a_mask,
                    )
                    cute.copy(
                        tma_atom_b, tBgB_t[(None, k_tile)], tBsB[(None, state.index)], tma_bar_ptr=barrier,
                        mcast_mask=b_mask,
                    )
                    with cute.arch.elect_one():
                        if cutlass.const_expr(self.pair):
                            barrier = scale_landed + state.index
                            cute.arch.mbarrier_arrive_and_expect_tx(barrier, self.scale_bytes)
                        cute.copy(
                            bulk, self._scale_atom(sfa_ptr, sfa_block, k_tile, k_tiles),
                            sfa_atoms[(None, state.index)], mbar_ptr=barrier,
                        )
                        for j in cutlass.range_constexpr(self.sfb_row_blocks):
                            # Past N: the last atom again (its columns are clipped by the store).
                            n_block = cutlass.min(tile_n * self.sfb_row_blocks + j, n_blocks - 1)
                            cute.copy(
                                bulk, self._scale_atom(sfb_ptr, sfb_group * n_blocks + n_block, k_tile, k_tiles),
                                sfb_atoms[(None, j, state.index)], mbar_ptr=barrier,
                            )
                    operand_pipeline.producer_commit(state)
                    state.advance()
                t += tile_stride
            operand_pipeline.producer_tail(state)

        # ---- scale relay (a CTA pair) ------------------------------------------------------
        if cutlass.const_expr(self.pair):
            if warp_idx == SCALE_RELAY_WARP:
                mIdx, mMasked, mSizes, group_bounds = self._group_views(mB, mC, m_indices_ptr, masked_m_ptr, group_sizes_ptr)
                k_tiles, ct_m, ct_n, num_tiles, first_tile, tile_stride = self._tile_walk(gA, gC, mMasked, mSizes, group_bounds)
                relay_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, s.stages)
                t = first_tile
                while t < num_tiles:
                    _, _, _, computes, _, tile_k_tiles = self._locate(
                        t, ct_m, ct_n, k_tiles, mMasked, mIdx, mSizes, group_bounds
                    )
                    for _k in range(tile_k_tiles * computes):
                        cute.arch.mbarrier_wait(scale_landed + relay_state.index, relay_state.phase)
                        with cute.arch.elect_one():
                            # Release at cluster scope: the leader's tcgen05.cp reads these atoms.
                            cute.arch.mbarrier_arrive(
                                scale_ready + relay_state.index, 0, scope=MemScopeKind.CLUSTER
                            )
                        relay_state.advance()
                    t += tile_stride

        # ---- MMA -----------------------------------------------------------------------------
        if warp_idx == MMA_WARP:
            mIdx, mMasked, mSizes, group_bounds = self._group_views(mB, mC, m_indices_ptr, masked_m_ptr, group_sizes_ptr)
            k_tiles, ct_m, ct_n, num_tiles, first_tile, tile_stride = self._tile_walk(gA, gC, mMasked, mSizes, group_bounds)
            tmem.wait_for_alloc()
            acc_ptr = tmem.retrieve_ptr(self.acc_dtype)
            tCtAcc = cute.make_tensor(acc_ptr, tCtAcc_layout)
            acc_columns = self.acc_stages * tn
            sfa_ptr_t = cute.recast_ptr(acc_ptr + acc_columns, dtype=self.sf_dtype)
            tCtSFA = cute.make_tensor(sfa_ptr_t, tCtSFA_layout)
            sfb_columns = acc_columns + MX_ATOM_TMEM_COLUMNS * self.sfa_atoms
            sfb_ptr_t = cute.recast_ptr(acc_ptr + sfb_columns, dtype=self.sf_dtype)
            tCtSFB = cute.make_tensor(sfb_ptr_t, tCtSFB_layout)
            s2t_sfa, tCsSFA_s2t, tCtSFA_s2t = self._s2t_partition(sSFA, tCtSFA)
            s2t_sfb, tCsSFB_s2t, tCtSFB_s2t = self._s2t_partition(sSFB, tCtSFB)
            operand_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, s.stages)
            acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.acc_stages)
            t = first_tile
            while t < num_tiles:
                _, _, _, computes, _, tile_k_tiles = self._locate(t, ct_m, ct_n, k_tiles, mMasked, mIdx, mSizes, group_bounds)
                # Runs once, or not at all for a padding tile, which takes no accumulator stage.
                for _tile in range(computes):
                    if is_leader_cta:
                        accumulator_pipeline.producer_acquire(acc_state)
                        acc = tCtAcc[(None, None, None, acc_state.index)]
                        tiled_mma.set(tcgen05.Field.ACCUMULATE, False)
                        for _k in range(tile_k_tiles):
                            operand_pipeline.consumer_wait(operand_state)
                            if cutlass.const_expr(self.pair):
                                cute.arch.mbarrier_wait(scale_ready + operand_state.index, operand_state.phase)
                            cute.copy(s2t_sfa, tCsSFA_s2t[(None, None, None, None, operand_state.index)], tCtSFA_s2t)
                            cute.copy(s2t_sfb, tCsSFB_s2t[(None, None, None, None, operand_state.index)], tCtSFB_s2t)
                            for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                                cute.gemm(
                                    tiled_mma, acc,
                                    [tCrA[(None, None, kb, operand_state.index)], tCtSFA[(None, None, kb)]],
                                    [tCrB[(None, None, kb, operand_state.index)], tCtSFB[(None, None, kb)]],
                                    acc,
                                )
                                tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                            operand_pipeline.consumer_release(operand_state)
                            operand_state.advance()
                        accumulator_pipeline.producer_commit(acc_state)
                    acc_state.advance()
                t += tile_stride
            accumulator_pipeline.producer_tail(acc_state)

        # ---- epilogue ------------------------------------------------------------------------
        if warp_idx < EPILOGUE_WARPS:
            cute.arch.setmaxregister_increase(s.consumer_regs)
            if cutlass.const_expr(self.nvfp4):
                # NVFP4's per-tensor scales, one fp32 factor of every element of D.
                alpha = cute.make_tensor(alpha_ptr, cute.make_layout(1))[0]
            mIdx, mMasked, mSizes, group_bounds = self._group_views(mB, mC, m_indices_ptr, masked_m_ptr, group_sizes_ptr)
            k_tiles, ct_m, ct_n, num_tiles, first_tile, tile_stride = self._tile_walk(gA, gC, mMasked, mSizes, group_bounds)
            tmem.allocate(self._tmem_allocation())
            tmem.wait_for_alloc()
            tidx, _, _ = cute.arch.thread_idx()
            tmem_ptr = tmem.retrieve_ptr(self.acc_dtype)
            tCtAcc = cute.make_tensor(tmem_ptr, tCtAcc_layout)
            tiled_t2r, thr_t2r, tTR_tAcc = self._tmem_loads(tCtAcc, tidx, self.pair)
            gC_epi = cute.flat_divide(tCgC[((None, None), 0, 0, *rest_c)], s.epi_tile)
            tTR_gC = thr_t2r.partition_D(gC_epi)
            first_tile_coord = (0,) * len(rest_c)
            chunk = cute.make_rmem_tensor(tTR_gC[(None, None, None, 0, 0, *first_tile_coord)].shape, self.acc_dtype)
            tiled_r2s, tRS_sC, out_chunk, tRS_rC = self._smem_stores(tiled_t2r, sC, chunk, tidx)
            epilogue_barrier = pipeline.NamedBarrier(
                barrier_id=EPILOGUE_BARRIER_ID, num_threads=THREADS_PER_WARP * EPILOGUE_WARPS
            )
            store_pipeline = pipeline.PipelineTmaStore.create(
                num_stages=s.epilogue_stages,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, THREADS_PER_WARP * EPILOGUE_WARPS),
            )
            acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.acc_stages)
            sub_tiles_done = cutlass.Int32(0)
            t = first_tile
            while t < num_tiles:
                group, tile_m, tile_n, computes, _, _ = self._locate(
                    t, ct_m, ct_n, k_tiles, mMasked, mIdx, mSizes, group_bounds
                )
                tile_coord = (tile_m, tile_n, group) if self.d_grouped else (tile_m, tile_n)
                gC_tile = gC_epi[(None, None, None, None, *tile_coord)]
                bSG_sC, bSG_gC = cpasync.tma_partition(
                    tma_atom_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), cute.group_modes(gC_tile, 0, 2)
                )
                bSG_gC = cute.group_modes(bSG_gC, 1, cute.rank(bSG_gC))
                # The contiguous layout's padding: a tile of padding rows has no accumulator and is
                # written as zeros (or, with zero_padding 0, not at all); within a tile, this
                # thread's row (TMEM lane tidx) is zeroed when m_indices names no group for it.
                write_tile = cutlass.Int32(1)
                zero_row = cutlass.Int32(0)
                if cutlass.const_expr(self.contiguous):
                    write_tile = cutlass.Int32(1) if (computes != 0) | (zero_padding != 0) else cutlass.Int32(0)
                    row = tile_m * tm + tidx
                    if zero_padding != 0:
                        if row < mC.shape[0]:
                            if self._group_or_padding(mIdx[row], group_bounds[1]) < 0:
                                zero_row = cutlass.Int32(1)
                for _tile in range(computes):
                    accumulator_pipeline.consumer_wait(acc_state)
                acc_t = tTR_tAcc[(None, None, None, None, None, acc_state.index)]
                acc_t = cute.group_modes(acc_t, 3, cute.rank(acc_t))
                sub_tiles = cute.size(acc_t, mode=[3])
                for sub in cutlass.range_constexpr(sub_tiles):
                    if cutlass.const_expr(self.contiguous):
                        chunk.fill(0.0)
                        if (computes != 0) & (zero_row == 0):
                            cute.copy(tiled_t2r, acc_t[(None, None, None, sub)], chunk)
                    else:
                        cute.copy(tiled_t2r, acc_t[(None, None, None, sub)], chunk)
                    # The tensor-memory load is asynchronous: wait for it before reading the chunk.
                    cute.arch.fence_view_async_tmem_load()
                    if cutlass.const_expr(self.nvfp4):
                        out_chunk.store((chunk.load() * alpha).to(self.c_dtype))
                    else:
                        out_chunk.store(chunk.load().to(self.c_dtype))
                    buffer = (sub_tiles_done + sub) % s.epilogue_stages
                    cute.copy(tiled_r2s, tRS_rC, tRS_sC[(None, None, None, buffer)])
                    # Make the shared-memory writes visible to the TMA unit before the store.
                    cute.arch.fence_proxy("async.shared", space="cta")
                    epilogue_barrier.arrive_and_wait()
                    if warp_idx == 0:
                        if write_tile != 0:
                            cute.copy(tma_atom_c, bSG_sC[(None, buffer)], bSG_gC[(None, sub)])
                        store_pipeline.producer_commit()
                        store_pipeline.producer_acquire()
                    epilogue_barrier.arrive_and_wait()
                for _tile in range(computes):
                    # Every load from the stage has completed: the MMA may overwrite it.
                    with cute.arch.elect_one():
                        accumulator_pipeline.consumer_release(acc_state)
                    acc_state.advance()
                sub_tiles_done += sub_tiles
                t += tile_stride

            tmem.relinquish_alloc_permit()
            epilogue_barrier.arrive_and_wait()
            tmem.free(tmem_ptr)
            store_pipeline.producer_tail()

    def _tmem_allocation(self) -> int:
        """Columns allocated: the accumulators' and the scales' (`Schedule.tmem_columns`), rounded up
        to a power of two of at least 32."""
        columns = 32
        while columns < self.schedule.tmem_columns:
            columns *= 2
        return min(columns, SM100_TMEM_COLUMNS)

    @cute.jit
    def _s2t_partition(self, sSF, tSF):
        """The shared → tensor memory copy of a stage's scale atoms (`tcgen05.cp` 32x128b.warpx4):
        (the tiled copy, its staged shared-memory source, its tensor-memory destination)."""
        compact_s = cute.filter_zeros(sSF)
        compact_t = cute.filter_zeros(tSF)
        # A pair's copy (cta_group::2, issued by the leader) fills each CTA's tensor memory from
        # its own shared memory.
        atom = cute.make_copy_atom(tcgen05.Cp4x32x128bOp(self.cta_group), self.sf_dtype)
        tiled = tcgen05.make_s2t_copy(atom, compact_t)
        thr = tiled.get_slice(0)
        source = tcgen05.get_s2t_smem_desc_tensor(tiled, thr.partition_S(compact_s))
        return tiled, source, thr.partition_D(compact_t)


class BlackwellMxFp8GemmNtKernel(Fp8GemmNtMxEntry, BlackwellBlockScaledKernel):
    """`fp8_gemm_nt` on sm_100a with its UE8M0 scales applied by the MMA (scale = mx)."""


class BlackwellNvfp4GemmNtKernel(Nvfp4GemmNtEntry, BlackwellBlockScaledKernel):
    """`nvfp4_gemm_nt` on sm_100a: D = alpha · (A · sfa) · (B · sfb)ᵀ, FP4 A and B with NVFP4's E4M3
    scales applied by the MMA (scale = nv)."""


class BlackwellMxFp8WgradKernel(Fp8WgradMxEntry, BlackwellBlockScaledKernel):
    """`fp8_wgrad_gemm_nt` on sm_100a: D (fp32) += (A · sfa) · (B · sfb)ᵀ, the scales applied by the MMA."""


class BlackwellMxMGroupedContiguousKernel(MGroupedContiguousMxEntry, BlackwellBlockScaledKernel):
    """`m_grouped_fp8_gemm_nt_contiguous` on sm_100a with the scales applied by the MMA."""


class BlackwellMxMGroupedMaskedKernel(MGroupedMaskedMxEntry, BlackwellBlockScaledKernel):
    """`m_grouped_fp8_gemm_nt_masked` on sm_100a with the scales applied by the MMA."""


class BlackwellMxKGroupedTnKernel(KGroupedTnMxEntry, BlackwellBlockScaledKernel):
    """`k_grouped_fp8_gemm_tn_contiguous` on sm_100a: D[g] (fp32) += (A_g · sfa_g)ᵀ · (B_g · sfb_g)
    over each group's 128-token blocks of A [Σk, M] and B [Σk, N], the scales applied by the MMA."""
