"""GPU tier: every test under tests/gpu is marked ``gpu`` and skipped, with the reason, unless
torch sees a CUDA device and a kernel catalogue exists ($CUTEGEN_BUILD_DIR, ./build, or the kernels
of an installed runtime wheel: `cutegen.runtime.catalogue.resolve_build_dir`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cutegen.runtime.manifest import adds_into_d

_HERE = Path(__file__).resolve().parent


def _unavailable_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    from cutegen.runtime.catalogue import CATALOGUE_FILE, resolve_build_dir

    build = resolve_build_dir()
    if not (build / CATALOGUE_FILE).is_file():
        return (f"no kernel catalogue at {build} (run `cutegen build`, set CUTEGEN_BUILD_DIR, or "
                "install the runtime wheel: `make wheel`, `pip install dist/cutegen-*.whl`)")
    return None


_REASON = _unavailable_reason()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE not in Path(str(item.fspath)).resolve().parents:
            continue
        item.add_marker(pytest.mark.gpu)
        if _REASON is not None:
            item.add_marker(pytest.mark.skip(reason=_REASON))


@pytest.fixture(scope="session")
def ops():
    from cutegen.runtime import ops as module

    return module


@pytest.fixture(scope="session")
def device_info():
    import torch

    from cutegen.runtime import driver

    return driver.device_info(torch.cuda.current_device())


@pytest.fixture(scope="session")
def gemm_kernels(ops, device_info):
    """Names of the catalogue's bf16_gemm_nt kernels storing a bf16 D from K-major operands that
    run on this GPU (at least one); the others are `runnable_kernels(..., d_dtype=, adds=, layout=)`."""
    cat = ops.catalogue()
    names = [
        m.name for m in cat.compatible(ops.OP_BF16_GEMM_NT, device_info.capability)
        if m.schedule.get("c_dtype") == "bf16" and not adds_into_d(m.schedule)
        and m.schedule.get("layout", "nt") == "nt"
    ]
    if not names:
        pytest.skip(f"no bf16_gemm_nt kernel in {cat.build_dir} runs on {device_info.arch}")
    return names
