"""Calibration: overlap basis, base scales and per-step statistics, computed once per model (docs/algorithm.md §4)."""

from .base_scales import base_scales_from_gram, elf_response_gram
from .calibrate import (
    CalibrationResult,
    apply_calibration,
    calibrate_pipeline,
    format_summary,
    trajectory_statistics,
)
from .overlap import (
    OverlapBasis,
    ProjectionGeometry,
    effective_input_maps,
    format_projection_geometry,
    overlap_basis,
    overlap_basis_from_model,
    projection_geometry,
    row_space_basis,
)
from .reference import MomentAccumulator, ReferenceRecurrenceMixin, reference_activation, reference_recurrence
