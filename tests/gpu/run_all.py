"""Run the whole GPU tier and the benchmark in one go, each part in its own process under a time
limit, so that a hung kernel costs one part and not the session; print a summary table last.

    python3 tests/gpu/run_all.py [--out DIR] [--only NAME ...] [--test-timeout S] [--bench-timeout S]
                                 [--no-bench] [--bench-op OP ...] [--no-memcheck]

Logs go to DIR (default ./gpu-logs): one per test file, bench.md and bench.json. The tests of
out-of-range device metadata (`MEMCHECKED`) run a second time under ``compute-sanitizer --tool
memcheck`` with torch's caching allocator off (every tensor its own allocation, so that a read or
write past one is seen), when compute-sanitizer is on the PATH.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MEMCHECKED = ("test_device_metadata.py",)


def run(cmd: list[str], log: Path, timeout: int, env: dict[str, str] | None = None) -> tuple[str, float, str]:
    t0 = time.time()
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    with open(log, "w") as f:
        try:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env=env)
            status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            status = f"TIMEOUT after {timeout}s (hang?)"
    tail = log.read_text().strip().splitlines()[-1:] or [""]
    return status, time.time() - t0, tail[0][:100]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gpu-logs")
    p.add_argument("--test-timeout", type=int, default=240)
    p.add_argument("--bench-timeout", type=int, default=300)
    p.add_argument("--no-bench", action="store_true")
    p.add_argument("--only", action="append", default=[], help="only test files whose name contains this (repeatable)")
    p.add_argument("--bench-op", action="append", default=[], help="only this benchmark op (repeatable)")
    p.add_argument("--no-memcheck", action="store_true", help="skip the compute-sanitizer runs")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for test in sorted(HERE.glob("test_*.py")):
        if args.only and not any(o in test.name for o in args.only):
            continue
        log = out / f"{test.stem}.log"
        cmd = [sys.executable, "-m", "pytest", str(test), "-q", "-ra", "-p", "no:cacheprovider"]
        rows.append((test.name, *run(cmd, log, args.test_timeout)))
        sanitizer = shutil.which("compute-sanitizer")
        if test.name in MEMCHECKED and sanitizer and not args.no_memcheck:
            memcheck = [sanitizer, "--tool", "memcheck", "--report-api-errors", "no", "--error-exitcode", "1", *cmd]
            rows.append((f"memcheck {test.name}", *run(
                memcheck, out / f"{test.stem}.memcheck.log", args.test_timeout, {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
            )))
    if not args.no_bench:
        cmd = [sys.executable, "-m", "cutegen.gen.cli", "bench", "--json-out", str(out / "bench.json")]
        for op in args.bench_op:
            cmd += ["--op", op]
        rows.append(("cutegen bench", *run(cmd, out / "bench.md", args.bench_timeout)))
    width = max(len(r[0]) for r in rows)
    print(f"{'part':<{width}}  {'status':<24} {'seconds':>7}  last line")
    for name, status, seconds, tail in rows:
        print(f"{name:<{width}}  {status:<24} {seconds:7.1f}  {tail}")
    return 0 if all(r[1] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
