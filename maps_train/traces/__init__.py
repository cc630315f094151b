"""Teacher traces: collecting them with the teacher (`collect`) and turning them into per-role SFT sets (`sft`).
The trace record itself lives in `maps_train.records.trace`."""
