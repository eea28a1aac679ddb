"""Blackwell (sm_100a) warp-specialised persistent FP8 GEMM templates with tcgen05 MMA:
D[M,N] bf16 = (A e4m3 · sfa per 1x128) · (B e4m3 · sfb per 128x128)ᵀ, and its M-grouped
(contiguous and masked) mixture-of-experts variants, with Hopper's semantics and operands.

Importing this module imports the CuTe DSL; only the generator does that.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, tcgen05
from cutlass.memory import SmemAllocator
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait
from cutlass.tensor_utils import LayoutEnum

from cutegen.schedules.spec import SCALE_BLOCK, Op, Raster, ScaleFormat, Schedule
from cutegen.templates.dtypes import cute_dtype
from cutegen.templates.blackwell_block_scaled import (
    BlackwellMxFp8GemmNtKernel,
    BlackwellMxFp8WgradKernel,
    BlackwellMxKGroupedTnKernel,
    BlackwellMxMGroupedContiguousKernel,
    BlackwellMxMGroupedMaskedKernel,
    BlackwellNvfp4GemmNtKernel,
)
from cutegen.templates.gemm_contract import GemmContract, shape_binding, tma_binding, with_group_mode
from cutegen.templates.gemm_entries import Fp8GemmNtEntry, MGroupedContiguousEntry, MGroupedMaskedEntry
from cutegen.templates.blackwell_common import (
    EPILOGUE_BARRIER_ID,
    EPILOGUE_WARPS,
    LOAD_WARP,
    MMA_WARP,
    THREADS_PER_WARP,
    BlackwellRoles,
)
from cutegen.templates.tile_order import TileOrder



class BlackwellFp8GemmKernel(BlackwellRoles, TileOrder):
    """Persistent warp-specialised tcgen05 FP8 GEMM with fp32 block-scale promotion outside the MMA.

    Operands as on Hopper (all K-major, "NT"): A [M, K] e4m3, B [N, K] e4m3, D [M, N] bf16 row-major;
    SFA [M, ⌈K/128⌉] fp32 MN-major (column stride align(M, 4)), SFB [⌈N/128⌉, ⌈K/128⌉] fp32
    row-major. M, N, K and the leading strides are run-time values; the TMA unit zero-fills loads
    past M, N, K and clips stores.

    CTA tile: 128 rows x tile_n columns; a CTA pair (cluster 2x1) issues one 2-CTA MMA of 256 x
    tile_n (cta_group::2): each CTA loads its own 128 rows of A and half of B, and the pair's
    accumulator lives in both CTAs' tensor memory (128 lanes each).

    Warp roles (threads = 256):
      - warps 0-3 — **accumulator update and epilogue** (setmaxnreg up to `consumer_regs`): thread
        i owns row i of the CTA's accumulator (TMEM lane i) and keeps that row's promoted fp32
        sum in registers. Per K block it waits for the block's accumulator stage, loads it from
        tensor memory in 32-column chunks (tcgen05.ld), adds acc · sfa[row, kb] · sfb[n block, kb]
        (SFA and SFB read from global memory, where L2 keeps them), waits for the loads
        (tcgen05.wait::ld) and releases the stage. After the tile's last K block: bf16
        conversion, stores into a swizzled shared-memory ring of `epilogue_stages` 128x32
        sub-tiles, and warp 0 TMA-stores each sub-tile. Warp 0 also allocates and frees the
        tensor memory.
      - warp 4 — **TMA producer** (setmaxnreg down to `producer_regs`): per K block, waits for a
        free stage and loads A and B into it (a CTA pair's loads complete on the leader's barrier).
      - warp 5 — **MMA issuer**: per K block, in the leader CTA only, waits for the stage and a
        free accumulator stage, issues the block's four K=32 tcgen05 MMAs into it starting from
        zero (ACCUMULATE off for the first: the tensor cores never accumulate across 128-wide K
        blocks, the promotion does, as DeepSeek-V3's recipe asks), then commits: the commit
        releases the smem stage and signals the accumulator stage full (to both CTAs of a pair).
      - warps 6-7 idle (they lower their register budget with warps 4 and 5: setmaxnreg is
        executed by whole warpgroups).

    Pipelines:
      - **operands** (PipelineTmaUmma, `stages` slots of A+B): producer = the TMA warp(s) of the
        pair (transaction bytes of both CTAs on the leader's full barrier); consumer = the
        leader's MMA warp (tcgen05.commit to the empty barrier, multicast to the pair).
      - **accumulators** (PipelineUmmaAsync, `tmem_accumulator_stages` x tile_n TMEM columns):
        producer = the MMA warp (commit per K block); consumers = the 4 update warps of every
        CTA of the pair (one elected arrive per warp on the leader's empty barrier).
      - **epilogue store** (PipelineTmaStore, `epilogue_stages` slots): producer = warp 0's TMA
        stores, drained before exit.

    Barriers: the pipelines' mbarriers (initialised before a cluster-wide arrive/wait); named
    barrier EPILOGUE_BARRIER_ID over the 128 update threads around each epilogue sub-tile
    (smem written → fence.proxy.async → TMA store issued → buffer reusable); named barrier
    TMEM_ALLOC_BARRIER_ID (warp 0's tcgen05.alloc → the MMA and update warps read the address);
    a CTA pair's TMEM free waits on a dealloc mbarrier so neither CTA frees memory its peer's MMA
    still writes.

    Scheduling: the grid is (cluster_m, 1, P) with cluster (cluster_m, 1, 1); cluster z walks
    output tiles z, z+P, … (banded by `group_size` for L2 reuse; the masked layout walks each
    group's ⌈masked_m[g]/rows⌉ tiles on the GPU; the contiguous layout skips the MMA of tiles made
    of padding rows only and writes their rows as zeros unless told not to). The three roles
    compute the same sequence independently.
    """

    def __init__(self, schedule: Schedule):
        s = schedule
        self.schedule = s
        self.a_dtype = cute_dtype(s.a_dtype)
        self.b_dtype = cute_dtype(s.b_dtype)
        self.c_dtype = cute_dtype(s.c_dtype)
        self.acc_dtype = cute_dtype(s.acc_dtype)
        self.tile_shape_mnk = (s.tile_m, s.tile_n, s.tile_k)
        self.mma_ctas = s.mma_ctas
        self.cta_group = tcgen05.CtaGroup.TWO if s.mma_ctas == 2 else tcgen05.CtaGroup.ONE
        # The MMA tile: a CTA pair's MMA covers both CTAs' rows.
        self.mma_tiler = (s.tile_m * s.mma_ctas, s.tile_n, s.tile_k)
        self.cluster_shape_mn = (s.cluster_m, s.cluster_n)
        self.threads_per_cta = s.threads_per_cta
        self.ab_stage = s.stages
        self.acc_stage = s.tmem_accumulator_stages
        self.epi_stage = s.epilogue_stages
        self.epi_tile = s.epi_tile
        self.tmem_alloc_columns = _tmem_allocation(s.tmem_columns)
        self.producer_regs = s.producer_regs
        self.consumer_regs = s.consumer_regs
        self.m_grouped = s.op.is_m_grouped
        self.masked = s.op.is_masked
        self.contiguous = self.m_grouped and not self.masked
        # UE8M0 scales: SFA [M, ⌈K/512⌉] and SFB [⌈N/128⌉, ⌈K/512⌉] int32, four exponent bytes per
        # word (byte j of word w: K block 4w + j), decoded to 2^(e-127) in the update warps.
        self.ue8m0 = s.scale == ScaleFormat.UE8M0
        self.group_size = s.group_size
        self.raster_along_m = s.raster == Raster.ALONG_M
        # A scheduled tile of the masked layout is one MMA tile (a pair's 256 rows).
        self.masked_tile_rows = s.tile_m * s.mma_ctas
        self.buffer_align_bytes = 1024
        # Filled while tracing the host function.
        self.smem_bytes: int | None = None

    def _make_tiled_mma(self):
        return sm100_utils.make_trivial_tiled_mma(
            self.a_dtype,
            self.b_dtype,
            OperandMajorMode.K,
            OperandMajorMode.K,
            self.acc_dtype,
            self.cta_group,
            self.mma_tiler[:2],
        )

    # ---- launch contract ----------------------------------------------------------------------
    def param_bindings(self) -> list[dict]:
        """The kernel's parameters in order, each with the binding the runtime fills it from.

        Valid after tracing. A and B are TMA descriptors whose box is one CTA's share (a pair's
        CTA loads half of B's rows); SFA is a plain tensor (pointer, extents, strides) read by
        the update warps; SFB a pointer; D a TMA store descriptor of one 128x32 sub-tile.
        """
        if self.smem_bytes is None:
            raise RuntimeError("param_bindings() is only known after the kernel has been traced")
        tm, tn, tk = self.tile_shape_mnk
        em, en = self.epi_tile
        s = self.schedule

        def tma(operand: str, dtype: str, box_rows: int, box_cols: int, grouped: bool) -> dict:
            recipe = tma_binding(operand, dtype, box_rows, box_cols, self.smem_swizzles[operand])
            return with_group_mode(recipe, grouped)

        shape = shape_binding

        params = [
            {"name": "tma_a", **tma("a", s.a_dtype.value, tm, tk, self.masked)},
            {"name": "extents_a", **shape("a", ["M", "K"], self.masked)},
            {"name": "tma_b", **tma("b", s.b_dtype.value, tn // self.mma_ctas, tk, self.m_grouped)},
            {"name": "extents_b", **shape("b", ["N", "K"], self.m_grouped)},
            # SFA (M, KB[, G]) (UE8M0: KW words) with strides (1, dynamic[, dynamic]): torch modes
            # KB (and G).
            {
                "name": "sfa",
                "kind": "tensor",
                "operand": "sfa",
                "shape": ["M", "KW" if self.ue8m0 else "KB"] + ["G"] * self.masked,
                "shape_widths": [32] * (2 + self.masked),
                "strides": [2, 0] if self.masked else [1],
                "stride_widths": [64] * (1 + self.masked),
            },
            {"name": "sfb", "kind": "pointer", "operand": "sfb"},
            {"name": "tma_d", **tma("d", s.c_dtype.value, em, en, self.masked)},
            {"name": "extents_d", **shape("d", ["M", "N"], self.masked)},
        ]
        if self.masked:
            params.append({"name": "masked_m", "kind": "pointer", "operand": "masked_m"})
        elif self.contiguous:
            params += [
                {"name": "m_indices", "kind": "pointer", "operand": "m_indices"},
                {"name": "zero_padding", "kind": "scalar", "dtype": "i32", "expr": "ZERO_PADDING"},
            ]
        return params

    # ---- host side --------------------------------------------------------------------------
    @cute.jit
    def _launch(self, a, b, c, sfa, sfb, max_active_clusters, stream, m_indices=None, zero_padding=None, masked_m=None):
        tm, tn, tk = self.tile_shape_mnk
        cm, cn = self.cluster_shape_mn
        tiled_mma = self._make_tiled_mma()
        # (V, M, N, K) view of the cluster: V = the CTAs of one MMA.
        cluster_layout_vmnk = cute.tiled_divide(cute.make_layout((cm, cn, 1)), (tiled_mma.thr_id.shape,))
        a_staged = sm100_utils.make_smem_layout_a(tiled_mma, self.mma_tiler, self.a_dtype, self.ab_stage)
        b_staged = sm100_utils.make_smem_layout_b(tiled_mma, self.mma_tiler, self.b_dtype, self.ab_stage)
        epi_staged = sm100_utils.make_smem_layout_epi(
            self.c_dtype, LayoutEnum.ROW_MAJOR, self.epi_tile, self.epi_stage
        )
        self.smem_swizzles = {"a": str(a_staged.inner), "b": str(b_staged.inner), "d": str(epi_staged.inner)}

        a_one_stage = cute.slice_(a_staged, (None, None, None, 0))
        b_one_stage = cute.slice_(b_staged, (None, None, None, 0))
        load_op = cpasync.CopyBulkTensorTileG2SOp(self.cta_group)
        tma_atom_a, tma_tensor_a = cute.nvgpu.make_tiled_tma_atom_A(
            load_op, a, a_one_stage, self.mma_tiler, tiled_mma, cluster_layout_vmnk.shape
        )
        tma_atom_b, tma_tensor_b = cute.nvgpu.make_tiled_tma_atom_B(
            load_op, b, b_one_stage, self.mma_tiler, tiled_mma, cluster_layout_vmnk.shape
        )
        # Both CTAs' bytes land on the leader's full barrier.
        self.tma_bytes = (
            cute.size_in_bytes(self.a_dtype, a_one_stage) + cute.size_in_bytes(self.b_dtype, b_one_stage)
        ) * self.mma_ctas
        tma_atom_c, tma_tensor_c = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), c, cute.slice_(epi_staged, (None, None, 0)), self.epi_tile
        )

        @cute.struct
        class SharedStorage:
            operand_barriers: cute.struct.MemRange[cutlass.Int64, self.ab_stage * 2]
            accumulator_barriers: cute.struct.MemRange[cutlass.Int64, self.acc_stage * 2]
            tmem_dealloc_barrier: cutlass.Int64
            tmem_address: cutlass.Int32
            sC: cute.struct.Align[
                cute.struct.MemRange[self.c_dtype, cute.cosize(epi_staged.outer)], self.buffer_align_bytes
            ]
            sA: cute.struct.Align[
                cute.struct.MemRange[self.a_dtype, cute.cosize(a_staged.outer)], self.buffer_align_bytes
            ]
            sB: cute.struct.Align[
                cute.struct.MemRange[self.b_dtype, cute.cosize(b_staged.outer)], self.buffer_align_bytes
            ]

        self.shared_storage = SharedStorage
        self.smem_bytes = SharedStorage.size_in_bytes()

        persistent = self._persistent_clusters(c, self.masked, max_active_clusters)

        kernel_call = self.kernel(
            tma_atom_a,
            tma_tensor_a,
            tma_atom_b,
            tma_tensor_b,
            sfa,
            sfb,
            tma_atom_c,
            tma_tensor_c,
            m_indices,
            zero_padding,
            masked_m,
            a_staged,
            b_staged,
            epi_staged,
            cluster_layout_vmnk,
        )
        self._launch_persistent(kernel_call, persistent, stream)

    # ---- device side ------------------------------------------------------------------------
    @cute.jit
    def _locate(self, t, ct_m, ct_n, mMasked, mIdx, k_tile_cnt, group_bounds):
        """Scheduled tile t → (group, MMA tile m, tile n, K blocks to compute); every role walks
        the same sequence. Contiguous tiles of padding rows only get no K block."""
        max_m, num_groups = group_bounds
        group = cutlass.Int32(0)
        k_tiles = k_tile_cnt
        if cutlass.const_expr(self.masked):
            group, tile_m, tile_n = self._masked_locate(t, mMasked, max_m, ct_n)
        else:
            tile_m, tile_n = self._cluster_tile_coord(t, ct_m, ct_n)
        if cutlass.const_expr(self.contiguous):
            group = self._tile_group(mIdx, tile_m, num_groups)
            k_tiles = k_tile_cnt if group >= 0 else cutlass.Int32(0)
        return group, tile_m, tile_n, k_tiles

    @cute.jit
    def _group_views(self, mSFA, sfb_ptr, mB, mC, m_indices_ptr, masked_m_ptr):
        """SFB as (n block, k block[, group]) over the row-major [[G,] ⌈N/128⌉, ⌈K/128⌉], and the
        masked layout's masked_m [G] or the contiguous layout's m_indices [M] (None otherwise),
        and the bounds that metadata read on the GPU is taken into: (the rows of A and D, the
        groups of B). Built inside each role, like `_tile_walk`."""
        k_blocks = mSFA.shape[1]
        n_blocks = (mC.shape[1] + SCALE_BLOCK - 1) // SCALE_BLOCK
        if cutlass.const_expr(self.m_grouped):
            mSFB = cute.make_tensor(
                sfb_ptr,
                cute.make_layout((n_blocks, k_blocks, mB.shape[2]), stride=(k_blocks, 1, n_blocks * k_blocks)),
            )
        else:
            mSFB = cute.make_tensor(sfb_ptr, cute.make_layout((n_blocks, k_blocks), stride=(k_blocks, 1)))
        mIdx = None
        mMasked = None
        if cutlass.const_expr(self.masked):
            mMasked = cute.make_tensor(masked_m_ptr, cute.make_layout(mB.shape[2]))
        elif cutlass.const_expr(self.contiguous):
            mIdx = cute.make_tensor(m_indices_ptr, cute.make_layout(mC.shape[0]))
        return mSFB, mIdx, mMasked, (mC.shape[0], mB.shape[2] if self.m_grouped else 1)

    @cute.jit
    def _block_scale(self, mSFA, mSFB, row, n_block, k, group, sfb_group):
        """sfa[row, k] · sfb[n block, k] of K block k (of group `group` / `sfb_group`), fp32."""
        if cutlass.const_expr(self.ue8m0):
            word = k // 4
            shift = (k % 4) * 8
            return _ue8m0_value(mSFA[(row, word)], shift) * _ue8m0_value(mSFB[(n_block, word)], shift)
        if cutlass.const_expr(self.masked):
            return mSFA[(row, k, group)] * mSFB[(n_block, k, group)]
        if cutlass.const_expr(self.m_grouped):
            return mSFA[(row, k)] * mSFB[(n_block, k, sfb_group)]
        return mSFA[(row, k)] * mSFB[(n_block, k)]

    @cute.jit
    def _tile_walk(self, gA, gC, mMasked, group_bounds):
        """(K blocks per tile, tiles along M, tiles along N, tiles in all, this CTA's first tile,
        the stride between its tiles). Each role computes it after its setmaxnreg, so nothing
        stays live across the register reconfiguration."""
        k_tile_cnt = cute.size(gA, mode=[3])
        ct_m = cute.size(gC, mode=[2])
        ct_n = cute.size(gC, mode=[3])
        num_tiles = ct_m * ct_n
        if cutlass.const_expr(self.masked):
            num_tiles = self._masked_total(mMasked, group_bounds[0], ct_n)
        _, _, first_tile = cute.arch.block_idx()
        _, _, tile_stride = cute.arch.grid_dim()
        return k_tile_cnt, ct_m, ct_n, num_tiles, first_tile, tile_stride

    @cute.kernel
    def kernel(
        self,
        tma_atom_a: cute.CopyAtom,
        mA: cute.Tensor,
        tma_atom_b: cute.CopyAtom,
        mB: cute.Tensor,
        mSFA: cute.Tensor,
        sfb_ptr: cute.Pointer,
        tma_atom_c: cute.CopyAtom,
        mC: cute.Tensor,
        m_indices_ptr,
        zero_padding,
        masked_m_ptr,
        a_staged: cute.ComposedLayout,
        b_staged: cute.ComposedLayout,
        epi_staged: cute.ComposedLayout,
        cluster_layout_vmnk: cute.Layout,
    ):
        tm, tn, tk = self.tile_shape_mnk
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == LOAD_WARP:
            cpasync.prefetch_descriptor(tma_atom_a)
            cpasync.prefetch_descriptor(tma_atom_b)
            cpasync.prefetch_descriptor(tma_atom_c)

        tiled_mma = self._make_tiled_mma()
        two_cta = self.mma_ctas == 2
        mma_coord_v, is_leader_cta, cluster_coord_vmnk = self._cluster_coordinates(cluster_layout_vmnk)

        storage = SmemAllocator().allocate(self.shared_storage)
        operand_pipeline, accumulator_pipeline, tmem = self._pipelines(
            storage, self.ab_stage, self.tma_bytes, self.acc_stage, EPILOGUE_WARPS * self.mma_ctas, cluster_layout_vmnk, two_cta, storage.tmem_dealloc_barrier.ptr
        )
        pipeline_init_arrive(cluster_shape_mn=self.cluster_shape_mn, is_relaxed=True)

        sA = storage.sA.get_tensor(a_staged.outer, swizzle=a_staged.inner)
        sB = storage.sB.get_tensor(b_staged.outer, swizzle=b_staged.inner)
        sC = storage.sC.get_tensor(epi_staged.outer, swizzle=epi_staged.inner)

        # Global tiles per MMA tile: (bM, bK, RestM, RestK[, G]), (bN, bK, RestN, RestK[, G]),
        # (bM, bN, RestM, RestN[, G]); cC holds each element's (m, n[, g]) coordinate.
        rest_a = (None, None, None) if self.masked else (None, None)
        rest_b = (None, None, None) if self.m_grouped else (None, None)
        gA = cute.local_tile(mA, cute.slice_(self.mma_tiler, (None, 0, None)), rest_a)
        gB = cute.local_tile(mB, cute.slice_(self.mma_tiler, (0, None, None)), rest_b)
        gC = cute.local_tile(mC, cute.slice_(self.mma_tiler, (None, None, 0)), rest_a)
        cC = cute.local_tile(
            cute.make_identity_tensor(mC.shape), cute.slice_(self.mma_tiler, (None, None, 0)), rest_a
        )
        thr_mma = tiled_mma.get_slice(mma_coord_v)
        tCgA = thr_mma.partition_A(gA)
        tCgB = thr_mma.partition_B(gB)
        tCgC = thr_mma.partition_C(gC)
        tCcC = thr_mma.partition_C(cC)

        tAsA, tAgA, tBsB, tBgB = self._cluster_tma_partitions(
            tma_atom_a, tma_atom_b, sA, sB, tCgA, tCgB, cluster_layout_vmnk, cluster_coord_vmnk
        )
        tCrA = tiled_mma.make_fragment_A(sA)
        tCrB = tiled_mma.make_fragment_B(sB)
        acc_shape = tiled_mma.partition_shape_C(self.mma_tiler[:2])
        tCtAcc_layout = tiled_mma.make_fragment_C(cute.append(acc_shape, self.acc_stage)).layout

        pipeline_init_wait(cluster_shape_mn=self.cluster_shape_mn)

        # setmaxnreg is executed by every warp of a warpgroup: warps 4-7 (TMA, MMA, two idle)
        # give registers back together, warps 0-3 take them.
        if warp_idx >= EPILOGUE_WARPS:
            cute.arch.setmaxregister_decrease(self.producer_regs)

        # ---- TMA producer -------------------------------------------------------------------
        if warp_idx == LOAD_WARP:
            mSFB, mIdx, mMasked, group_bounds = self._group_views(mSFA, sfb_ptr, mB, mC, m_indices_ptr, masked_m_ptr)
            k_tile_cnt, ct_m, ct_n, num_tiles, first_tile, tile_stride = self._tile_walk(gA, gC, mMasked, group_bounds)
            a_mask, b_mask = self._pair_multicast_masks(cluster_layout_vmnk, cluster_coord_vmnk)
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.ab_stage)
            t = first_tile
            while t < num_tiles:
                group, tile_m, tile_n, k_tiles = self._locate(t, ct_m, ct_n, mMasked, mIdx, k_tile_cnt, group_bounds)
                if cutlass.const_expr(self.masked):
                    tAgA_t = tAgA[(None, tile_m, None, group)]
                else:
                    tAgA_t = tAgA[(None, tile_m, None)]
                if cutlass.const_expr(self.m_grouped):
                    tBgB_t = tBgB[(None, tile_n, None, cutlass.max(group, 0))]
                else:
                    tBgB_t = tBgB[(None, tile_n, None)]
                state.reset_count()
                for _k in range(k_tiles):
                    operand_pipeline.producer_acquire(state)
                    barrier = operand_pipeline.producer_get_barrier(state)
                    cute.copy(
                        tma_atom_a, tAgA_t[(None, state.count)], tAsA[(None, state.index)],
                        tma_bar_ptr=barrier, mcast_mask=a_mask,
                    )
                    cute.copy(
                        tma_atom_b, tBgB_t[(None, state.count)], tBsB[(None, state.index)],
                        tma_bar_ptr=barrier, mcast_mask=b_mask,
                    )
                    operand_pipeline.producer_commit(state)
                    state.advance()
                t += tile_stride
            operand_pipeline.producer_tail(state)

        # ---- MMA issuer ---------------------------------------------------------------------
        if warp_idx == MMA_WARP:
            mSFB, mIdx, mMasked, group_bounds = self._group_views(mSFA, sfb_ptr, mB, mC, m_indices_ptr, masked_m_ptr)
            k_tile_cnt, ct_m, ct_n, num_tiles, first_tile, tile_stride = self._tile_walk(gA, gC, mMasked, group_bounds)
            tmem.wait_for_alloc()
            tCtAcc = cute.make_tensor(tmem.retrieve_ptr(self.acc_dtype), tCtAcc_layout)
            operand_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stage)
            acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.acc_stage)
            mma_k_blocks = cute.size(tCrA, mode=[2])
            t = first_tile
            while t < num_tiles:
                _, _, _, k_tiles = self._locate(t, ct_m, ct_n, mMasked, mIdx, k_tile_cnt, group_bounds)
                for _k in range(k_tiles):
                    if is_leader_cta:
                        accumulator_pipeline.producer_acquire(acc_state)
                        operand_pipeline.consumer_wait(operand_state)
                        acc = tCtAcc[(None, None, None, acc_state.index)]
                        # Each 128-wide K block starts from zero: promotion accumulates.
                        tiled_mma.set(tcgen05.Field.ACCUMULATE, False)
                        for kb in cutlass.range_constexpr(mma_k_blocks):
                            cute.gemm(
                                tiled_mma,
                                acc,
                                tCrA[(None, None, kb, operand_state.index)],
                                tCrB[(None, None, kb, operand_state.index)],
                                acc,
                            )
                            tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                        operand_pipeline.consumer_release(operand_state)
                        accumulator_pipeline.producer_commit(acc_state)
                    operand_state.advance()
                    acc_state.advance()
                t += tile_stride
            accumulator_pipeline.producer_tail(acc_state)

        # ---- accumulator update and epilogue ------------------------------------------------
        if warp_idx < EPILOGUE_WARPS:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            mSFB, mIdx, mMasked, group_bounds = self._group_views(mSFA, sfb_ptr, mB, mC, m_indices_ptr, masked_m_ptr)
            k_tile_cnt, ct_m, ct_n, num_tiles, first_tile, tile_stride = self._tile_walk(gA, gC, mMasked, group_bounds)
            tmem.allocate(self.tmem_alloc_columns)
            tmem.wait_for_alloc()
            tidx, _, _ = cute.arch.thread_idx()
            tmem_ptr = tmem.retrieve_ptr(self.acc_dtype)
            tCtAcc = cute.make_tensor(tmem_ptr, tCtAcc_layout)

            # TMEM → registers per 128x32 sub-tile: (T2R, T2R_M, T2R_N, EPI_M, EPI_N, STAGE).
            tiled_t2r, thr_t2r, tTR_tAcc = self._tmem_loads(tCtAcc, tidx, two_cta)
            # (EPI_M, EPI_N, nEPI_M, nEPI_N, RestM, RestN[, G]) and its per-thread partition.
            rest_c = (None, None, None) if self.masked else (None, None)
            gC_epi = cute.flat_divide(tCgC[((None, None), 0, 0, *rest_c)], self.epi_tile)
            cC_epi = cute.flat_divide(tCcC[((None, None), 0, 0, *rest_c)], self.epi_tile)
            tTR_gC = thr_t2r.partition_D(gC_epi)
            tTR_cC = thr_t2r.partition_D(cC_epi)
            first_tile_coord = (0,) * (3 if self.masked else 2)
            chunk = cute.make_rmem_tensor(
                tTR_gC[(None, None, None, 0, 0, *first_tile_coord)].shape, self.acc_dtype
            )
            promoted_full = cute.make_rmem_tensor(
                tTR_gC[(None, None, None, None, None, *first_tile_coord)].shape, self.acc_dtype
            )
            # (T2R, T2R_M, T2R_N, SUB): the row's promoted sum, one SUB per epilogue sub-tile.
            promoted = cute.group_modes(promoted_full, 3, cute.rank(promoted_full))
            sub_tiles = cute.size(promoted, mode=[3])

            # Registers → swizzled smem (the store matching the TMEM load's layout) → TMA store.
            tiled_r2s, tRS_sC, out_chunk, tRS_rC = self._smem_stores(tiled_t2r, sC, chunk, tidx)
            epilogue_barrier = pipeline.NamedBarrier(
                barrier_id=EPILOGUE_BARRIER_ID, num_threads=THREADS_PER_WARP * EPILOGUE_WARPS
            )
            store_pipeline = pipeline.PipelineTmaStore.create(
                num_stages=self.epi_stage,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, THREADS_PER_WARP * EPILOGUE_WARPS),
            )

            acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.acc_stage)
            last_row = mC.shape[0] - 1
            sub_tiles_done = cutlass.Int32(0)
            t = first_tile
            while t < num_tiles:
                group, tile_m, tile_n, k_tiles = self._locate(t, ct_m, ct_n, mMasked, mIdx, k_tile_cnt, group_bounds)
                if cutlass.const_expr(self.masked):
                    tile_coord = (tile_m, tile_n, group)
                else:
                    tile_coord = (tile_m, tile_n)
                # This thread's row of D (the identity tensor's m coordinate of its first element);
                # rows past M read a valid row's scale and are clipped by the TMA store.
                row = cutlass.min(tTR_cC[(None, None, None, None, None, *tile_coord)][0][0], last_row)
                # In range: Blackwell clusters are one tile wide along N (the cta_pair_shape rule),
                # so no tile starts past N (the Hopper template clamps for its 1x2 clusters).
                n_block = tile_n * tn // SCALE_BLOCK
                sfb_group = cutlass.max(group, 0)
                promoted.fill(0.0)
                for k in range(k_tiles):
                    scale = self._block_scale(mSFA, mSFB, row, n_block, k, group, sfb_group)
                    accumulator_pipeline.consumer_wait(acc_state)
                    acc_k = tTR_tAcc[(None, None, None, None, None, acc_state.index)]
                    acc_k = cute.group_modes(acc_k, 3, cute.rank(acc_k))
                    for sub in cutlass.range_constexpr(sub_tiles):
                        cute.copy(tiled_t2r, acc_k[(None, None, None, sub)], chunk)
                        # Wait for this chunk before using it: one chunk in flight keeps the
                        # promoted row and the chunk in registers without spilling.
                        cute.arch.fence_view_async_tmem_load()
                        part = promoted[(None, None, None, sub)]
                        part.store(chunk.load() * scale + part.load())
                    # Every load from the stage has completed: the MMA may overwrite it.
                    with cute.arch.elect_one():
                        accumulator_pipeline.consumer_release(acc_state)
                    acc_state.advance()

                write_tile = cutlass.Int32(1)
                if cutlass.const_expr(self.contiguous):
                    # Padding rows (m_indices = -1) are written as zeros unless the caller opted
                    # out; with the opt-out, tiles of padding rows only are not written at all.
                    if zero_padding != 0:
                        if mIdx[row] < 0:
                            promoted.fill(0.0)
                    write_tile = cutlass.Int32(1) if (group >= 0) | (zero_padding != 0) else cutlass.Int32(0)

                gC_tile = gC_epi[(None, None, None, None, *tile_coord)]
                bSG_sC, bSG_gC = cpasync.tma_partition(
                    tma_atom_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), cute.group_modes(gC_tile, 0, 2)
                )
                bSG_gC = cute.group_modes(bSG_gC, 1, cute.rank(bSG_gC))
                for sub in cutlass.range_constexpr(sub_tiles):
                    out_chunk.store(promoted[(None, None, None, sub)].load().to(self.c_dtype))
                    buffer = (sub_tiles_done + sub) % self.epi_stage
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
                sub_tiles_done += sub_tiles
                t += tile_stride

            # Every accumulator stage has been consumed, so the MMAs are done: free TMEM.
            tmem.relinquish_alloc_permit()
            epilogue_barrier.arrive_and_wait()
            tmem.free(tmem_ptr)
            store_pipeline.producer_tail()


class BlackwellFp8GemmNtKernel(Fp8GemmNtEntry, BlackwellFp8GemmKernel):
    """`fp8_gemm_nt` on sm_100a (fp32 or UE8M0 scales)."""


class BlackwellMGroupedFp8GemmKernel(MGroupedContiguousEntry, BlackwellFp8GemmKernel):
    """`m_grouped_fp8_gemm_nt_contiguous` on sm_100a."""


class BlackwellMaskedFp8GemmKernel(MGroupedMaskedEntry, BlackwellFp8GemmKernel):
    """`m_grouped_fp8_gemm_nt_masked` on sm_100a."""


class BlackwellGemmTemplate(GemmContract):
    """The generator's view of the Blackwell GEMM template: the kernel class of the schedule's op
    (operands, fake arguments and grid rule are the same as on Hopper)."""

    def __init__(self, schedule: Schedule):
        super().__init__(schedule)
        if schedule.mma_applies_scales:
            self.kernel = (
                BlackwellNvfp4GemmNtKernel(schedule) if schedule.op == Op.NVFP4_GEMM_NT
                else BlackwellMxMGroupedMaskedKernel(schedule) if schedule.op.is_masked
                else BlackwellMxMGroupedContiguousKernel(schedule) if schedule.op.is_m_grouped
                else BlackwellMxKGroupedTnKernel(schedule) if schedule.op.is_k_grouped
                else BlackwellMxFp8WgradKernel(schedule) if schedule.op.scales_b_per_row
                else BlackwellMxFp8GemmNtKernel(schedule)
            )
        elif schedule.op.is_masked:
            self.kernel = BlackwellMaskedFp8GemmKernel(schedule)
        elif schedule.op.is_m_grouped:
            self.kernel = BlackwellMGroupedFp8GemmKernel(schedule)
        else:
            self.kernel = BlackwellFp8GemmNtKernel(schedule)


@cute.jit
def _ue8m0_value(word: cutlass.Int32, shift: cutlass.Int32) -> cutlass.Float32:
    """The scale 2^(e-127) of the exponent byte e at bit `shift` of a packed UE8M0 word; byte
    0xFF (the quantizers' NaN scale) decodes to NaN, as `unpack_ue8m0` does."""
    e = (word >> shift) & 0xFF
    is_nan = (e + 1) >> 8  # 1 for e = 0xFF only
    return ((e << 23) | (is_nan << 22)).bitcast(cutlass.Float32)


def _tmem_allocation(columns: int) -> int:
    """TMEM columns to allocate: a power of two of at least 32 (the tcgen05.alloc rule)."""
    out = 32
    while out < columns:
        out *= 2
    return out
