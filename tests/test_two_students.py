"""One teacher run, two students: the teacher's traces are collected once, both students' SFT sets come from them
(one shared set: the same template family), both train an adapter with an eval loss, and the offline W&B runs
hold the artifact manifests that link traces -> SFT set -> adapters.

Everything runs in this process through the user's commands (`maps-train traces`, `maps-train sft-data`, the
`python -m maps_train.train` entry point without `accelerate launch`), with a scripted teacher and tiny students.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scripted_backend import RecordingRetriever, ScriptedBackend, consolidator_sufficient_after
from typer.testing import CliRunner

from maps_train.recipe import load_recipe, sft_set_dir

QUESTIONS = 8
STUDENTS = {"student-a": {"r": 8, "lora_alpha": 16}, "student-b": {"r": 4, "lora_alpha": 8}}
WANDB_VARIABLES = ("WANDB_MODE", "WANDB_PROJECT", "WANDB_RUN_GROUP", "WANDB_DIR", "WANDB_ENTITY", "WANDB_TAGS")


def write_layout(root: Path) -> tuple[Path, dict[str, Path]]:
    """A teacher recipe and two student overlays on it, as recipes/teacher and recipes/distill lay them out."""
    questions = root / "questions.jsonl"
    questions.write_text("".join(
        json.dumps({"id": f"q{i}", "question": f"Who is q{i}?", "golden_answers": [f"answer of q{i}"]}) + "\n"
        for i in range(QUESTIONS)
    ))
    teacher = root / "recipes" / "teacher" / "teacher.yaml"
    teacher.parent.mkdir(parents=True)
    teacher.write_text(f"""name: teacher
roles:
  default: {{backend: vllm, model: scripted-teacher}}
agent: {{num_directions: 2, max_rounds: 2, batch_size: 8}}
traces: {{questions: [{questions}], out_dir: {root / 'teacher' / 'traces'}}}
sft_data: {{eval_fraction: 0.25, eval_seed: 0}}
wandb: {{enabled: true, mode: offline, dir: {root / 'wandb'}}}
""")
    students = {}
    for name, lora in STUDENTS.items():
        path = root / "recipes" / "distill" / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"""base: ../teacher/teacher.yaml
name: {name}
train:
  student: builtin:tiny-qwen3
  output_dir: {root / name / 'adapters'}
  shared_adapter: true
  lora: {json.dumps(lora)}
  sft: {{max_steps: 2, logging_steps: 1, per_device_train_batch_size: 4, max_length: 512, save_steps: 100}}
""")
        students[name] = path
    return teacher, students


@pytest.fixture
def fresh_wandb(tmp_path, monkeypatch):
    """W&B offline into tmp_path/wandb, for our runs and the transformers integration's alike: wandb reads its
    environment once per process (`wandb.setup`), so it is torn down before and after."""
    import wandb

    for name in WANDB_VARIABLES:  # the commands set these for the transformers integration: undone after the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    wandb.teardown()
    yield tmp_path / "wandb" / "wandb"
    wandb.teardown()


@pytest.fixture
def teacher_backend(monkeypatch):
    """The teacher as the traces command builds it, scripted; `built` counts how often a router was built."""
    backend = ScriptedBackend({"consolidator": consolidator_sufficient_after(2)})
    backend.built = []

    def build_router(recipe, annotations=None):  # the traces stage passes the annotation teacher's
        backend.built.append(recipe.name)
        return backend

    monkeypatch.setattr("maps_train.llm.router.build_router", build_router)
    monkeypatch.setattr("maps_train.retrieval.factory.build_retriever", lambda config: RecordingRetriever())
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return backend


def cli(*args: str) -> str:
    from maps_train.cli import app

    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, f"maps-train {' '.join(args)}:\n{result.output}\n{result.exception!r}"
    return result.output


def test_two_students_from_one_teacher_run(tmp_path, teacher_backend, fresh_wandb):
    from maps_train.train.__main__ import main as train_main

    teacher, students = write_layout(tmp_path)
    cli("traces", str(teacher))
    teacher_batches = len(teacher_backend.batches)
    assert teacher_backend.built == ["teacher"] and teacher_batches > 0

    summaries, trainer_states = {}, {}
    for name, path in students.items():
        recipe = load_recipe(str(path))
        assert recipe.traces.out_dir == str(tmp_path / "teacher" / "traces")  # the teacher's, through `base`
        cli("sft-data", str(path))
        assert train_main(["--config", str(path), "--role", "all"]) == 0
        summaries[name] = json.loads((tmp_path / name / "adapters" / "shared" / "train_summary.json").read_text())
        trainer_states[name] = json.loads(  # the Trainer's own record of the run: global step, log history
            (tmp_path / name / "adapters" / "_trainer" / "shared" / "trainer_state.json").read_text()
        )

    # The teacher ran once: no student step built a router or sent it a request.
    assert teacher_backend.built == ["teacher"] and len(teacher_backend.batches) == teacher_batches
    traces = list((tmp_path / "teacher" / "traces").rglob("traces.jsonl"))
    assert len(traces) == 1 and len(traces[0].read_text().splitlines()) == QUESTIONS

    # One SFT set for both (same template family), under the teacher's traces, with a held-out split.
    sets = {sft_set_dir(load_recipe(str(path))) for path in students.values()}
    assert len(sets) == 1
    (shared_set,) = sets
    assert shared_set.parent == tmp_path / "teacher" / "traces" / "sft"
    assert json.loads((shared_set / "stats.json").read_text())["eval_questions"] == 2

    for name, summary in summaries.items():
        assert summary["student"] == "builtin:tiny-qwen3" and summary["lora_r"] == STUDENTS[name]["r"]
        eval_losses = [(entry["step"], entry["eval_loss"]) for entry in trainer_states[name]["log_history"]
                       if "eval_loss" in entry]
        assert trainer_states[name]["global_step"] == 2 and summary["eval_rows"] > 0
        assert [step for step, _ in eval_losses] == [1, 2]
        assert all(math.isfinite(loss) for _, loss in eval_losses)

    check_lineage(fresh_wandb, shared_set)


# ---------------------------------------------------------------- what the offline W&B runs hold


def offline_records(run_dir: Path):
    """The protobuf records of an offline run's `run-*.wandb` file.

    The file is a LevelDB-format log (what wandb-core writes and `wandb sync` reads): a 7-byte header, then 32 KiB
    blocks of chunks, each `crc32c (4) | length (2, little-endian) | type (1) | data`, type 1 a whole record,
    2/3/4 its first/middle/last pieces; a block's last < 7 bytes are padding.
    """
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("run-*.wandb")
    data, block, pos, pending = path.read_bytes(), 32768, 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def logged_artifacts(wandb_dir: Path) -> dict[str, list]:
    """Artifact type -> the artifact records of every offline run under `wandb_dir`."""
    found: dict[str, list] = {}
    for run_dir in sorted(wandb_dir.glob("offline-run-*")):
        for record in offline_records(run_dir):
            if record.WhichOneof("record_type") == "artifact":
                found.setdefault(record.artifact.type, []).append(record.artifact)
    return found


def check_lineage(wandb_dir: Path, shared_set: Path) -> None:
    artifacts = logged_artifacts(wandb_dir)
    (traces,) = artifacts["traces"]  # logged by the one teacher run
    paths = {entry.path: entry for entry in traces.manifest.contents}
    assert any(path.endswith("sample-0/traces.jsonl") for path in paths)
    assert all(entry.ref.startswith("file://") for entry in paths.values())  # by reference: checksummed, not copied
    assert not any(path.startswith(("sft/", "wandb/")) for path in paths)

    sft_sets = artifacts["sft"]
    assert len(sft_sets) == 2 and len({a.digest for a in sft_sets}) == 1  # both students built the same set
    for artifact in sft_sets:
        files = {entry.path for entry in artifact.manifest.contents}
        assert {"proposer/train.jsonl", "proposer/eval.jsonl", "stats.json", "settings.json"} <= files
        inputs = json.loads(artifact.metadata)["inputs"]
        assert inputs == [{"name": traces.name, "type": "traces", "digest": traces.digest}]

    adapters = artifacts["adapter"]
    assert sorted(a.name for a in adapters) == ["adapter-student-a-shared", "adapter-student-b-shared"]
    for artifact in adapters:
        files = {entry.path for entry in artifact.manifest.contents}
        assert {"adapter_model.safetensors", "adapter_config.json", "train_summary.json"} <= files
        metadata = json.loads(artifact.metadata)
        assert metadata["inputs"] == [{"name": sft_sets[0].name, "type": "sft", "digest": sft_sets[0].digest}]
        assert math.isfinite(metadata["eval_loss"])
