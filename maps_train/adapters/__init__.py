"""Adapter sets: the manifest beside a stage's adapters and the one answer to which route serves each role."""

from maps_train.adapters.set import MANIFEST_FILE, Adapter, AdapterSet
from maps_train.adapters.student import (
    distilled_dir,
    distilled_set,
    load_set,
    rl_source_dir,
    rl_source_set,
    student_base,
    student_routes,
    with_student_routes,
)

__all__ = ["MANIFEST_FILE", "Adapter", "AdapterSet", "distilled_dir", "distilled_set", "load_set", "rl_source_dir",
           "rl_source_set", "student_base", "student_routes", "with_student_routes"]
