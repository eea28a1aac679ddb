"""CPU tier: CuTe DSL behaviours the templates rely on, pinned so that a DSL upgrade that changes
them fails here instead of hanging a GPU.

Loop-carried state: the DSL decides which Python objects a dynamic loop carries from the loop
body's source. A pipeline state advanced inside a `@cute.jit` helper is carried only when the
caller rebinds it (``state = self.helper(state)``); passed to the helper alone, its updates are
dropped at the next iteration (a persistent kernel then waits on a stale mbarrier phase forever).
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("cutlass", reason="the generator extra (nvidia-cutlass-dsl) is not installed")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
import cutlass.pipeline as pipeline  # noqa: E402
from cutlass.cute.runtime import make_fake_tensor  # noqa: E402
from cutlass.cutlass_dsl import CuTeDSL  # noqa: E402

pytestmark = pytest.mark.slow


def _compile_state_loop(rebind: bool, workdir) -> str:
    dsl = CuTeDSL._get_dsl()
    dsl.envar.arch = "sm_90a"
    dsl.envar.dump_dir = str(workdir)

    class StateLoop:
        @cute.jit
        def __call__(self, x: cute.Tensor, n: cutlass.Int32):
            self.kernel(x, n).launch(grid=[1, 1, 1], block=[32, 1, 1])

        @cute.jit
        def advance_three(self, state):
            for _ in range(3):
                state.advance()
            return state

        @cute.kernel
        def kernel(self, x: cute.Tensor, n: cutlass.Int32):
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 5)
            i = cutlass.Int32(0)
            while i < n:
                if cutlass.const_expr(rebind):
                    state = self.advance_three(state)
                else:
                    self.advance_three(state)
                i += 1
            x[0] = state.index
            x[1] = state.phase

    x = make_fake_tensor(cutlass.Int32, (cute.sym_int32(),), (1,), assumed_align=16)
    compiled = cute.compile(StateLoop(), x, cutlass.Int32(1), options="--keep-ptx")
    ptx = str(compiled.__ptx__)
    return ptx[ptx.index(".entry"):]


def test_state_advanced_in_a_helper_is_carried_only_when_rebound(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # --keep-ptx may also write into the current directory
    stores = re.findall(r"st\.global[^\n]*", _compile_state_loop(True, tmp_path))
    assert stores and not re.search(r"\{\s*0,\s*0\s*\}", stores[0]), stores
    dropped = re.findall(r"st\.global[^\n]*", _compile_state_loop(False, tmp_path))
    # Not rebound: the loop's effect on the state is lost (the stored index/phase are constants).
    assert dropped and re.search(r"\{\s*0,\s*0\s*\}", dropped[0]), dropped
