"""DCGM field ids by name: every DCGM field the package names, written once.

The ids are NVIDIA's, from DCGM's header (NVIDIA/DCGM dcgmlib/dcgm_fields.h), with the names
as DCGM 4.5 and dcgm-exporter's counter files spell them (DCGM 4.6 renamed many fields and keeps
these names as aliases of the same ids). The activity fields (SM, tensor, DRAM and pipe
activity) are activity.py's rows, which pair each with its GPM metric and family; FIELD_IDS
includes them. The DCGM binding, the dcgm-exporter compatible output and the fake libdcgm read
their ids here.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpu_exporter.model.activity import ACTIVITY

# The fields beyond activity, in id order.
_FIELDS: dict[str, int] = {
    "DCGM_FI_DRIVER_VERSION": 1,
    "DCGM_FI_DEV_NAME": 50,
    "DCGM_FI_DEV_UUID": 54,
    "DCGM_FI_DEV_PCI_BUSID": 57,
    "DCGM_FI_DEV_SM_CLOCK": 100,
    "DCGM_FI_DEV_MEM_CLOCK": 101,
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 112,
    "DCGM_FI_DEV_MAX_SM_CLOCK": 113,
    "DCGM_FI_DEV_MAX_MEM_CLOCK": 114,
    "DCGM_FI_DEV_MEMORY_TEMP": 140,
    "DCGM_FI_DEV_GPU_TEMP": 150,
    "DCGM_FI_DEV_POWER_USAGE": 155,
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 156,
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": 160,
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN": 161,
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX": 162,
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF": 163,
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": 164,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 202,
    "DCGM_FI_DEV_GPU_UTIL": 203,
    "DCGM_FI_DEV_MEM_COPY_UTIL": 204,
    "DCGM_FI_DEV_ENC_UTIL": 206,
    "DCGM_FI_DEV_DEC_UTIL": 207,
    "DCGM_FI_DEV_XID_ERRORS": 230,
    "DCGM_FI_DEV_POWER_VIOLATION": 240,
    "DCGM_FI_DEV_THERMAL_VIOLATION": 241,
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": 242,
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": 243,
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION": 244,
    "DCGM_FI_DEV_RELIABILITY_VIOLATION": 245,
    "DCGM_FI_DEV_FB_TOTAL": 250,
    "DCGM_FI_DEV_FB_FREE": 251,
    "DCGM_FI_DEV_FB_USED": 252,
    "DCGM_FI_DEV_FB_RESERVED": 253,
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 310,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 311,
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": 312,
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": 313,
    "DCGM_FI_DEV_RETIRED_SBE": 390,
    "DCGM_FI_DEV_RETIRED_DBE": 391,
    "DCGM_FI_DEV_RETIRED_PENDING": 392,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 393,
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 394,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 395,
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 409,
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 419,
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 429,
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 439,
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 449,
    "DCGM_FI_PROF_PCIE_TX_BYTES": 1009,
    "DCGM_FI_PROF_PCIE_RX_BYTES": 1010,
    "DCGM_FI_PROF_NVLINK_TX_BYTES": 1011,
    "DCGM_FI_PROF_NVLINK_RX_BYTES": 1012,
    "DCGM_FI_PROF_NVLINK_L17_RX_BYTES": 1075,  # the last per-link NVLink field
    "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS": 1420,
    "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST_NS": 1421,
    "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS": 1422,
    "DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS": 1423,
    "DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN_NS": 1424,
}
# Older names the header keeps for the same field: name -> the name it stands for.
ALIASES: Mapping[str, str] = MappingProxyType(
    {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"}  # before DCGM 3.2
)

FIELD_IDS: Mapping[str, int] = MappingProxyType(
    _FIELDS
    | {activity.dcgm_name: activity.dcgm_field for activity in ACTIVITY}
    | {alias: _FIELDS[name] for alias, name in ALIASES.items()}
)
