"""ecc: ECC mode and error counts, retired pages (pre-Ampere) and remapped rows (Ampere+).

Error counts come twice (nvml.h, nvmlEccCounterType_t): volatile, since the driver was loaded,
and aggregate, the GPU's lifetime count kept in the InfoROM across driver reloads and resets.
"""

from __future__ import annotations

import pynvml as N

from gpu_exporter.collect.nvml.collectors.base import Collector, Device, FieldSpec
from gpu_exporter.model.snapshot import Reading

REMAP_FIELDS = (
    FieldSpec(142, "gpu_remapped_rows_total", (("severity", "correctable"),)),
    FieldSpec(143, "gpu_remapped_rows_total", (("severity", "uncorrectable"),)),
    FieldSpec(144, "gpu_row_remap_pending"),
    FieldSpec(145, "gpu_row_remap_failure"),
)
_RETIREMENT_CAUSES = (
    ("single_bit_ecc", N.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
    ("double_bit_ecc", N.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
)


class Ecc(Collector):
    name = "ecc"
    families = (
        "gpu_ecc_enabled",
        "gpu_ecc_errors_total",
        "gpu_ecc_aggregate_errors_total",
        "gpu_retired_pages_total",
        "gpu_retired_pages_pending",
        "gpu_remapped_rows_total",
        "gpu_row_remap_pending",
        "gpu_row_remap_failure",
    )
    calls = (
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetRemappedRows",  # without the remapped-row fields
    )
    fields = (
        FieldSpec(3, "gpu_ecc_errors_total", (("error", "corrected"),)),  # ECC_SBE_VOL_TOTAL
        FieldSpec(4, "gpu_ecc_errors_total", (("error", "uncorrected"),)),  # ECC_DBE_VOL_TOTAL
        # ECC_SBE_AGG_TOTAL, ECC_DBE_AGG_TOTAL
        FieldSpec(5, "gpu_ecc_aggregate_errors_total", (("error", "corrected"),)),
        FieldSpec(6, "gpu_ecc_aggregate_errors_total", (("error", "uncorrected"),)),
        *REMAP_FIELDS,
    )
    refreshes = True

    def refresh(self, nvml: Device) -> list[Reading]:
        h, out = nvml.handle, []
        ecc = nvml.call("ecc_mode", N.nvmlDeviceGetEccMode, h)
        if ecc is not None:
            out.append(Reading("gpu_ecc_enabled", float(ecc[0] == N.NVML_FEATURE_ENABLED)))
        for cause, code in _RETIREMENT_CAUSES:
            pages = nvml.call(f"retired_pages_{cause}", N.nvmlDeviceGetRetiredPages, h, code)
            if pages is not None:
                out.append(Reading("gpu_retired_pages_total", len(pages), (("cause", cause),)))
        pending = nvml.call("retired_pages_pending", N.nvmlDeviceGetRetiredPagesPendingStatus, h)
        if pending is not None:
            out.append(Reading("gpu_retired_pages_pending", float(bool(pending))))
        return out

    def read(self, nvml: Device) -> list[Reading]:
        out = nvml.field_readings(self.fields)
        if nvml.fields_gone(*(spec.field_id for spec in REMAP_FIELDS)):
            rows = nvml.call("remapped_rows", N.nvmlDeviceGetRemappedRows, nvml.handle)
            if rows is not None:
                corr, unc, pending, failure = rows
                out += [
                    Reading("gpu_remapped_rows_total", corr, (("severity", "correctable"),)),
                    Reading("gpu_remapped_rows_total", unc, (("severity", "uncorrectable"),)),
                    Reading("gpu_row_remap_pending", float(bool(pending))),
                    Reading("gpu_row_remap_failure", float(bool(failure))),
                ]
        return out
