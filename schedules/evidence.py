"""What hardware has run each kernel of the shipped catalogue: "ran on H200", "ran on H100" or "compiled only".

Kept apart from the schedule vocabulary (`spec`), whose source every kernel's build fingerprint
reads: recording that kernels have run never invalidates a built kernel.
"""

from __future__ import annotations

from typing import Callable

from .spec import Activation, Arch, Epilogue, Layout, Op, OutputScale, Raster, Schedule

RAN = "ran on H200"
RAN_ON_H100 = "ran on H100"
COMPILED_ONLY = "compiled only"

# Per architecture: sm_90a's kernels run on an H200 (the GPU test tier and the benchmark);
# sm_100a's are compiled, SASS-checked and ABI-checked on the CPU, and no sm_100 GPU has run them.
ARCH_EVIDENCE: dict[Arch, str] = {Arch.SM90A: RAN, Arch.SM100A: COMPILED_ONLY}

# The BF16 tile widths whose adding kernels joined the catalogue with the MN-major split K.
_BF16_WIDTHS = frozenset({96, 144, 160, 176, 192, 208, 224})


def _sm90a_ran_on_h100_only(s: Schedule) -> bool:
    """The sm_90a kernels built on 2026-12-05 that have run on an H100 (the GPU tier and
    compute-sanitizer, NOTES N87, N88) but not on an H200: the SwiGLU kernels with UE8M0-rounded
    output scales, the FP8 GEMM's residual, the BF16 GEMM's adding kernels in the widths and its
    split K over MN-major operands, and the masked FP8 GEMM's 128x192 tiles; and every kernel
    whose epilogue computes SiLU, rebuilt on 2026-12-05 with the straight-line division
    (`cutegen.templates.fp32_silu`; the SwiGLU kernels, 64-row SwiGLU tiles among them, and the
    bias/activation kernels ending `_silu`: NOTES N89); and the kernels that split their last
    wave along K (epilogue `split_k_last_wave_tma_store`: BF16 dense, FP8 masked; NOTES N90); and
    the FP4 per-token quantizers (2026-12-06, NOTES N93); and the masked kernels that walk each
    group's tiles down their columns (FP8 and BF16, 2026-12-06, NOTES N95), and the BF16 GEMM's
    split-K kernels in 2x1 clusters sharing B (2026-12-07, NOTES N106), adding into D (2026-12-07,
    NOTES N107) and its 128x192 tiles over MN-major operands (2026-12-07, NOTES N107). (The BF16
    kernels whose MMA takes B's rows as its M side, first run on an H100, ran on an H200 too: NOTES
    N97.)"""
    if s.op == Op.PER_TOKEN_QUANT_FP4:
        return True
    if s.op.is_masked and s.raster == Raster.ALONG_M:
        return True
    if s.d_scale == OutputScale.UE8M0:
        return True
    if s.epilogue == Epilogue.SPLIT_K_LAST_WAVE_TMA_STORE:
        return True
    if s.activation in (Activation.SWIGLU, Activation.SILU):
        return True
    if s.op == Op.M_GROUPED_FP8_GEMM_NT_MASKED and s.tile_n == 192:
        return True
    if s.op == Op.FP8_GEMM_NT and s.epilogue == Epilogue.TMA_STORE_ADD:
        return True
    if s.op == Op.BF16_GEMM_NT:
        widths_adding = s.epilogue == Epilogue.TMA_STORE_ADD and s.tile_n in _BF16_WIDTHS
        mn_major_split = s.epilogue == Epilogue.SPLIT_K_TMA_STORE and s.layout != Layout.NT
        shared_b_split = s.epilogue == Epilogue.SPLIT_K_TMA_STORE and s.cluster_m == 2
        adding_split = s.epilogue == Epilogue.SPLIT_K_TMA_STORE_ADD
        mn_major_192 = s.layout != Layout.NT and s.tile_n == 192
        return widths_adding or mn_major_split or shared_b_split or adding_split or mn_major_192
    return False


# Per architecture: kernels whose evidence is not the architecture's, and what it is instead (the
# first that applies).
EXCEPTIONS: dict[Arch, tuple[tuple[Callable[[Schedule], bool], str], ...]] = {
    Arch.SM90A: ((_sm90a_ran_on_h100_only, RAN_ON_H100),),
}


def arch_evidence(arch: Arch) -> str:
    """What has been done with an architecture's kernels (`ARCH_EVIDENCE`)."""
    return ARCH_EVIDENCE[Arch(arch)]


def hardware_evidence(s: Schedule) -> str:
    """What has been done with this schedule's kernels: its architecture's evidence, or an
    exception's (`EXCEPTIONS`)."""
    for applies, evidence in EXCEPTIONS.get(s.arch, ()):
        if applies(s):
            return evidence
    return arch_evidence(s.arch)
