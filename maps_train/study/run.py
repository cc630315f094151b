"""`maps-train study RECIPE SUITE`: the learning study in one command, every stage resumable.

Does training make the agent better at its job? The study answers on real questions held apart from training:

    split       ../shared/realdata -> <out>/split/{train.jsonl, dev/<dataset>.jsonl, split.json} (fixed seed)
    traces      the teacher (the recipe's roles) samples k MAPS runs a train question (`maps-train traces`)
    sft-data    rows kept per role by their credit (`sft_data.filter: role`, `maps-train sft-data`)
    train       one LoRA adapter per role (`maps-train train --role all`)
    rl          GRPO on `rl.roles` from the SFT adapters (`maps-train rl`; only with --rl)
    eval        every system of the suite on the dev questions, with the deployed decoding (systems serving the RL
                stage's adapters only with --rl: without it they are dropped, in one printed line and in STUDY.md,
                so the default command runs on the default suite); refused when a dev question was trained on
    report      <out>/STUDY.md (`study.report`): the split's digest, per system the means, the paired bootstrap 95%
                intervals (`evaluate.paired`; --base and --baseline against each system), the transfer
                towards a `teacher` where the results hold one, each stage's time

Everything is checked before the first stage (`study.preflight`): the recipe, the suite with its overrides, the
data set files, the sizes, and each stage folder's record of what made it (`study.stamps`, `study.keys`): a rerun
with other settings is refused in one line naming what differs, or with `--rebuild-from STAGE` rebuilds from that
stage on. Each stage is the command a user would run, printed before it runs, so any one can be rerun by hand, and
each resumes where a killed study stopped; a finished stage made with the same settings is reused. Suite overrides
after the suite (e.g. `datasets=[...]`) go to the eval, so the same adapters can be evaluated on other questions.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from pathlib import Path

import typer

from maps_train.demo import _environment
from maps_train.errors import MapsTrainError
from maps_train.paths import write_text_atomic
from maps_train.runlock import sole_writer
from maps_train.study.preflight import StudyPlan, check_dev_untrained, plan_study
from maps_train.study.report import write_study_report
from maps_train.study.split import SPLIT_FILE, split_questions
from maps_train.study.stamps import STAGE_ORDER, Stage, read_stamp, remove_stages, write_stamp
from maps_train.study.steps import MODEL_STAGES, cores_turn, run_stage

TIMES_FILE = "times.json"
BASE = "maps_base"  # the defaults of --base and --baseline: eval/suites/learning_study.yaml's names
BASELINE = "vanilla_rag"
STUDY_LOCK = ".study.lock"


def stage_commands(plan: StudyPlan, recipe: str, suite: str, suite_overrides: list[str]) -> dict[str, list[str]]:
    """The maps-train command of each stage after the split."""
    systems = [arg for name in plan.systems for arg in ("--system", name)]
    return {"traces": ["traces", recipe], "sft-data": ["sft-data", recipe], "train": ["train", recipe, "--role", "all"],
            "rl": ["rl", recipe], "eval": ["eval", suite, *suite_overrides, *systems]}


def split_digest(out: Path) -> str:
    return hashlib.sha256((out / "split" / SPLIT_FILE).read_bytes()).hexdigest()


def _finished(stage: Stage) -> bool:
    record = read_stamp(stage)
    return bool(record and record.get("key") == stage.key and record.get("done"))


def run_study(recipe: str, suite: str, suite_overrides: list[str], *, data_root: str, out: Path, dev: int,
              train: int, seed: int, rl: bool, base: str = BASE, baseline: str = BASELINE,
              rebuild_from: str | None = None, stop_after: str | None = None) -> Path | None:
    """The study (module docstring); returns STUDY.md's path (None with --stop-after before the report)."""
    plan = plan_study(recipe, suite, suite_overrides, data_root=data_root, out=out, dev=dev, train=train, seed=seed,
                      rl=rl, base=base, baseline=baseline, rebuild_from=rebuild_from)
    names = [stage.name for stage in plan.stages]
    if stop_after is not None and stop_after not in names:
        raise MapsTrainError(f"--stop-after {stop_after}: not a stage of this study ({', '.join(names)})")
    env = _environment()
    logs = out / "logs"
    times_path = out / TIMES_FILE
    with sole_writer(out, "maps-train study", STUDY_LOCK):
        times: dict[str, float] = json.loads(times_path.read_text()) if times_path.is_file() else {}
        if plan.to_remove:
            remove_stages(plan.to_remove)
            typer.echo(f"rebuilding from {rebuild_from}: removed {', '.join(str(s.folder) for s in plan.to_remove)}")
            for stage in plan.to_remove:
                times.pop(stage.name, None)
        if plan.dropped:
            typer.echo(f"not evaluated: {', '.join(plan.dropped)} (they serve the RL stage's adapters; add --rl)")
        commands = stage_commands(plan, recipe, suite, suite_overrides)

        def record_time(name: str, seconds: float) -> None:
            times[name] = times.get(name, 0.0) + seconds
            write_text_atomic(times_path, json.dumps(times, indent=1) + "\n")

        for stage in plan.stages:
            if stage.name != "eval" and _finished(stage):
                typer.echo(f"{stage.name}: reused ({stage.folder}, made with the same settings)")
            else:
                if stage.name == "eval":  # before anything of the eval is written
                    checked = check_dev_untrained(plan.suite, suite, plan.recipe)
                    typer.echo(f"eval: {checked} dev questions, none in the training traces or questions")
                write_stamp(stage, done=False)
                if stage.name == "split":
                    start = time.perf_counter()
                    record = split_questions(data_root, out / "split", dev=dev, train=train, seed=seed)
                    record_time("split", time.perf_counter() - start)
                    typer.echo(f"split: dev {sum(map(len, record['dev'].values()))}, train "
                               f"{sum(map(len, record['train'].values()))} questions (seed {seed}; "
                               f"{out / 'split' / SPLIT_FILE})")
                else:
                    with cores_turn(stage.name) if stage.name in MODEL_STAGES else contextlib.nullcontext():
                        record_time(stage.name, run_stage(stage.name, commands[stage.name], logs, env))
                write_stamp(stage, done=True, **({"split_sha256": split_digest(out)} if stage.name == "split" else {}))
            if stage.name == stop_after:
                typer.echo(f"stopped after {stage.name} (--stop-after)")
                return None
        report = write_study_report(Path(plan.suite.out_dir) / "results.jsonl", out, times, systems=plan.systems,
                                    base=base, baseline=baseline, rl_systems=plan.rl_systems, dropped=plan.dropped,
                                    datasets=[spec.name for spec in plan.suite.datasets],
                                    split_digest=split_digest(out))
    typer.echo(f"\nstudy report: {report}")
    return report


def register(app: typer.Typer) -> None:
    @app.command("study")
    def study(
        recipe: str = typer.Argument("recipes/study/learning.yaml", help="The study's recipe (traces, SFT, RL)."),
        suite: str = typer.Argument("eval/suites/learning_study.yaml", help="The dev evaluation suite."),
        overrides: list[str] = typer.Argument(None, help="Suite overrides for the eval, e.g. datasets=[...]"),
        data_root: str = typer.Option("../shared/realdata", help="Where the QA sets are read (never copied)."),
        out: str = typer.Option("runs/learning-study", help="The study's folder (split, logs, STUDY.md); the recipe's "
                                "traces.questions must read <out>/split/train.jsonl."),
        dev: int = typer.Option(38, help="Dev questions per data set (never trained on)."),
        train: int = typer.Option(25, help="Train questions per data set."),
        seed: int = typer.Option(0, help="The split's seed."),
        rl: bool = typer.Option(False, "--rl", help="Also run the RL stage and evaluate the systems that serve its "
                                "adapters (without it they are dropped, with a line saying so)."),
        base: str = typer.Option(BASE, help="The suite's untrained system: each trained system is compared with it."),
        baseline: str = typer.Option(BASELINE, help="The suite's baseline: every other system is compared with it."),
        rebuild_from: str = typer.Option(None, help="Remove the stage folders this study made from this stage on "
                                         f"({', '.join(STAGE_ORDER)}) and make them again with this run's settings."),
        stop_after: str = typer.Option(None, help="Stop after this stage (e.g. train: adapters without the eval)."),
    ) -> None:
        """The learning study: split, traces, credit-filtered SFT (and RL), dev eval, paired intervals."""
        run_study(recipe, suite, overrides or [], data_root=data_root, out=Path(out), dev=dev, train=train,
                  seed=seed, rl=rl, base=base, baseline=baseline, rebuild_from=rebuild_from, stop_after=stop_after)
