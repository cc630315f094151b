"""`maps-train demo`: the whole pipeline on the embedded demo world, offline, on CPU.

The demo adds data (`data/demo`, committed; `data/demo/demo_world.py` regenerates it) and a recipe (`recipes/demo/demo.yaml`),
not code paths: it resolves the recipe and the suite into its output folder and runs, one after another, the
commands a user runs, printing each one so any step can be rerun by hand:

    maps-train serve R --adapters-later        one vLLM server for the whole demo (background: it starts while the
                                               index builds and the traces command starts up; the teacher's first
                                               request waits for it): the student base, LoRA slots for the adapters
    maps-train index build --recipe R          MiniLM + FAISS over the demo corpus
    maps-train traces R                        the teacher (SmolLM2 through that server, constrained decoding)
    maps-train sft-data R                      parsed traces (correct or not) -> one TRL set per role
    maps-train train R --role all              three LoRA adapters, each under `accelerate launch` (2 processes)
    maps-train load-adapters R                 the three adapters into the running server
    maps-train eval S                          teacher vs distilled vs baselines on the test questions

The demo's teacher is the student base (the only real instruct model that installs offline), so one server holds
it for the teacher's traces and, once the adapters are loaded into it, for every system of the evaluation: one
vLLM start instead of two (an engine start is the slowest start-up: see docs/throughput.md).

Every step resumes, so a rerun continues where a killed demo stopped. The end writes `REPORT.md` (the eval table,
per-role parse rates without constrained decoding before and after the adapters, student vs teacher) and prints
where each artefact is.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import typer

from maps_train.errors import MapsTrainError

DEMO_RECIPE = "recipes/demo/demo.yaml"
DEMO_SUITE = "eval/suites/demo.yaml"
# A shortened run for tests and a first look: a few questions, one round, two training steps.
QUICK_OVERRIDES = ["traces.limit=6", "agent.max_rounds=1", "train.sft.max_steps=2"]
QUICK_SAMPLE = 3
# Where the OpenAI client finds its key when backend.api_key is empty (maps_train.llm.openai_backend.api_key).
KEY_VARIABLE = "OPENAI_API_KEY"
# Seconds per step of the full run on a 2-core Zen 4 (the README's quick start); the quick run's are estimates from
# them (each step's share of the work plus its start-up: no quick run was timed alone there). Only proportions are
# used: a step's expected time here is its reference times this machine's pace so far, on generation steps
# (traces, eval: the server) or on the others.
PACE_REFERENCE_S = {
    False: {"index": 23, "traces": 115, "sft-data": 11, "train": 165, "load-adapters": 3, "eval": 240},
    True: {"index": 23, "traces": 45, "sft-data": 11, "train": 75, "load-adapters": 3, "eval": 110},
}
GENERATION_STEPS = ("traces", "eval")


def _environment() -> dict[str, str]:
    from maps_train.platform import apply_runtime_defaults

    return apply_runtime_defaults(dict(os.environ), offline=True)


NOISY = ("INFO", "WARNING", "DEBUG", "(EngineCore", "(Worker", "(VllmWorker", "[rank", "warn", "Loading", "Triton",
         "[W", "Warning:")


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "maps_train.cli", *args]


def _run_step(title: str, args: list[str], log_dir: Path, env: dict[str, str], server: ServerWatch | None = None,
              kind: str = "demo step") -> float:
    """Run one maps-train command, its output teed to <log_dir>/<step>.log; a failure names the `kind`, the step and
    the log. With `server`, the step is stopped if the demo's server dies under it (its failure then names the
    server's log)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{title.split()[0]}.log"
    typer.echo(f"\n==> {title}\n$ maps-train {shlex.join(args)}")
    start = time.perf_counter()
    with log.open("a") as handle:
        process = subprocess.Popen(_command(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        if server is not None:
            server.step = process
        assert process.stdout is not None
        for line in process.stdout:
            handle.write(line)
            if _worth_showing(line):
                typer.echo("    " + line.rstrip()[:160])
        code = process.wait()
    elapsed = time.perf_counter() - start
    if server is not None:
        server.step = None
        server.raise_if_dead()
    if code != 0:
        raise MapsTrainError(f"{kind} '{title}' failed (exit {code}); see {log}")
    typer.echo(f"    done in {elapsed:.0f}s (log: {log})")
    return elapsed


def expected_s(timings: dict[str, float], quick: bool) -> dict[str, float]:
    """The steps still to run and how long each should take here: its reference time times this machine's pace
    (seconds taken over reference seconds) on the steps of its kind done so far, else on all steps done."""
    reference = PACE_REFERENCE_S[quick]
    done = [step for step in reference if step in timings]
    if not done:
        return {}

    def pace(steps: list[str]) -> float:
        return sum(timings[s] for s in steps) / sum(reference[s] for s in steps)

    expected = {}
    for step in (s for s in reference if s not in timings):
        kind = [s for s in done if (s in GENERATION_STEPS) == (step in GENERATION_STEPS)]
        expected[step] = reference[step] * pace(kind or done)
    return expected


def say_expected(timings: dict[str, float], quick: bool) -> None:
    rest = expected_s(timings, quick)
    if rest:
        steps = ", ".join(f"{step} ~{seconds:.0f}s" for step, seconds in rest.items())
        typer.echo(f"    expected here, at this machine's pace so far: {steps} (about {sum(rest.values()) / 60:.0f} "
                   "min to go)")


def _worth_showing(line: str) -> bool:
    """Our own progress and results, not vLLM's or transformers' chatter (the step log keeps everything)."""
    text = line.strip()
    if not text or any(token in line for token in NOISY):
        return False
    return not line.startswith((" ", "\t"))  # continuation lines of warnings and tracebacks


def keys_to_environment(extra: list[str]) -> tuple[list[str], dict[str, str]]:
    """The demo writes its overrides into recipe.yaml, which every step reads, so a key must not be one of them:
    `backend.api_key=K` is taken out and handed to the steps as $OPENAI_API_KEY, which the client reads when
    backend.api_key is empty. Any other override that holds a secret (`serve.extra_args=[--api-key, K]`, a URL's
    password) has no such way around the file and is refused. Returns (the other overrides, the steps' variables)."""
    from maps_train.config.overlays import parse_override
    from maps_train.config.redaction import redact_secrets

    overrides, variables = [], {}
    for override in extra:
        keys, value = parse_override(override)  # the value as the recipe would read it (YAML: quotes come off)
        if keys == ["backend", "api_key"]:
            variables[KEY_VARIABLE] = "" if value is None else str(value)
        elif redact_secrets(override) != override:
            raise MapsTrainError(
                f"demo: the override {redact_secrets(override)!r} holds a secret, and the demo writes its overrides "
                f"into recipe.yaml: set it in the environment instead ({KEY_VARIABLE} for the client, VLLM_API_KEY "
                "for vllm serve)"
            )
        else:
            overrides.append(override)
    return overrides, {name: value for name, value in variables.items() if value}


def prepare(out: Path, quick: bool, extra: list[str],
            server_wait_s: float = 600.0) -> tuple[Path, Path, dict[str, str]]:
    """The resolved recipe and suite the demo's commands run on, written into `out`, and the environment
    variables the steps need beside them (a key given as `backend.api_key=`: see `keys_to_environment`)."""
    from maps_train.config.yaml_io import dump_yaml, to_dict
    from maps_train.evaluate.suite import load_suite
    from maps_train.recipe import load_recipe

    if not Path("data/demo/corpus.jsonl").is_file():
        raise MapsTrainError("data/demo/corpus.jsonl not found: run `maps-train demo` from the repository root")
    extra, variables = keys_to_environment(extra)
    overrides = [
        f"retrieval.index_dir={out / 'index'}", f"traces.out_dir={out / 'traces'}",
        f"sft_data.traces_dir={out / 'traces'}", f"sft_data.out_dir={out / 'sft'}",
        f"train.sft_dir={out / 'sft'}", f"train.output_dir={out / 'adapters'}", f"wandb.dir={out / 'wandb'}",
    ]
    overrides += (QUICK_OVERRIDES if quick else []) + extra
    recipe = load_recipe(DEMO_RECIPE, overrides)
    # The teacher's routes go to the demo's one server (see the module docstring).
    url = f"http://{recipe.serve.host}:{recipe.serve.port}/v1"
    server_routes = [f"backend.base_urls=[{url}]", f"backend.server_wait_s={server_wait_s}"]
    server_routes += [f"roles.{role}.backend=openai" for role in recipe.roles]
    recipe = load_recipe(DEMO_RECIPE, overrides + server_routes)
    out.mkdir(parents=True, exist_ok=True)
    recipe_path = out / "recipe.yaml"
    header = f"# resolved from {DEMO_RECIPE} by `maps-train demo`\n"
    if KEY_VARIABLE in variables:
        header += f"# backend.api_key: from ${KEY_VARIABLE} (the demo sets it for each step; never written here)\n"
    recipe_path.write_text(header + dump_yaml(recipe))

    suite = load_suite(DEMO_SUITE, [f"out_dir={out / 'eval'}", f"wandb.dir={out / 'wandb'}"])
    raw = to_dict(suite)
    for system in raw["systems"]:
        system["recipe"] = str(recipe_path)
        system["overrides"] = [o if not o.startswith("backend.base_urls=") else f"backend.base_urls=[{url}]"
                               for o in system["overrides"]]
    if quick:
        for dataset in raw["datasets"]:
            dataset["sample"] = QUICK_SAMPLE
    suite_path = out / "suite.yaml"
    suite_path.write_text(f"# resolved from {DEMO_SUITE} by `maps-train demo`\n" + dump_yaml(raw))
    return recipe_path, suite_path, variables


class ServerWatch:
    """The demo's `maps-train serve --adapters-later`, started in the background before the index build. The steps
    do not wait for it: the teacher's requests wait for its /health (`backend.server_wait_s`), so the server starts
    while the index builds and the traces command starts up. A thread notes when it answers and, should it die,
    stops the step running on it."""

    def __init__(self, recipe_path: Path, log_dir: Path, env: dict[str, str], port: int, host: str):
        log_dir.mkdir(parents=True, exist_ok=True)
        args = ["serve", str(recipe_path), "--adapters-later", "--log", str(log_dir / "serve-vllm.log")]
        typer.echo(f"\n==> serve (background: starting while the index builds and the traces start up)\n"
                   f"$ maps-train {shlex.join(args)}")
        self.log = log_dir / "serve.log"
        self.health = f"http://{host}:{port}/health"
        self.started = time.perf_counter()
        self.healthy_after_s: float | None = None
        self.step: subprocess.Popen | None = None
        self.stopping = False
        from maps_train.serve.server import start_process_group

        with self.log.open("a") as handle:  # a demo killed outright takes its server down with it
            self.process = start_process_group(_command(*args), stdout=handle, stderr=subprocess.STDOUT, env=env)
        threading.Thread(target=self._watch, daemon=True, name="demo-server-watch").start()

    def _watch(self) -> None:
        import httpx

        while not self.stopping:
            if self.process.poll() is not None:
                step = self.step
                if step is not None and step.poll() is None:
                    step.terminate()
                return
            if self.healthy_after_s is None:
                try:
                    if httpx.get(self.health, timeout=2.0).status_code == 200:
                        self.healthy_after_s = time.perf_counter() - self.started
                        typer.echo(f"    (server healthy at {self.health} after {self.healthy_after_s:.0f}s)")
                except httpx.HTTPError:
                    pass
            time.sleep(0.5)

    def raise_if_dead(self) -> None:
        if self.process.poll() is not None and not self.stopping:
            raise MapsTrainError(f"demo step 'serve' exited with code {self.process.returncode}; see {self.log}")

    def stop(self) -> None:
        """SIGTERM, which `maps-train serve` handles as it does Ctrl-C (it stops vLLM's process group, then exits).
        Not SIGINT: a demo started in the background of a script or CI job inherits SIGINT ignored, and so does its
        server, which then sat out the grace period and was killed without stopping vLLM."""
        from maps_train.serve.server import stop_process_group

        self.stopping = True
        stop_process_group(self.process, grace_s=60)


def role_parse_rates(eval_dir: Path, system: str) -> dict[str, tuple[int, int]]:
    """role -> (calls whose output parsed, calls) over a system's answers."""
    from maps_train.records import AnswerRecord, KeyedJsonl

    rates: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for path in sorted((eval_dir / "runs" / system).glob("*/answers.jsonl")):
        for key, row in KeyedJsonl(path).load(repair=False).items():
            record = AnswerRecord.from_dict(row, f"{path}: question {key}")
            for role, usage in record.cost.by_role.items():
                rates[role][1] += usage.calls
                rates[role][0] += usage.calls - record.parse_failures.get(role, 0)
    return {role: (ok, total) for role, (ok, total) in rates.items()}


def _system_totals(eval_dir: Path) -> dict[str, dict[str, float]]:
    from maps_train.evaluate.results import read_results

    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in read_results(eval_dir / "results.jsonl"):
        system = totals[row["system"]]
        system["n"] += 1
        system["cover_em"] += row.get("cover_em") or 0.0
        system["em"] += row.get("em") or 0.0
        system["words"] += row.get("answer_words") or 0
        system["flops"] += row.get("compute_flops") or 0.0
        system["tokens"] += (row["cost"].get("prompt_tokens", 0) + row["cost"].get("completion_tokens", 0))
    return totals


# (base, distilled) pairs of the demo suite: the same decoding, without and with the role adapters
LEARNING_PAIRS = (("teacher_maps", "distilled_maps"), ("student_base_free", "distilled_free"))


def learning_lines(eval_dir: Path) -> list[str]:
    """What the adapters teach the agent's search: evidence recall and rounds, base against distilled, on the same
    questions, with paired bootstrap intervals (`evaluate.paired`)."""
    from maps_train.evaluate.paired import comparison_table
    from maps_train.evaluate.results import read_results

    path = eval_dir / "results.jsonl"
    if not path.is_file():
        return []
    table = comparison_table(read_results(path), LEARNING_PAIRS,
                             ["evidence_recall", "evidence_recall_seen", "rounds", "retrievals", "em"])
    return ["", "## What the adapters teach: the search, base -> distilled", "",
            "The same questions and decoding, without and with the role adapters (teacher_maps is the student base",
            "under constrained decoding); 95% paired bootstrap intervals.", "", table]


def write_report(out: Path, timings: dict[str, float]) -> Path:
    eval_dir = out / "eval"
    lines = ["# maps-train demo report", "",
             "Toy scale: a 135M teacher distilled into adapters on the same 135M base, an invented world of 258",
             "passages. The figures show the pipeline working end to end and what the adapters teach the student",
             "(the role formats), not what a Qwen3-32B teacher and a Qwen3-4B student would reach.", ""]
    table = eval_dir / "report.md"
    if table.is_file():
        lines += ["## Evaluation (maps-train eval)", "", table.read_text().strip(), ""]
    totals = _system_totals(eval_dir)
    lines += ["## Student vs teacher", "", "| system | questions | Cover-EM | EM | words/answer | tokens/question | "
              "compute (GFLOP)/question |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, t in totals.items():
        n = max(t["n"], 1)
        lines.append(f"| {name} | {int(t['n'])} | {t['cover_em'] / n:.3f} | {t['em'] / n:.3f} | {t['words'] / n:.1f} | "
                     f"{t['tokens'] / n:.0f} | {t['flops'] / n / 1e9:.1f} |")
    before, after = role_parse_rates(eval_dir, "student_base_free"), role_parse_rates(eval_dir, "distilled_free")
    lines += ["", "## What the adapters teach: role outputs that parse without constrained decoding", "",
              "| role | student base (no adapter) | distilled (role adapter) |", "|---|---:|---:|"]
    for role in sorted(set(before) | set(after)):
        cells = []
        for rates in (before, after):
            ok, total = rates.get(role, (0, 0))
            cells.append(f"{ok}/{total} ({100 * ok / total:.0f}%)" if total else "-")
        lines.append(f"| {role} | {cells[0]} | {cells[1]} |")
    lines += learning_lines(eval_dir)
    lines += ["", "## Time per step (s)", "", "| step | seconds |", "|---|---:|"]
    lines += [f"| {step} | {seconds:.0f} |" for step, seconds in timings.items()]
    report = out / "REPORT.md"
    report.write_text("\n".join(lines) + "\n")
    return report


def run_demo(out: Path, quick: bool = False, extra: list[str] | None = None, server_timeout_s: float = 600.0) -> Path:
    """The whole pipeline into `out`; the teacher's first request waits up to `server_timeout_s` for the server."""
    env = _environment()
    logs = out / "logs"
    recipe_path, suite_path, variables = prepare(out, quick, extra or [], server_timeout_s)
    env.update(variables)
    if KEY_VARIABLE in variables:
        typer.echo(f"backend.api_key: given to each step as ${KEY_VARIABLE}, not written to {recipe_path} "
                   "(export it to rerun a step by hand)")
    recipe = str(recipe_path)
    timings: dict[str, float] = {}
    from maps_train.recipe import load_recipe
    from maps_train.serve.server import ensure_port_free

    serve = load_recipe(recipe).serve
    # `maps-train serve` checks the port too, but only after its own start-up; the steps poll /health from the
    # start, and would take another server's answer (and send it the teacher's requests) before then.
    ensure_port_free(serve.host, serve.port)
    server = ServerWatch(recipe_path, logs, env, serve.port, serve.host)
    steps = [  # (timing key, title, command, on the server)
        ("index", "index build", ["index", "build", "--recipe", recipe], True),
        ("traces", "traces (teacher MAPS runs)", ["traces", recipe], True),
        ("sft-data", "sft-data", ["sft-data", recipe], False),
        ("train", "train (3 adapters, accelerate launch)", ["train", recipe, "--role", "all"], False),
        ("load-adapters", "load-adapters (into the server)", ["load-adapters", recipe], True),
        ("eval", "eval (teacher, distilled, baselines)", ["eval", str(suite_path)], True),
    ]
    try:
        for key, title, args, on_server in steps:
            timings[key] = _run_step(title, args, logs, env, server if on_server else None)
            say_expected(timings, quick)
    finally:
        server.stop()
    if server.healthy_after_s is not None:
        timings["(serve start, in the background)"] = server.healthy_after_s
    report = write_report(out, timings)
    artefacts = {
        "recipe (resolved)": recipe_path, "index": out / "index", "teacher traces": out / "traces",
        "SFT sets": out / "sft", "adapters": out / "adapters", "eval results": out / "eval" / "results.jsonl",
        "eval tables": out / "eval" / "report.md", "Cover-EM vs cost plot": out / "eval" / "cover_em_vs_cost.png",
        "W&B offline runs": out / "wandb", "report": report, "logs": logs,
    }
    typer.echo("\n==> artefacts")
    for name, path in artefacts.items():
        typer.echo(f"  {name:24s} {path}")
    typer.echo(f"\n{report.read_text()}")
    return report


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        out: str = typer.Option("runs/demo", help="Output folder (every step resumes from it)."),
        quick: bool = typer.Option(False, "--quick", help="A shortened run: 6 train and 3 test questions, 2 steps."),
        overrides: list[str] = typer.Argument(None, help="Dotted recipe overrides, e.g. traces.limit=30"),
    ) -> None:
        """The whole pipeline on the embedded demo world, offline on CPU: index, teacher traces, SFT sets, three
        LoRA adapters, vLLM multi-LoRA serving, eval against the teacher and baselines, report."""
        run_demo(Path(out), quick=quick, extra=overrides or [])
