"""CPU tier: the tuning command's pieces that need no GPU (shape parsing, table merging, CLI errors)."""

from __future__ import annotations

import json

import pytest

from cutegen.gen.cli import main
from cutegen.bench.tune import merge_table, parse_shapes


def test_parse_shapes():
    assert parse_shapes("4096,7168,16384; 64,2112,7168;") == [(4096, 7168, 16384), (64, 2112, 7168)]
    for bad in ("4096,7168", "a,b,c", "0,1,1", ""):
        with pytest.raises(ValueError):
            parse_shapes(bad)


def test_merge_table_keeps_other_entries(tmp_path):
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"bf16_gemm_nt": {"1,2,3": "x"}, "fp8_gemm_nt": {"4,5,6": "y"}}))
    table = merge_table(path, "fp8_gemm_nt", {"7,8,9": "z"})
    assert table == {"bf16_gemm_nt": {"1,2,3": "x"}, "fp8_gemm_nt": {"4,5,6": "y", "7,8,9": "z"}}
    assert json.loads(path.read_text()) == table
    from cutegen.runtime.heuristics import load_tuning_table

    assert load_tuning_table(path=path)["fp8_gemm_nt"]["7,8,9"] == "z"


def test_cli_errors(capsys):
    assert main(["tune", "--op", "fp8_gemm_nt", "--shapes", "1,2"]) == 2
    assert "--shapes" in capsys.readouterr().err
    assert main(["tune", "--op", "fp8_gemm_nt", "--shapes", "64,2112,7168"]) == 2  # no GPU here
    assert "CUDA" in capsys.readouterr().err


def test_cli_groups_must_be_positive(capsys):
    assert main(["tune", "--op", "k_grouped_fp8_gemm_nt_contiguous", "--shapes", "7168,4096,4096", "--groups", "0"]) == 2
    assert "--groups" in capsys.readouterr().err
