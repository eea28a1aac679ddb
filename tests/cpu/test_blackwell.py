"""CPU tier: the Blackwell (sm_100a) catalogue, verified without Blackwell hardware. Every default
sm_100a schedule is valid and compiles; its SASS has tcgen05 FP8 MMAs (UTCQMMA) and tensor-memory
loads, and no local memory; the runtime keeps sm_100a kernels away from other GPUs with a message that says why, and chooses among
them on a Blackwell GPU. (The Blackwell validity rules are exercised in test_schedules.py, the
launch ABI of these kernels in test_abi_selfcheck.py.)"""

from __future__ import annotations

import dataclasses
import json

import pytest

from cutegen.runtime import heuristics
from cutegen.runtime.catalogue import ArchMismatchError, check_arch, load_catalogue
from cutegen.schedules.loader import default_schedules
from cutegen.schedules.naming import procedural_name
from cutegen.schedules.predicates import violations
from cutegen.schedules.evidence import arch_evidence
from cutegen.schedules.spec import Arch, DType, Op, ScaleFormat

SM100_OPS = {Op.FP8_GEMM_NT, Op.M_GROUPED_FP8_GEMM_NT_CONTIGUOUS, Op.M_GROUPED_FP8_GEMM_NT_MASKED, Op.FP8_WGRAD_GEMM_NT,
            Op.K_GROUPED_FP8_GEMM_TN_CONTIGUOUS, Op.NVFP4_GEMM_NT}


def sm100_schedules():
    """The sm_100a GEMM schedules (the quantizers are checked in test_quant_build.py)."""
    return [s for s in default_schedules() if s.arch == Arch.SM100A and not s.op.is_quantize]


def test_default_catalogue_has_every_sm100_op_on_one_cta_and_a_pair():
    schedules = sm100_schedules()
    assert {s.op for s in schedules} == SM100_OPS
    for op in (Op.FP8_GEMM_NT, Op.M_GROUPED_FP8_GEMM_NT_MASKED):
        assert {s.mma_ctas for s in schedules if s.op == op} == {1, 2}
        # ... and so does the block-scaled MMA, for the weight gradient as well.
        assert {s.mma_ctas for s in schedules if s.op == op and s.mma_applies_scales} == {1, 2}
    assert {s.mma_ctas for s in schedules if s.op == Op.FP8_WGRAD_GEMM_NT} == {1, 2}
    for s in schedules:
        assert violations(s) == [], procedural_name(s)
        assert arch_evidence(s.arch) == "compiled only"


def test_tensor_memory_budget_counts_accumulator_stages():
    promoting = [s for s in sm100_schedules() if not s.mma_applies_scales]
    s = next(s for s in promoting if s.tile_n == 128)
    assert s.tmem_accumulator_stages == 4 and s.tmem_columns == 512 and s.tmem_scale_columns == 0
    small = next(s for s in promoting if s.tile_n == 64)
    assert small.tmem_columns == 256


def test_block_scaled_mma_budgets_its_scale_columns_and_atoms():
    """Scales applied by the MMA: 4 tensor-memory columns per blocked atom of a stage (SFA's one,
    SFB's one per 128 columns) beside at most two accumulator stages, the same in each CTA of a
    pair (each holds its own rows' SFA and every SFB atom of the tile); the atoms' 512 bytes each
    in every pipeline stage, beside A and the CTA's share of B."""
    all_mx = [s for s in sm100_schedules() if s.scale == ScaleFormat.MX]
    for ctas in (1, 2):
        mx = {s.tile_n: s for s in all_mx if s.mma_ctas == ctas}
        assert set(mx) == {128, 256}
        assert (mx[128].tmem_accumulator_stages, mx[128].tmem_scale_columns, mx[128].tmem_columns) == (2, 8, 264)
        assert (mx[256].tmem_accumulator_stages, mx[256].tmem_scale_columns, mx[256].tmem_columns) == (1, 12, 268)
    for s in all_mx:
        assert s.stage_bytes == 128 * 128 + s.tile_n // s.mma_ctas * 128 + 512 * sum(s.mx_scale_atoms)
        assert s.facts()["mma_applies_scales"] and s.accumulator_registers == 32


def test_nvfp4_budgets_four_scale_atoms_per_row_block_and_packed_operands():
    """NVFP4 (scale nv): K tiles of 256 FP4 elements, 128 packed bytes a row in shared memory; four
    atoms of E4M3 scales (one per 16 elements) per 128 rows and K tile, 4 tensor-memory columns
    each."""
    nv = [s for s in sm100_schedules() if s.scale == ScaleFormat.NV]
    assert {(s.tile_n, s.mma_ctas) for s in nv} == {(128, 1), (256, 1), (128, 2), (256, 2)}
    for s in nv:
        assert s.op == Op.NVFP4_GEMM_NT and s.a_dtype == s.b_dtype == DType.E2M1 and s.tile_k == 256
        assert s.fp4_packed_in_smem and s.mx_atoms_per_k_tile == 4
        assert s.mx_scale_atoms == (4, 4 * s.tile_n // 128)
        assert s.stage_bytes == (128 + s.tile_n // s.mma_ctas) * 256 // 2 + 512 * sum(s.mx_scale_atoms)
    by_n = {s.tile_n: s for s in nv if s.mma_ctas == 1}
    assert (by_n[128].tmem_accumulator_stages, by_n[128].tmem_scale_columns, by_n[128].tmem_columns) == (2, 32, 288)
    assert (by_n[256].tmem_accumulator_stages, by_n[256].tmem_scale_columns, by_n[256].tmem_columns) == (1, 48, 304)


# ---- compiled kernels ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("cutlass", reason="the generator extra (nvidia-cutlass-dsl) is not installed")
    from cutegen.gen.build import build_schedules

    root = tmp_path_factory.mktemp("sm100")
    mp = pytest.MonkeyPatch()
    mp.setenv("CUTEGEN_CACHE_DIR", str(root / "cache"))
    quantizers = [s for s in default_schedules() if s.arch == Arch.SM100A and s.op.is_quantize]
    report = build_schedules(sm100_schedules() + quantizers, root / "out", jobs=2, progress=False)
    mp.undo()
    assert report.ok, report.summary()
    return root / "out"


@pytest.mark.slow
def test_every_sm100_kernel_has_tcgen05_mma_and_no_local_memory(built):
    from cutegen.gen.sass import disassemble
    from cutegen.gen.verify import verify_kernel

    for s in sm100_schedules():
        name = procedural_name(s)
        summary = json.loads((built / name / "sass_summary.json").read_text())
        # FP8 (or FP8 x FP4) MMAs, or NVFP4's FP4 x FP4 ones.
        mma = "UTCOMMA" if s.op == Op.NVFP4_GEMM_NT else "UTCQMMA"
        assert summary["mma"].get(mma, 0) > 0, (name, summary)
        assert summary["local_loads"] == 0 and summary["local_stores"] == 0, (name, summary)
        assert summary["stack_bytes"] == 0, name
        sass, _ = disassemble((built / name / "kernel.cubin").read_bytes())
        assert "LDTM" in sass, name  # accumulators read from tensor memory
        result = verify_kernel(built / name)
        assert result.ok, (name, result.failures())


@pytest.mark.slow
def test_block_scaled_kernels_apply_their_scales_in_the_mma(built):
    """The MX kernels' PTX has the block-scaled MMA (kind::mxf8f6f4.block_scale, 32-element scale
    vectors) and the shared → tensor memory copy of the scales, both over a CTA pair where the
    kernel runs one (whose scale relay arrives on the leader's barrier at cluster scope); their SASS
    has UTCQMMA (2-CTA in a pair) with the two scale operands in tensor memory, UTCCP of 4x32 lanes
    x 128 bits, bulk copies of the atoms, and no local memory."""
    import re

    from cutegen.gen.sass import disassemble

    mx = [s for s in sm100_schedules() if s.mma_applies_scales]
    assert mx
    for s in mx:
        name = procedural_name(s)
        ptx = (built / name / "kernel.ptx").read_text()
        group = s.mma_ctas
        kind = "mxf4nvf4.block_scale.block16" if s.scale == ScaleFormat.NV else "mxf8f6f4.block_scale.block32"
        assert f"tcgen05.mma.cta_group::{group}.kind::{kind}" in ptx, name
        assert f"tcgen05.cp.cta_group::{group}.32x128b.warpx4" in ptx, name
        assert ("mbarrier.arrive.release.cluster.shared::cluster.b64" in ptx) == (group == 2), name
        sass, _ = disassemble((built / name / "kernel.cubin").read_bytes())
        opcode = "UTCOMMA" if s.scale == ScaleFormat.NV else "UTCQMMA"
        mmas = [line for line in sass.splitlines() if opcode in line]
        assert mmas and all(len(re.findall(r"tmem\[", line)) == 3 for line in mmas), name
        assert all((f"{opcode}.2CTA" in line) == (group == 2) for line in mmas), name
        pair = ".2CTA" if group == 2 else ""
        assert f"UTCCP.T.S{pair}.4x32dp128bit" in sass and "UBLKCP.S.G" in sass, name
        assert not re.search(r"\bLDL|\bSTL", sass), name
        # The weight gradients add their tiles into D (TMA reduce-add; the k-grouped one's D has a
        # group mode); the others store them.
        assert ("UTMAREDG.2D.ADD" in sass) == (s.op.scales_b_per_row and not s.op.is_k_grouped), name
        assert ("UTMAREDG.3D.ADD" in sass) == s.op.is_k_grouped, name


# The MMA instruction descriptor's B format field (bits 10-12 of kind::mxf8f6f4): E4M3 0, E2M1 5.
IDESC_B_FORMAT_SHIFT, IDESC_E2M1 = 10, 5


@pytest.mark.slow
def test_fp4_kernels_are_their_fp8_twins_with_b_in_e2m1(built):
    """Each FP8 x FP4 kernel's PTX is its FP8 twin's but for two kinds of constant: the MMA
    instruction descriptor names B E2M1 (format 5 where E4M3 is 0), and each stage's transaction
    counts B at half a byte per element (tile_n x tile_k / 2 bytes fewer)."""
    import re

    fp4 = [s for s in sm100_schedules() if s.b_dtype == DType.E2M1 and s.a_dtype == DType.E4M3]
    assert fp4 and all(s.mma_applies_scales for s in fp4)
    for s in fp4:
        twin = dataclasses.replace(s, b_dtype=DType.E4M3)
        ours = (built / procedural_name(s) / "kernel.ptx").read_text().splitlines()
        theirs = (built / procedural_name(twin) / "kernel.ptx").read_text().splitlines()
        assert len(ours) == len(theirs), procedural_name(s)
        kinds = set()
        for mine, other in zip(ours, theirs):
            if mine == other:
                continue
            a, b = re.findall(r"\b\d+\b", mine), re.findall(r"\b\d+\b", other)
            assert re.sub(r"\b\d+\b", "#", mine) == re.sub(r"\b\d+\b", "#", other), (mine, other)
            deltas = {int(x) - int(y) for x, y in zip(a, b) if x != y}
            assert deltas in ({IDESC_E2M1 << IDESC_B_FORMAT_SHIFT}, {-s.tile_n * s.tile_k // 2}), (mine, other)
            kinds |= deltas
        assert kinds == {IDESC_E2M1 << IDESC_B_FORMAT_SHIFT, -s.tile_n * s.tile_k // 2}, procedural_name(s)


@pytest.mark.slow
def test_manifests_carry_a_blackwell_launch(built):
    cat = load_catalogue(built)
    for m in cat.manifests():
        s = m.schedule
        assert m.arch == "sm_100a"
        if "_quant_" in m.op:  # the quantizers: checked in test_quant_build.py
            continue
        assert m.block == (256, 1, 1)
        assert m.cluster == (s["cluster_m"], s["cluster_n"], 1)
        assert 0 < m.smem_bytes <= 232448
        kinds = {p.name: p.binding["kind"] for p in m.params}
        assert kinds["tma_a"] == kinds["tma_b"] == kinds["tma_d"] == "tma"
        # The promoting kernels read SFA as a tensor; the block-scaled MMA's blocked atoms by address.
        assert kinds["sfa"] == ("pointer" if m.fact("mma_applies_scales") else "tensor") and kinds["sfb"] == "pointer"
        # A CTA pair loads half of B per CTA; an MN-major B (the k-grouped weight gradient, tn)
        # is loaded along N in boxes of one 128-byte swizzle atom.
        tma_b = next(p for p in m.params if p.name == "tma_b").binding
        if s.get("layout", "nt") == "tn":
            assert tma_b["modes"] == [0, 1] and tma_b["box"] == [min(s["tile_n"], 128), s["tile_k"]]
        else:
            assert tma_b["box"][:2] == [s["tile_k"], s["tile_n"] // s["cluster_m"]]


@pytest.mark.slow
def test_runtime_refuses_sm100_kernels_on_hopper_and_chooses_them_on_blackwell(built):
    cat = load_catalogue(built)
    for op in SM100_OPS:
        assert cat.compatible(op.value, (9, 0)) == []
        candidates = cat.compatible(op.value, (10, 0))
        assert candidates
        for m, n, k in ((1, 2112, 7168), (128, 7168, 2048), (4096, 7168, 16384)):
            chosen = heuristics.choose(op.value, candidates, m, n, k, 148)
            assert chosen.arch == "sm_100a"
    manifest = cat.manifests()[0]
    with pytest.raises(ArchMismatchError) as info:
        check_arch(manifest, (9, 0), "NVIDIA H200")
    text = str(info.value)
    assert "sm_100a" in text and "NVIDIA H200" in text and "cutegen build --arch sm_90a" in text


B200 = {"name": "NVIDIA B200", "capability": (10, 0), "sm_count": 148, "smem_optin": 232448}
H200 = {"name": "NVIDIA H200", "capability": (9, 0), "sm_count": 132, "smem_optin": 232448}


@pytest.fixture
def on_gpu(built, monkeypatch):
    """Point the runtime at the sm_100a build and pretend GPU 0 is the given one (no driver)."""
    from cutegen.runtime import driver, ops

    def use(facts):
        info = driver.DeviceInfo(ordinal=0, **facts)
        monkeypatch.setattr(driver, "device_info", lambda ordinal=0: info)
        ops.set_build_dir(built)
        return ops

    yield use
    from cutegen.runtime import ops

    ops.set_build_dir(None)


@pytest.mark.slow
def test_fp8_gemm_picks_the_kernel_of_the_scale_format(on_gpu):
    from cutegen.runtime.errors import ArtifactError

    ops = on_gpu(B200)
    for m, n, k in ((1, 2112, 7168), (4096, 7168, 16384)):
        ue8m0 = ops.catalogue().manifest(ops.choose_kernel("fp8_gemm_nt", m, n, k, scale="ue8m0"))
        assert ue8m0.schedule["scale"] == "ue8m0" and ue8m0.arch == "sm_100a"
        fp32 = ops.catalogue().manifest(ops.choose_kernel("fp8_gemm_nt", m, n, k, scale="f32"))
        assert fp32.schedule["scale"] == "f32"
    assert all("sfue8m0" in n for n in ops.runnable_kernels("fp8_gemm_nt", scale="ue8m0"))
    ops = on_gpu(H200)
    assert ops.runnable_kernels("fp8_gemm_nt") == []
    with pytest.raises(ArtifactError, match="runs on sm_90 \\(NVIDIA H200\\).*built for: sm_100a"):
        ops.choose_kernel("fp8_gemm_nt", 128, 128, 128, scale="ue8m0")


@pytest.mark.slow
def test_ue8m0_scales_go_to_the_block_scaled_mma_on_blackwell(on_gpu):
    """On a Blackwell GPU, `fp8_gemm_nt` with UE8M0 scales runs the kernels whose MMA applies them
    (the runtime makes their blocked operands per call); a promoting kernel forced by name still
    runs; on Hopper UE8M0 scales keep their refusal."""
    torch = pytest.importorskip("torch")
    from cutegen.runtime import fp8_ops

    ue8m0 = torch.zeros(4, 1, dtype=torch.int32)
    ops = on_gpu(B200)
    assert fp8_ops._kernel_scale(ue8m0, 0, "") == "mx"
    assert fp8_ops._kernel_scale(torch.zeros(4, 1), 0, "") == "f32"
    promoting = next(n for n in ops.runnable_kernels("fp8_gemm_nt", scale="ue8m0"))
    assert fp8_ops._kernel_scale(ue8m0, 0, promoting) == "ue8m0"
    mx = ops.runnable_kernels("fp8_gemm_nt", scale="mx")
    assert mx and all("_sfmx_" in n for n in mx)
    for m, n, k in ((1, 2112, 7168), (4096, 7168, 16384)):
        chosen = ops.catalogue().manifest(ops.choose_kernel("fp8_gemm_nt", m, n, k, scale="mx"))
        assert chosen.fact("mma_applies_scales")
    on_gpu(H200)
    assert fp8_ops._kernel_scale(ue8m0, 0, "") == "ue8m0"


@pytest.mark.slow
def test_per_row_sfb_runs_only_on_the_block_scaled_mma(on_gpu):
    """DeepGEMM's SM100 ``sfb`` (a scale per row of B) goes to the block-scaled kernels on Blackwell;
    a promoting kernel forced by name, or a GPU without such kernels, refuses it naming 'sfb'."""
    torch = pytest.importorskip("torch")
    from cutegen.runtime import fp8_ops
    from cutegen.runtime.errors import InputError

    ue8m0 = torch.zeros(4, 1, dtype=torch.int32)
    ops = on_gpu(B200)
    assert fp8_ops._call_scale(ue8m0, True, 0, "") == "mx"
    promoting = next(n for n in ops.runnable_kernels("fp8_gemm_nt", scale="ue8m0"))
    assert fp8_ops._call_scale(ue8m0, False, 0, promoting) == "ue8m0"
    with pytest.raises(InputError, match=f"'sfb' is per row.*kernel {promoting} does not"):
        fp8_ops._call_scale(ue8m0, True, 0, promoting)
    on_gpu(H200)
    with pytest.raises(InputError, match="'sfb' is per row.*this GPU's catalogue has none"):
        fp8_ops._call_scale(ue8m0, True, 0, "")


@pytest.mark.slow
def test_fp4_weights_run_only_on_the_fp4_block_scaled_kernels(on_gpu):
    """FP4 ``b`` chooses among the block-scaled kernels with e2m1 B on Blackwell, FP8 ``b`` among
    those with e4m3 B; a forced kernel of the other B is refused, and so is FP4 on Hopper."""
    torch = pytest.importorskip("torch")
    from cutegen.runtime import fp8_ops
    from cutegen.runtime.errors import InputError

    ue8m0 = torch.zeros(4, 1, dtype=torch.int32)
    assert fp8_ops.b_dtype_of(torch.zeros(8, 64, dtype=torch.uint8)) == "e2m1"
    assert fp8_ops.b_dtype_of(torch.zeros(8, 128, dtype=torch.float8_e4m3fn)) == "e4m3"
    ops = on_gpu(B200)
    assert fp8_ops._call_scale(ue8m0, True, 0, "", "e2m1") == "mx"
    fp4 = ops.runnable_kernels("fp8_gemm_nt", scale="mx", b_dtype="e2m1")
    fp8 = ops.runnable_kernels("fp8_gemm_nt", scale="mx", b_dtype="e4m3")
    assert fp4 and all("_e4m3_e2m1_" in n for n in fp4) and fp8 and all("_e4m3_e4m3_" in n for n in fp8)
    for m, n, k in ((1, 2112, 7168), (4096, 7168, 16384)):
        assert ops.choose_kernel("fp8_gemm_nt", m, n, k, scale="mx", b_dtype="e2m1") in fp4
        assert ops.choose_kernel("fp8_gemm_nt", m, n, k, scale="mx", b_dtype="e4m3") in fp8
    with pytest.raises(InputError, match="whose B is e4m3, but the B passed is e2m1"):
        ops.forced_manifest("fp8_gemm_nt", fp8[0], "mx", "e2m1")
    promoting = ops.runnable_kernels("fp8_gemm_nt", scale="ue8m0")[0]
    with pytest.raises(InputError, match=f"'b' holds FP4.*kernel {promoting} does not"):
        fp8_ops._call_scale(ue8m0, True, 0, promoting, "e2m1")
    on_gpu(H200)
    with pytest.raises(InputError, match="'b' holds FP4.*this GPU's catalogue has none"):
        fp8_ops._call_scale(ue8m0, True, 0, "", "e2m1")


@pytest.mark.slow
def test_grouped_packed_scales_run_on_the_block_scaled_kernels(on_gpu):
    """The grouped GEMMs with packed UE8M0 scales (FP8 or FP4 experts) choose among the
    block-scaled kernels of their op and B type on Blackwell; fp32 scales keep the promoting
    ones; on Hopper packed scales and FP4 experts are refused naming the argument."""
    pytest.importorskip("torch")
    from cutegen.runtime import grouped_ops
    from cutegen.runtime.errors import InputError

    ops = on_gpu(B200)
    for op in ("m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked"):
        fail = grouped_ops._fail if op.endswith("contiguous") else grouped_ops._fail_masked
        assert grouped_ops._scale_for_call(op, fail, True, "e4m3", 0, "") == "mx"
        assert grouped_ops._scale_for_call(op, fail, True, "e2m1", 0, "") == "mx"
        assert grouped_ops._scale_for_call(op, fail, False, "e4m3", 0, "") == "f32"
        for b_dtype in ("e4m3", "e2m1"):
            mx = ops.runnable_kernels(op, scale="mx", b_dtype=b_dtype)
            assert mx and all(f"_e4m3_{b_dtype}_" in n and "_sfmx_" in n for n in mx)
            chosen = ops.catalogue().manifest(ops.choose_kernel(op, 4096, 7168, 2048, scale="mx", b_dtype=b_dtype))
            assert chosen.fact("mma_applies_scales") and chosen.op == op
        assert all("_sff32_" in n for n in ops.runnable_kernels(op, scale="f32"))
    on_gpu(H200)
    with pytest.raises(InputError, match="'sfa' holds packed UE8M0.*this GPU's catalogue has none"):
        grouped_ops._scale_for_call("m_grouped_fp8_gemm_nt_contiguous", grouped_ops._fail, True, "e4m3", 0, "")
    with pytest.raises(InputError, match="m_grouped_fp8_gemm_nt_masked: argument 'b' holds FP4"):
        grouped_ops._scale_for_call("m_grouped_fp8_gemm_nt_masked", grouped_ops._fail_masked, True, "e2m1", 0, "")


@pytest.mark.slow
def test_nvfp4_kernels_are_chosen_on_blackwell_only(on_gpu):
    """`nvfp4_gemm_nt` chooses among its sm_100a kernels (scale nv) on a Blackwell GPU, one CTA or
    a pair; a Hopper GPU has none, so the op refuses the call (tests/gpu/test_block_scaled.py)."""
    ops = on_gpu(B200)
    names = ops.runnable_kernels("nvfp4_gemm_nt", scale="nv")
    assert len(names) == 4 and all("_nvfp4gemm_e2m1_e2m1_bf16_f32_sfnv_" in n for n in names)
    for m, n, k in ((1, 2112, 7168), (128, 7168, 2048), (4096, 7168, 16384)):
        chosen = ops.catalogue().manifest(ops.choose_kernel("nvfp4_gemm_nt", m, n, k, scale="nv"))
        assert chosen.name in names and chosen.fact("mma_applies_scales")
    on_gpu(H200)
    assert ops.runnable_kernels("nvfp4_gemm_nt") == []


@pytest.mark.slow
def test_weight_gradient_packed_scales_run_on_the_block_scaled_kernels(on_gpu):
    """The weight gradient with packed UE8M0 scales chooses among the block-scaled kernels on
    Blackwell and is refused naming 'sfa' on Hopper; fp32 scales ask for fp32 kernels."""
    pytest.importorskip("torch")
    from cutegen.runtime import fp8_ops
    from cutegen.runtime.errors import InputError

    ops = on_gpu(B200)
    assert fp8_ops._wgrad_scale(True, 0, "") == "mx" and fp8_ops._wgrad_scale(False, 0, "") == "f32"
    mx = ops.runnable_kernels("fp8_wgrad_gemm_nt", scale="mx")
    assert mx and all("_fp8wgrad_e4m3_e4m3_f32_f32_sfmx_" in n for n in mx)
    chosen = ops.catalogue().manifest(ops.choose_kernel("fp8_wgrad_gemm_nt", 7168, 2048, 4096, scale="mx"))
    assert chosen.fact("mma_applies_scales") and chosen.arch == "sm_100a"
    on_gpu(H200)
    with pytest.raises(InputError, match="'sfa' holds packed UE8M0.*this GPU's catalogue has none"):
        fp8_ops._wgrad_scale(True, 0, "")


@pytest.mark.slow
def test_quantizers_for_blackwell_are_chosen_there(on_gpu):
    """A Blackwell GPU quantizes with the sm_100a builds of the quantize templates (per-token with
    packed UE8M0 scales among them: the block-scaled kernels' activations), Hopper with its own."""
    from cutegen.runtime import quant_ops

    on_gpu(B200)
    for op, dtype, scale in (("per_token_quant_fp8", "bf16", "ue8m0"), ("per_token_quant_fp8", "f32", "fp32"),
                             ("per_token_quant_fp4", "bf16", "ue8m0"), ("per_block_quant_fp8", "bf16", "fp32")):
        names = quant_ops.quant_kernels(op, dtype, scale, 0)
        assert names and all(n.startswith("cutegen_sm100a_") for n in names), (op, names)
    from cutegen.runtime.errors import ArtifactError

    on_gpu(H200)  # this build holds sm_100a kernels only
    with pytest.raises(ArtifactError, match="runs on sm_90"):
        quant_ops.quant_kernels("per_token_quant_fp8", "bf16", "ue8m0", 0)
