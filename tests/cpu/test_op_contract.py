"""CPU tier: each op's contract (`schedules.contract.op_contract`) is the one statement of its
interface: the manifest's operands and the traced fake arguments derive from it, and every
kernel class's entry point takes exactly its arguments, in its order."""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("cutlass")

from cutegen.schedules.contract import op_contract  # noqa: E402
from cutegen.schedules.loader import default_schedules  # noqa: E402
from cutegen.templates.gemm_contract import contract_entry_names  # noqa: E402
from cutegen.templates.registry import load_template  # noqa: E402

# One schedule per entry point (an op, or an op with a fused epilogue), scale format and split kind.
GEMMS = {(s.arch, s.entry, s.scale, s.epilogue.splits_k): s for s in default_schedules() if not s.op.is_quantize}
EVERY_OP = {(s.arch, s.entry, s.scale, s.epilogue.splits_k): s for s in default_schedules()}


@pytest.mark.parametrize("schedule", list(EVERY_OP.values()), ids=lambda s: f"{s.arch.value}-{s.entry}-{s.scale.value}")
def test_entry_points_take_the_contract_in_order(schedule):
    template = load_template(schedule)
    call = inspect.unwrap(type(template.kernel).__call__)
    names = [p for p in inspect.signature(call).parameters if p != "self"]
    assert names == contract_entry_names(template.contract)
    fakes = template.fake_arguments()
    assert len(fakes) == len(names)
    operands = [o["name"] for o in template.operands()]
    assert set(operands) <= set(names)
    if not schedule.op.is_quantize:
        assert operands[:2] == ["a", "b"]


def test_operands_state_what_the_kernel_takes_as_an_address():
    """A multi-dimensional operand the kernel takes as a bare pointer is `packed` in the manifest;
    every written operand is marked so."""
    for schedule in GEMMS.values():
        template = load_template(schedule)
        by_name = {o["name"]: o for o in template.operands()}
        assert by_name["d"].get("written") is True
        for arg in template.contract:
            if not arg.scalar:
                assert by_name[arg.name].get("packed", False) == (arg.pointer and len(arg.shape) > 1)


def test_the_runtime_passes_each_op_its_contract_operands():
    """The runtime's per-op operand lists (what a call binds, in entry order; the workspaces it
    supplies itself left out) are the contract's."""
    pytest.importorskip("torch")
    from cutegen.runtime import (
        bf16_grouped_ops, bf16_ops, epilogue_ops, fp8_ops, fused_ops, grouped_ops, k_grouped_ops, nvfp4_ops, quant_ops,
        split_k,
    )
    from cutegen.runtime.fused_reference import ACTIVATIONS

    supplied = {"split_counters", "split_partials", "workspace", "tile_counter"}

    def passed(schedule):
        return tuple(a.name for a in op_contract(schedule) if not a.scalar and a.name not in supplied)

    def operands(schedule):
        return sorted(a.name for a in op_contract(schedule) if not a.scalar)

    expected = {
        "fp8_gemm_nt": fp8_ops._CALL_OPERANDS,
        "fp8_wgrad_gemm_nt": fp8_ops._CALL_OPERANDS,
        "m_grouped_fp8_gemm_nt_contiguous": grouped_ops._CALL_OPERANDS,
        "m_grouped_fp8_gemm_nt_masked": grouped_ops._MASKED_OPERANDS,
        "k_grouped_fp8_gemm_nt_contiguous": k_grouped_ops._CALL_OPERANDS,
        "k_grouped_fp8_gemm_tn_contiguous": k_grouped_ops._TN_OPERANDS,
        "nvfp4_gemm_nt": nvfp4_ops._CALL_OPERANDS,
        "m_grouped_bf16_gemm_nt_contiguous": bf16_grouped_ops._CONTIGUOUS_OPERANDS,
        "m_grouped_bf16_gemm_nt_masked": bf16_grouped_ops._MASKED_OPERANDS,
        "k_grouped_bf16_gemm_tn_contiguous": bf16_grouped_ops._K_GROUPED_OPERANDS,
        "grouped_transposed_quant_fp8": quant_ops._GROUPED_OPERANDS,
        "per_token_quant_fp8": quant_ops._PER_TOKEN_OPERANDS,
        "per_token_quant_fp4": quant_ops._PER_TOKEN_OPERANDS,
        "per_block_quant_fp8": quant_ops._PER_BLOCK_OPERANDS,
        **fused_ops.OPERANDS,
        # The dense GEMMs with a fused bias and/or activation: the GEMM's operands, then the bias.
        **{epilogue_ops.entry(op, bias, act): (*epilogue_ops.OPERANDS[op], *(("bias",) if bias else ()))
           for op in epilogue_ops.GEMM for bias in (False, True) for act in ACTIVATIONS if bias or act != "none"},
    }
    seen = set()
    for (_, entry, _, splits), schedule in EVERY_OP.items():
        if entry in expected:
            assert passed(schedule) == expected[entry], entry
            seen.add(entry)
        # The dense GEMMs' runtime passes its call operands and, to a split-K kernel, the workspace.
        dense = {"fp8_gemm_nt": fp8_ops._CALL_OPERANDS, "bf16_gemm_nt": bf16_ops._OPERANDS}
        if entry in dense:
            workspace = split_k.WORKSPACE_OPERANDS if splits else ()
            assert operands(schedule) == sorted([*dense[entry], *workspace]), entry
    assert seen == set(expected)
