"""Teachers per role: a role's teacher is a model (any backend of the router) or the annotation teacher, which plays
the role from the question's data set annotations inside the real MAPS loop (`roles.<role>.backend: annotation`).

`annotations` reads each data set's annotated hops, `reading` reads what a call's prompt shows, `policy` plays each
role from both, `backend` is the router's backend and its fallbacks. Only `maps-train traces` builds it.
"""

from maps_train.teachers.annotations import Annotation, Hop, annotation_of, read_annotations
from maps_train.teachers.backend import AnnotationBackend, Annotations, teacher_of

__all__ = ["Annotation", "AnnotationBackend", "Annotations", "Hop", "annotation_of", "read_annotations", "teacher_of"]
