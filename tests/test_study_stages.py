"""A learning study keyed by what made each stage (issue 65): a rerun with another --dev, --train or --seed is refused
in one line (or rebuilds from the split with --rebuild-from), a dev question found in the training traces is never
scored, a bad suite fails before the first stage, and every system of the suite is evaluated.

The split is the real one over ../shared/realdata; the later stages are stamped by hand where a test needs them
made (a traces file with the rows a teacher run writes), so no model runs here: what is under test is what the
study decides before it starts a stage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from maps_train.errors import MapsTrainError
from maps_train.study.preflight import check_dev_untrained, plan_study
from maps_train.study.run import run_study, stage_commands
from maps_train.study.stamps import STAMP_FILE, write_stamp

REPO = Path(__file__).resolve().parent.parent
DATASETS = ("hotpotqa", "2wikimultihopqa", "musique", "nq")


def make_study(tmp_path: Path, extra_system: bool = True) -> dict:
    """A recipe on recipes/study/learning.yaml and a suite on eval/suites/learning_study.yaml, every folder under
    tmp_path (so nothing of runs/ is touched)."""
    out = tmp_path / "study"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "base": str(REPO / "recipes" / "study" / "learning.yaml"),
        "traces": {"questions": [str(out / "split" / "train.jsonl")], "out_dir": str(tmp_path / "traces")},
        "sft_data": {"traces_dir": str(tmp_path / "traces"), "out_dir": str(tmp_path / "sft")},
        "train": {"sft_dir": str(tmp_path / "sft"), "output_dir": str(tmp_path / "adapters")},
        "rl": {"output_dir": str(tmp_path / "rl"), "adapters_dir": str(tmp_path / "adapters")},
        "wandb": {"enabled": False},
    }))
    systems = [
        {"name": "vanilla_rag", "overrides": ["agent.method=vanilla"]},
        {"name": "maps_base", "routes": "student_base"},
        {"name": "maps_sft", "routes": "distilled"},
        {"name": "maps_rl", "routes": "distilled",
         "adapters": {"writer": str(tmp_path / "rl" / "adapters" / "writer")}},
    ]
    if extra_system:
        systems.append({"name": "maps_sft_n1", "routes": "distilled", "overrides": ["agent.num_directions=1"]})
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "study-test", "out_dir": str(tmp_path / "eval"),
        "datasets": [{"name": name, "path": str(out / "split" / "dev" / f"{name}.jsonl")} for name in DATASETS],
        "defaults": {"recipe": str(recipe)}, "systems": systems, "wandb": {"enabled": False},
    }))
    return {"recipe": str(recipe), "suite": str(suite), "out": out}


def study(world: dict, realdata, overrides=(), **settings):
    args = {"dev": 2, "train": 3, "seed": 0, "rl": False, **settings}
    return run_study(world["recipe"], world["suite"], list(overrides), data_root=str(realdata), out=world["out"],
                     **args)


def test_a_rerun_with_another_split_is_refused_or_rebuilds(tmp_path, realdata):
    world = make_study(tmp_path)
    assert study(world, realdata, stop_after="split") is None
    split = world["out"] / "split" / "split.json"
    made = split.read_bytes()
    assert json.loads(made)["dev_per_dataset"] == 2
    stamp = f"{world['out'] / 'split' / STAMP_FILE}"
    for settings, difference in (({"dev": 3}, "made with --dev 2, this run asks --dev 3"),
                                 ({"train": 2}, "made with --train 3, this run asks --train 2"),
                                 ({"seed": 5}, "made with --seed 0, this run asks --seed 5")):
        with pytest.raises(MapsTrainError) as refused:
            study(world, realdata, **settings)
        assert str(refused.value) == f"{stamp}: {difference}; use another --out or --rebuild-from split"
        assert split.read_bytes() == made  # nothing rewritten
    with pytest.raises(MapsTrainError, match="at least 1 dev and 1 train question"):
        study(world, realdata, train=0)
    assert not (tmp_path / "traces").exists() and not (tmp_path / "eval").exists()  # no stage ran, nothing scored

    # a later stage this study made (stamped) goes with the split it came from on --rebuild-from split
    plan = plan_study(world["recipe"], world["suite"], [], data_root=str(realdata), out=world["out"], dev=2, train=3,
                      seed=0, rl=False, base="maps_base", baseline="vanilla_rag", rebuild_from=None)
    write_stamp(plan.stage("traces"), done=True)
    (tmp_path / "traces" / "run").mkdir()
    study(world, realdata, dev=3, rebuild_from="split", stop_after="split")
    assert json.loads(split.read_text())["dev_per_dataset"] == 3
    assert not (tmp_path / "traces").exists()
    # a folder no study stamped is never removed: refused
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "mine.jsonl").write_text("{}\n")
    with pytest.raises(MapsTrainError, match=r"sft: holds files no study stamped"):
        study(world, realdata, dev=3, rebuild_from="split", stop_after="split")
    assert (tmp_path / "sft" / "mine.jsonl").is_file()


def stamp_trained(world: dict, realdata, tmp_path: Path, trained_rows: list[dict]) -> None:
    """Traces, SFT sets and adapters as a finished study leaves them (stamped done), the traces holding `rows`."""
    plan = plan_study(world["recipe"], world["suite"], [], data_root=str(realdata), out=world["out"], dev=2, train=3,
                      seed=0, rl=False, base="maps_base", baseline="vanilla_rag", rebuild_from=None)
    for name in ("traces", "sft-data", "train"):
        write_stamp(plan.stage(name), done=True)
    folder = tmp_path / "traces" / "study-train" / "sample-0"
    folder.mkdir(parents=True)
    (folder / "traces.jsonl").write_text("".join(json.dumps(row) + "\n" for row in trained_rows))


def test_a_dev_question_in_the_training_traces_is_never_scored(tmp_path, realdata):
    world = make_study(tmp_path)
    study(world, realdata, stop_after="split")
    train = [json.loads(line) for line in (world["out"] / "split" / "train.jsonl").read_text().splitlines()]
    dev = json.loads((world["out"] / "split" / "dev" / "musique.jsonl").read_text().splitlines()[1])
    trace = lambda row: {"question_id": row["id"], "question": row["question"], "dataset": row["dataset"],  # noqa: E731
                         "rounds": [], "final_answer": ""}
    stamp_trained(world, realdata, tmp_path, [trace(row) for row in train] + [trace(dev)])
    with pytest.raises(MapsTrainError) as refused:
        study(world, realdata)
    assert f"dev question musique/{dev['id']} was trained on" in str(refused.value)
    assert "traces.jsonl" in str(refused.value)
    assert not (tmp_path / "eval").exists()  # the eval never started

    # the same traces without the dev question: every dev question checked, none trained on
    (tmp_path / "traces" / "study-train" / "sample-0" / "traces.jsonl").write_text(
        "".join(json.dumps(trace(row)) + "\n" for row in train))
    plan = plan_study(world["recipe"], world["suite"], [], data_root=str(realdata), out=world["out"], dev=2, train=3,
                      seed=0, rl=False, base="maps_base", baseline="vanilla_rag", rebuild_from=None)
    assert check_dev_untrained(plan.suite, world["suite"], plan.recipe) == 2 * len(DATASETS)


@pytest.mark.parametrize("overrides,settings,message", [
    (["datasetz=[]"], {}, "datasetz: unknown key (did you mean 'datasets'?)"),
    (["datasets=[{name: mine, path: /nonexistent/dev.jsonl}]"], {}, "/nonexistent/dev.jsonl: no such file"),
    (["datasets=[{name: mine, path: EMPTY}]"], {}, "empty.jsonl: empty file"),
    ([], {"dev": 0}, "--dev 0 --train 3: a study needs at least 1 dev and 1 train question"),
    ([], {"dev": 100000}, "fewer than the 100000 and 3 asked for"),
    ([], {"base": "maps_bse"}, "--base maps_bse: no such system"),
])
def test_a_bad_study_fails_before_its_first_stage(tmp_path, realdata, overrides, settings, message):
    world = make_study(tmp_path)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    overrides = [item.replace("EMPTY", str(empty)) for item in overrides]
    with pytest.raises(MapsTrainError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        study(world, realdata, overrides, **settings)
    assert not world["out"].exists() and not (tmp_path / "traces").exists()


def test_a_misspelt_suite_key_is_one_line_and_exit_2_through_the_cli(tmp_path, realdata):
    world = make_study(tmp_path)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "maps_train.cli", "study", world["recipe"], world["suite"],
                           "datasetz=[]", "--out", str(world["out"]), "--data-root", str(realdata), "--dev", "2",
                           "--train", "3"], capture_output=True, text=True, env=env, cwd=REPO)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "datasetz: unknown key" in done.stderr
    assert not world["out"].exists() and not (tmp_path / "traces").exists()


def test_every_system_of_the_suite_is_evaluated(tmp_path, realdata):
    world = make_study(tmp_path)
    plan = plan_study(world["recipe"], world["suite"], [], data_root=str(realdata), out=world["out"], dev=2, train=3,
                      seed=0, rl=False, base="maps_base", baseline="vanilla_rag", rebuild_from=None)
    # without --rl the system serving the RL adapters is dropped (and said so); the extra system is run
    assert plan.systems == ["vanilla_rag", "maps_base", "maps_sft", "maps_sft_n1"] and plan.dropped == ["maps_rl"]
    command = stage_commands(plan, world["recipe"], world["suite"], [])["eval"]
    assert command[command.index("maps_sft_n1") - 1] == "--system"
    with_rl = plan_study(world["recipe"], world["suite"], [], data_root=str(realdata), out=world["out"], dev=2,
                         train=3, seed=0, rl=True, base="maps_base", baseline="vanilla_rag", rebuild_from=None)
    assert with_rl.systems == ["vanilla_rag", "maps_base", "maps_sft", "maps_rl", "maps_sft_n1"]
    assert [stage.name for stage in with_rl.stages] == ["split", "traces", "sft-data", "train", "rl", "eval"]


def test_a_second_study_into_one_folder_is_refused_naming_the_study(tmp_path, realdata):
    from maps_train.runlock import sole_writer
    from maps_train.study.run import STUDY_LOCK

    world = make_study(tmp_path)
    with sole_writer(world["out"], "maps-train study", STUDY_LOCK):
        with pytest.raises(MapsTrainError) as refused:
            study(world, realdata, stop_after="split")
    assert "maps-train study on" in str(refused.value) and "is already writing here" in str(refused.value)
    assert "demo" not in str(refused.value)
    assert not (world["out"] / "split").exists()
