"""Hardware knowledge: device and link specs, collective cost models, kernel classes.

Everything here is static data plus closed-form models; nothing touches a GPU.
"""

from perfcast.hardware.classify import (
    KernelClass,
    classify_kernel,
    classify_names,
    dtype_from_kernel_name,
    gemm_flops_bytes,
    is_compute_bound_class,
    roofline_time_us,
)
from perfcast.hardware.collectives import (
    allgather_time_us,
    allreduce_time_us,
    alltoall_time_us,
    broadcast_time_us,
    bus_bandwidth_factor,
    bus_bandwidth_gbs,
    collective_from_kernel_name,
    collective_time_us,
    reduce_scatter_time_us,
    reduce_time_us,
    sendrecv_time_us,
)
from perfcast.hardware.devices import (
    DTYPES,
    DeviceSpec,
    convs_in_tf32,
    list_devices,
    lookup_device,
    lookup_device_properties,
    nearest_device,
)
from perfcast.hardware.interconnects import (
    LinkSpec,
    default_intra_node_link,
    list_links,
    lookup_link,
)

__all__ = [
    "DTYPES",
    "DeviceSpec",
    "KernelClass",
    "LinkSpec",
    "allgather_time_us",
    "allreduce_time_us",
    "alltoall_time_us",
    "broadcast_time_us",
    "bus_bandwidth_factor",
    "bus_bandwidth_gbs",
    "classify_kernel",
    "classify_names",
    "collective_from_kernel_name",
    "collective_time_us",
    "convs_in_tf32",
    "default_intra_node_link",
    "dtype_from_kernel_name",
    "gemm_flops_bytes",
    "is_compute_bound_class",
    "list_devices",
    "list_links",
    "lookup_device",
    "lookup_device_properties",
    "lookup_link",
    "nearest_device",
    "reduce_scatter_time_us",
    "reduce_time_us",
    "roofline_time_us",
    "sendrecv_time_us",
]
