"""Read a cubin's SASS with cuobjdump (from PyPI's nvidia-cuda-cuobjdump) and summarise what matters."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

# UTCOMMA: the FP4 x FP4 block-scaled MMA (NVFP4, kind::mxf4nvf4).
MMA_OPCODES = ("HGMMA", "QGMMA", "IGMMA", "UTCHMMA", "UTCQMMA", "UTCOMMA", "UTCMMA", "HMMA")
LOCAL_MEMORY_OPCODES = ("LDL", "STL")


class SassToolError(RuntimeError):
    pass


def _tool_dirs() -> list[Path]:
    dirs = []
    try:
        import nvidia  # the namespace package the NVIDIA wheels install into

        for base in nvidia.__path__:
            for sub in ("cu13/bin", "cu12/bin", "cuda_cuobjdump/bin", "cuda_nvdisasm/bin"):
                p = Path(base) / sub
                if p.is_dir():
                    dirs.append(p)
    except ImportError:
        pass
    return dirs


def find_cuobjdump() -> Path | None:
    for d in _tool_dirs():
        if (d / "cuobjdump").exists():
            return d / "cuobjdump"
    found = shutil.which("cuobjdump")
    return Path(found) if found else None


@dataclasses.dataclass(frozen=True)
class SassSummary:
    mma: dict[str, int]
    mma_shapes: dict[str, int]
    local_loads: int
    local_stores: int
    registers: int | None
    stack_bytes: int | None
    static_smem_bytes: int | None
    instructions: int
    # WGMMA waits (WARPGROUP.DEPBAR.LE gsb0, N) by N, the groups they leave in flight: a kernel
    # whose waits are all 0 runs its WGMMAs one batch at a time (ptxas serialises the pipeline
    # when it cannot follow it, and says so only in a warning the DSL does not show).
    wgmma_waits: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def local_memory_ops(self) -> int:
        return self.local_loads + self.local_stores

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def render(self) -> str:
        lines = ["SASS summary", f"instructions        {self.instructions}"]
        for op, n in sorted(self.mma.items()):
            lines.append(f"{op:<20}{n}")
        for shape, n in sorted(self.mma_shapes.items()):
            lines.append(f"  {shape:<30} {n}")
        lines += [
            f"LDL (local loads)   {self.local_loads}",
            f"STL (local stores)  {self.local_stores}",
            f"registers           {self.registers}",
            f"stack bytes         {self.stack_bytes}",
            f"static smem bytes   {self.static_smem_bytes}",
        ]
        for pending, n in sorted(self.wgmma_waits.items()):
            lines.append(f"WGMMA wait <= {pending:<6}{n}")
        return "\n".join(lines) + "\n"


def _run(args: list[str], tool: Path) -> str:
    env = dict(os.environ)
    env["PATH"] = str(tool.parent) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run([str(tool), *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SassToolError(f"{tool.name} {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def disassemble(cubin: bytes) -> tuple[str, str]:
    """Return (sass text, resource usage text) for a cubin."""
    tool = find_cuobjdump()
    if tool is None:
        raise SassToolError(
            "cuobjdump not found: install the generator extra (pip install 'cutegen[gen]'), "
            "which brings nvidia-cuda-cuobjdump"
        )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        sass = _run(["-sass", str(path)], tool)
        res = _run(["-res-usage", str(path)], tool)
    return sass, res


def summarise(sass: str, res_usage: str) -> SassSummary:
    mma: dict[str, int] = {}
    shapes: dict[str, int] = {}
    loads = stores = count = 0
    waits: dict[str, int] = {}
    for line in sass.splitlines():
        w = re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x([0-9a-f]+)", line)
        if w:
            pending = str(int(w.group(1), 16))
            waits[pending] = waits.get(pending, 0) + 1
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)", line)
        if not m:
            continue
        count += 1
        full = m.group(1)
        opcode = full.split(".")[0]
        if opcode in MMA_OPCODES:
            mma[opcode] = mma.get(opcode, 0) + 1
            shapes[full] = shapes.get(full, 0) + 1
        if opcode == "LDL":
            loads += 1
        elif opcode == "STL":
            stores += 1

    def field(name: str) -> int | None:
        m = re.search(rf"\b{name}:(\d+)", res_usage)
        return int(m.group(1)) if m else None

    return SassSummary(
        mma=mma,
        mma_shapes=shapes,
        local_loads=loads,
        local_stores=stores,
        registers=field("REG"),
        stack_bytes=field("STACK"),
        static_smem_bytes=field("SHARED"),
        instructions=count,
        wgmma_waits=waits,
    )
