"""Distillation loops above the single stages: on-policy (DAgger-style) rounds in which the student runs MAPS,
the teacher labels the states it reached, and the adapters retrain (`onpolicy`, `maps-train distill-on-policy`)."""
