"""The CUDA driver layer: lazy initialisation, contexts, device facts, and loaded kernels.

Only cuda-python (``cuda.bindings.driver``) is used; torch is not imported here. When torch is in
use, it owns each device's *primary* context and this module works in that same context: if no
context is current on the calling thread, the device's primary context is retained and made
current (exactly what the CUDA runtime, and so torch, would do).

Every driver call returns ``(CUresult, values...)``; `check` turns a failure into `CudaError`
naming the call and the error, and returns the values.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from typing import Any, NamedTuple

try:  # cuda-bindings >= 12.6
    from cuda.bindings import driver as cu
except ImportError:  # pragma: no cover - older cuda-python layout
    from cuda import cuda as cu  # type: ignore[no-redef]

from .errors import CudaError, KernelLoadError, NoGpuError
from .manifest import KernelManifest
from .params import check_manifest

_SUCCESS = cu.CUresult.CUDA_SUCCESS
_INVALID_VALUE = cu.CUresult.CUDA_ERROR_INVALID_VALUE


def error_name(err: Any) -> str:
    """The driver's name of a ``CUresult`` (falls back to the enum's name without a driver)."""
    try:
        e, name = cu.cuGetErrorName(err)
        if e == _SUCCESS and name:
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - the error path must not raise a second error
        pass
    return getattr(err, "name", str(err))


def check(result: Any, call: str, detail: str = "") -> Any:
    """Raise `CudaError` if ``result`` (a cuda-python return tuple) carries an error.

    Returns ``None`` for a call that returns only a status, the single value for one value, and
    the tuple of values otherwise.
    """
    if isinstance(result, tuple):
        err, rest = result[0], result[1:]
    else:
        err, rest = result, ()
    if err != _SUCCESS:
        raise CudaError(call, int(err), error_name(err), detail)
    if not rest:
        return None
    if len(rest) == 1:
        return rest[0]
    return rest


# ------------------------------------------------------------------------------------------------
# Initialisation, devices, contexts

_lock = threading.RLock()
_initialized = False
_primary_contexts: dict[int, Any] = {}
_device_infos: dict[int, "DeviceInfo"] = {}


def init() -> None:
    """``cuInit`` once per process; raise `NoGpuError` when there is no driver or no device."""
    global _initialized
    if _initialized:
        return
    with _lock:
        if _initialized:
            return
        try:
            result = cu.cuInit(0)
        except Exception as exc:  # noqa: BLE001 - the driver library itself is missing
            raise NoGpuError(
                f"the CUDA driver library could not be loaded ({type(exc).__name__}: {exc}); "
                "cutegen kernels need an NVIDIA GPU with its driver installed"
            ) from None
        err = result[0] if isinstance(result, tuple) else result
        if err != _SUCCESS:
            raise NoGpuError(f"cuInit failed with {error_name(err)}: no usable CUDA device")
        count = check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
        if count == 0:
            raise NoGpuError("the CUDA driver reports no devices")
        _initialized = True


def device_count() -> int:
    init()
    return int(check(cu.cuDeviceGetCount(), "cuDeviceGetCount"))


def _device(ordinal: int) -> Any:
    init()
    count = device_count()
    if not 0 <= ordinal < count:
        raise NoGpuError(f"CUDA device {ordinal} does not exist ({count} devices)")
    return check(cu.cuDeviceGet(ordinal), "cuDeviceGet")


def ensure_context(ordinal: int = 0) -> Any:
    """Make sure a context of device ``ordinal`` is current; return it.

    A current context of that device (torch's, typically) is kept. Otherwise the device's primary
    context is retained (once per process) and made current on this thread.
    """
    init()
    ctx = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if ctx is not None and int(ctx) != 0:
        dev = check(cu.cuCtxGetDevice(), "cuCtxGetDevice")
        if int(dev) == ordinal:
            return ctx
    primary = primary_context(ordinal)
    check(cu.cuCtxSetCurrent(primary), "cuCtxSetCurrent")
    return primary


def primary_context(ordinal: int) -> Any:
    """The device's primary context (the one torch and the CUDA runtime use), retained once."""
    with _lock:
        ctx = _primary_contexts.get(ordinal)
        if ctx is None:
            ctx = check(cu.cuDevicePrimaryCtxRetain(_device(ordinal)), "cuDevicePrimaryCtxRetain")
            _primary_contexts[ordinal] = ctx
        return ctx


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """The facts about one GPU that loading and launching need."""

    ordinal: int
    name: str
    capability: tuple[int, int]
    sm_count: int
    smem_optin: int

    @property
    def arch(self) -> str:
        """``sm_90`` style name of the compute capability."""
        return f"sm_{self.capability[0]}{self.capability[1]}"


def device_info(ordinal: int = 0) -> DeviceInfo:
    """Name, compute capability, SM count and shared-memory opt-in limit of a device (cached)."""
    info = _device_infos.get(ordinal)
    if info is not None:
        return info
    dev = _device(ordinal)
    attr = cu.CUdevice_attribute

    def get(a: Any) -> int:
        return int(check(cu.cuDeviceGetAttribute(a, dev), f"cuDeviceGetAttribute({a.name})"))

    raw_name = check(cu.cuDeviceGetName(256, dev), "cuDeviceGetName")
    name = raw_name.split(b"\0", 1)[0].decode() if isinstance(raw_name, bytes) else str(raw_name)
    info = DeviceInfo(
        ordinal=ordinal,
        name=name,
        capability=(
            get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        ),
        sm_count=get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        smem_optin=get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
    )
    _device_infos[ordinal] = info
    return info


# ------------------------------------------------------------------------------------------------
# Launch attributes


def launch_attributes(manifest: KernelManifest, cluster_only: bool = False) -> list[Any]:
    """A fresh ``CUlaunchAttribute`` list for ``manifest``: cluster, PDL, cooperative.

    Built new for every config: appending to a list read back from a ``CUlaunchConfig`` was seen
    to give ``CUDA_ERROR_INVALID_VALUE``. ``cluster_only`` leaves out PDL and cooperative (for
    occupancy queries).
    """
    ids = cu.CUlaunchAttributeID
    attrs = []
    cluster = cu.CUlaunchAttribute()
    cluster.id = ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    cluster.value.clusterDim.x = int(manifest.cluster[0])
    cluster.value.clusterDim.y = int(manifest.cluster[1])
    cluster.value.clusterDim.z = int(manifest.cluster[2])
    attrs.append(cluster)
    if cluster_only:
        return attrs
    if manifest.pdl:
        pdl = cu.CUlaunchAttribute()
        pdl.id = ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        pdl.value.programmaticStreamSerializationAllowed = 1
        attrs.append(pdl)
    if manifest.cooperative:
        coop = cu.CUlaunchAttribute()
        coop.id = ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        coop.value.cooperative = 1
        attrs.append(coop)
    return attrs


def launch_config(
    manifest: KernelManifest, grid: tuple[int, int, int], stream: int = 0, cluster_only: bool = False
) -> tuple[Any, list[Any]]:
    """A ``CUlaunchConfig`` for ``manifest`` and ``grid``; returns it with its attribute list
    (keep both alive together)."""
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = (int(g) for g in grid)
    config.blockDimX, config.blockDimY, config.blockDimZ = (int(b) for b in manifest.block)
    config.sharedMemBytes = int(manifest.smem_bytes)
    config.hStream = cu.CUstream(int(stream))
    attrs = launch_attributes(manifest, cluster_only=cluster_only)
    config.attrs = attrs
    config.numAttrs = len(attrs)
    return config, attrs


# ------------------------------------------------------------------------------------------------
# Loaded kernels


def query_param_layout(function: Any, limit: int = 4096) -> list[tuple[int, int]]:
    """``(offset, size)`` of every parameter of ``function``, from ``cuFuncGetParamInfo``.

    The driver answers ``CUDA_ERROR_INVALID_VALUE`` past the last parameter; that ends the list.
    """
    layout: list[tuple[int, int]] = []
    for index in range(limit):
        result = cu.cuFuncGetParamInfo(function, index)
        if result[0] == _INVALID_VALUE:
            break
        offset, size = check(result, f"cuFuncGetParamInfo(index={index})")
        layout.append((int(offset), int(size)))
    return layout


class FunctionFacts(NamedTuple):
    """What a loaded cubin states about its entry (``cuFuncGetAttribute``)."""

    max_threads: int  # threads per block beyond which a launch fails
    static_smem: int  # bytes of static shared memory
    required_cluster: tuple[int, int, int]  # (0, 0, 0) when the cubin requires none


def compare_function_facts(manifest: KernelManifest, facts: FunctionFacts, smem_optin: int) -> None:
    """Refuse a manifest that the cubin contradicts: more threads per block than the entry
    takes, static plus dynamic shared memory over the device's limit, or another cluster shape
    than the one the cubin requires."""
    threads = int(manifest.block[0]) * int(manifest.block[1]) * int(manifest.block[2])
    if threads > facts.max_threads:
        raise KernelLoadError(
            f"kernel {manifest.name}: the manifest launches {threads} threads per block; its cubin's entry "
            f"takes at most {facts.max_threads}; rebuild the kernel"
        )
    if facts.static_smem + int(manifest.smem_bytes) > smem_optin:
        raise KernelLoadError(
            f"kernel {manifest.name}: {facts.static_smem} bytes of static shared memory in its cubin plus the "
            f"manifest's {manifest.smem_bytes} dynamic exceed this GPU's {smem_optin} per block"
        )
    if any(facts.required_cluster) and tuple(facts.required_cluster) != tuple(int(c) for c in manifest.cluster):
        raise KernelLoadError(
            f"kernel {manifest.name}: its cubin requires clusters of {facts.required_cluster}; the manifest "
            f"launches {tuple(manifest.cluster)}; rebuild the kernel"
        )


def query_function_facts(function: Any) -> FunctionFacts:
    """`FunctionFacts` of a loaded entry."""
    fa = cu.CUfunction_attribute

    def get(attribute: Any) -> int:
        return int(check(cu.cuFuncGetAttribute(attribute, function), f"cuFuncGetAttribute({attribute.name})"))

    return FunctionFacts(
        max_threads=get(fa.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
        static_smem=get(fa.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
        required_cluster=(get(fa.CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH),
                          get(fa.CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT),
                          get(fa.CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH)),
    )


def compare_param_layout(manifest: KernelManifest, layout: list[tuple[int, int]]) -> None:
    """Refuse a driver-reported layout that differs from the manifest (relative to param 0)."""
    if len(layout) != len(manifest.params):
        raise KernelLoadError(
            f"kernel {manifest.name}: the cubin's entry {manifest.entry!r} has {len(layout)} "
            f"parameters but the manifest declares {len(manifest.params)}; rebuild the kernel"
        )
    if not layout:
        return
    base_driver = layout[0][0]
    base_manifest = manifest.params[0].offset
    for param, (offset, size) in zip(manifest.params, layout):
        rel_driver = offset - base_driver
        rel_manifest = param.offset - base_manifest
        if rel_driver != rel_manifest or size != param.size:
            raise KernelLoadError(
                f"kernel {manifest.name}: param {param.index} {param.name!r} is at relative offset "
                f"{rel_manifest} with size {param.size} in the manifest, but at {rel_driver} with "
                f"size {size} in the cubin; the manifest does not describe this cubin"
            )


class LoadedKernel:
    """One cubin loaded in one device's context, checked against its manifest, ready to launch.

    Create with `LoadedKernel.load`. Holds the module and function handles, the device facts, the
    max-active-clusters count (queried once) and the launcher's per-call cache.
    """

    def __init__(
        self, manifest: KernelManifest, device: DeviceInfo, context: Any, module: Any, function: Any
    ) -> None:
        self.manifest = manifest
        self.device = device
        self.context = context
        self.module = module
        self.function = function
        self._max_active_clusters: int | None = None
        # Filled by launch.py: prepared launches keyed by the call's operands and extents.
        self.launch_cache: Any = None

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def cluster_size(self) -> int:
        c = self.manifest.cluster
        return int(c[0]) * int(c[1]) * int(c[2])

    def __repr__(self) -> str:
        return f"LoadedKernel({self.manifest.name!r}, device={self.device.ordinal})"

    @classmethod
    def load(cls, manifest: KernelManifest, cubin: bytes, ordinal: int = 0) -> "LoadedKernel":
        """Load ``cubin`` as its own module in device ``ordinal``'s context and check it.

        Sets the dynamic shared-memory limit to ``manifest.smem_bytes`` (refused above the
        device's opt-in maximum) and allows non-portable cluster sizes, then compares the
        driver's parameter layout and what the cubin states of its entry (`compare_function_facts`)
        with the manifest.
        """
        check_manifest(manifest)
        context = ensure_context(ordinal)
        device = device_info(ordinal)
        if manifest.smem_bytes > device.smem_optin:
            raise KernelLoadError(
                f"kernel {manifest.name} needs {manifest.smem_bytes} bytes of dynamic shared "
                f"memory; {device.name} allows at most {device.smem_optin} per block"
            )
        try:
            module = check(cu.cuModuleLoadData(cubin), "cuModuleLoadData")
        except CudaError as exc:
            raise KernelLoadError(
                f"kernel {manifest.name}: the cubin could not be loaded on {device.name} "
                f"({device.arch}): {exc}"
            ) from exc
        try:
            function = check(
                cu.cuModuleGetFunction(module, manifest.entry.encode()), "cuModuleGetFunction"
            )
        except CudaError as exc:
            cu.cuModuleUnload(module)
            raise KernelLoadError(
                f"kernel {manifest.name}: entry {manifest.entry!r} not found in its cubin: {exc}"
            ) from exc
        kernel = cls(manifest, device, context, module, function)
        try:
            try:
                facts = query_function_facts(function)
            except CudaError as exc:
                raise KernelLoadError(f"kernel {manifest.name}: {exc}") from exc
            compare_function_facts(manifest, facts, device.smem_optin)
            kernel._configure()
            kernel._check_params()
        except BaseException:
            cu.cuModuleUnload(module)
            raise
        return kernel

    def _configure(self) -> None:
        fa = cu.CUfunction_attribute
        try:
            check(
                cu.cuFuncSetAttribute(
                    self.function, fa.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    int(self.manifest.smem_bytes),
                ),
                "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
            )
            if self.cluster_size > 1:
                check(
                    cu.cuFuncSetAttribute(
                        self.function, fa.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1
                    ),
                    "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)",
                )
        except CudaError as exc:
            raise KernelLoadError(f"kernel {self.manifest.name}: {exc}") from exc

    def _check_params(self) -> None:
        try:
            layout = query_param_layout(self.function)
        except CudaError as exc:
            if exc.name in ("CUDA_ERROR_NOT_SUPPORTED", "CUDA_ERROR_NOT_FOUND"):
                warnings.warn(
                    f"kernel {self.manifest.name}: this driver cannot report parameter layouts "
                    f"({exc.name}); the manifest's layout is trusted unchecked",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return
            raise KernelLoadError(f"kernel {self.manifest.name}: {exc}") from exc
        compare_param_layout(self.manifest, layout)

    def max_active_clusters(self) -> int:
        """How many clusters of this kernel fit on the device at once (queried once, cached).

        ``cuOccupancyMaxActiveClusters`` with the cluster attribute; if it fails or answers 0,
        the SM count divided by the cluster size.
        """
        if self._max_active_clusters is not None:
            return self._max_active_clusters
        fallback = max(1, self.device.sm_count // max(1, self.cluster_size))
        value = 0
        try:
            grid = tuple(int(c) for c in self.manifest.cluster)
            config, _attrs = launch_config(self.manifest, grid, cluster_only=True)  # type: ignore[arg-type]
            result = cu.cuOccupancyMaxActiveClusters(self.function, config)
            if result[0] == _SUCCESS:
                value = int(result[1])
        except Exception:  # noqa: BLE001 - occupancy is advisory; fall back below
            value = 0
        self._max_active_clusters = value if value > 0 else fallback
        return self._max_active_clusters

    def unload(self) -> None:
        if self.module is not None:
            cu.cuModuleUnload(self.module)
            self.module = None
            self.function = None


__all__ = [
    "DeviceInfo",
    "FunctionFacts",
    "LoadedKernel",
    "check",
    "compare_function_facts",
    "compare_param_layout",
    "cu",
    "device_count",
    "device_info",
    "ensure_context",
    "error_name",
    "init",
    "launch_attributes",
    "launch_config",
    "primary_context",
    "query_function_facts",
    "query_param_layout",
]
