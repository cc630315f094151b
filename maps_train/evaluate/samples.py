"""samples.json: the seed, size and ids of every data set's sample in a suite folder, written atomically."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from maps_train import safejson
from maps_train.errors import MapsTrainError, io_errors
from maps_train.paths import write_text_atomic
from maps_train.questions import Question
from maps_train.records.store import absent

SAMPLES_FILE = "samples.json"


def read_samples(path: Path) -> dict[str, Any]:
    """samples.json as written (data set -> seed, sizes, ids); absent: empty. Damage is a one-line error naming
    the file, never silently replaced: it holds the samples of data sets this run may not touch."""
    if absent(path):
        return {}
    with io_errors(path, "read"):
        data = path.read_bytes()
    try:
        samples = safejson.loads(data)
    except safejson.JSONLimitError as err:
        raise MapsTrainError(f"{path}: invalid JSON ({err}); delete it to write it anew") from None
    if not isinstance(samples, dict):
        raise MapsTrainError(f"{path}: expected a JSON object (data set -> sample); delete it to write it anew")
    return samples


def write_samples(path: Path, questions: dict[str, list[Question]]) -> None:
    """Record each data set's sample (seed, sizes, ids) in samples.json, keeping other data sets' entries; written
    atomically, so a kill or a full disk mid-write leaves the previous file whole."""
    samples = read_samples(path)
    for name, chosen in questions.items():
        record = chosen[0].metadata["sample"] if chosen else {"seed": None, "n": 0, "population": 0}
        samples[name] = {**record, "question_ids": [q.id for q in chosen]}
    write_text_atomic(path, json.dumps(samples, indent=1) + "\n")
