"""The engine pool of an eval suite: engines shared by key, and an idle engine closed before one that would not fit
beside it on the GPUs starts (issue 35).

`RecordingEngines` is a named test double of `make_backend`: a real vLLM engine cannot be started here (and four
H100s cannot be faked into a CPU box), so each "engine" only records its start and close, in one shared log, and
answers every call with a fixed text. What it stands for is decided by the real code: the GPU share comes from the
recipe's backend (tensor_parallel_size x gpu_memory_utilization) through `maps_train.llm.pool.gpu_share`, the
routing from the real Router, the scheduling from the real `run_suite`.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from maps_train.errors import MapsTrainError
from maps_train.evaluate.suite import run_suite
from maps_train.llm.pool import ENGINE_CONTEXT_BYTES, EnginePool, gpu_share
from maps_train.llm.types import ChatRequest, Completion
from maps_train.recipe import BackendConfig, load_recipe


class RecordingEngines:
    """Test double of `make_backend(kind, model, routes, config)`: engines that log "start"/"close" with their
    model, in the order it happens."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, kind, model, routes, config):
        with self._lock:
            self.log.append(("start", model))
        return RecordedEngine(model, self)

    def record(self, event: str, model: str) -> None:
        with self._lock:
            self.log.append((event, model))


class RecordedEngine:
    concurrent = True

    def __init__(self, model: str, engines: RecordingEngines) -> None:
        self.model, self.engines, self.closed = model, engines, False

    def generate(self, requests, routes):
        assert not self.closed, f"{self.model}: called after close"
        return [Completion(text="fine", model=self.model) for _ in requests]

    def close(self) -> None:
        self.closed = True
        self.engines.record("close", self.model)


def recipe(model: str, tp: int = 1, util: float = 0.85, kind: str = "vllm", extra: tuple[str, ...] = ()):
    return load_recipe(None, [f"roles.default.backend={kind}", f"roles.default.model={model}",
                              f"backend.tensor_parallel_size={tp}", f"backend.gpu_memory_utilization={util}", *extra])


def use(pool: EnginePool, recipe_) -> None:
    """One run: lease the recipe's engines and make a call through them (which starts them)."""
    with pool.lease(recipe_) as router:
        assert router.generate([ChatRequest(role="answer", messages=[{"role": "user", "content": "q"}])])[0].text == "fine"


def test_gpu_share_is_tensor_parallel_size_times_utilization_and_context_and_nothing_on_cpu():
    config = BackendConfig(tensor_parallel_size=4, gpu_memory_utilization=0.85)
    footprint = 0.85 + ENGINE_CONTEXT_BYTES / 80e9  # its share and, outside it, its CUDA context
    assert gpu_share("vllm", config, on_gpu=True, gpu_bytes=80e9) == {0: footprint, 1: footprint, 2: footprint,
                                                                       3: footprint}
    assert gpu_share("vllm", config, on_gpu=False) == {}  # vLLM-CPU
    assert gpu_share("hf", config, on_gpu=True) == gpu_share("openai", config, on_gpu=True) == {}


def test_teacher_is_closed_before_a_student_that_would_not_fit_starts():
    engines = RecordingEngines()
    pool = EnginePool(factory=engines, on_gpu=True)
    use(pool, recipe("teacher", tp=4))
    use(pool, recipe("student", tp=1))
    assert engines.log == [("start", "teacher"), ("close", "teacher"), ("start", "student")]
    pool.close()
    assert engines.log[-1] == ("close", "student") and len(pool) == 0


def test_engines_that_fit_together_both_stay():
    engines = RecordingEngines()
    pool = EnginePool(factory=engines, on_gpu=True)
    use(pool, recipe("teacher", tp=4, util=0.4))
    use(pool, recipe("student", tp=1, util=0.4))
    use(pool, recipe("teacher", tp=4, util=0.4, extra=("agent.method=vanilla",)))  # back to the teacher: still open
    assert engines.log == [("start", "teacher"), ("start", "student")] and len(pool) == 2


def test_only_the_idle_engines_on_the_full_gpu_are_closed_least_recently_used_first():
    engines = RecordingEngines()
    pool = EnginePool(factory=engines, on_gpu=True)
    use(pool, recipe("a", util=0.3))
    use(pool, recipe("b", util=0.3))
    use(pool, recipe("wide", tp=2, util=0.3))  # GPU 0: 0.9, GPU 1: 0.3
    use(pool, recipe("c", util=0.3))  # 1.2 on GPU 0: one engine must go, the least recently used
    assert engines.log[3:] == [("close", "a"), ("start", "c")]


def test_systems_on_the_same_engine_share_it():
    engines = RecordingEngines()
    pool = EnginePool(factory=engines, on_gpu=True)
    use(pool, recipe("teacher", tp=4))
    use(pool, recipe("teacher", tp=4, extra=("agent.method=vanilla",)))
    assert engines.log == [("start", "teacher")] and len(pool) == 1
    use(pool, recipe("teacher", tp=4, extra=("roles.default.enable_thinking=true",)))
    assert engines.log[1:] == [("close", "teacher"), ("start", "teacher")]  # another parser: another engine


def test_an_engine_in_use_is_not_closed_the_new_one_waits_for_it():
    engines = RecordingEngines()
    pool = EnginePool(factory=engines, on_gpu=True)
    student_done = threading.Event()

    def student() -> None:
        use(pool, recipe("student"))
        student_done.set()

    with pool.lease(recipe("teacher", tp=4)) as router:
        router.generate([ChatRequest(role="answer", messages=[{"role": "user", "content": "q"}])])
        thread = threading.Thread(target=student, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60  # bounds a failure only: the student's lease must come to wait
        while pool.waiting != 1:
            assert time.monotonic() < deadline and not student_done.is_set(), "the student did not wait"
            time.sleep(0.01)
        assert engines.log == [("start", "teacher")]  # waiting, nothing closed, nothing started
        router.generate([ChatRequest(role="answer", messages=[{"role": "user", "content": "q"}])])  # still open
    thread.join(timeout=60)
    assert student_done.is_set()
    assert engines.log == [("start", "teacher"), ("close", "teacher"), ("start", "student")]


@pytest.mark.parametrize("teacher_kind, on_gpu", [("hf", True), ("vllm", False)], ids=["hf", "vllm-cpu"])
def test_cpu_engines_are_never_freed_early(teacher_kind, on_gpu):
    engines = RecordingEngines()
    pool = EnginePool(factory=engines, on_gpu=on_gpu)
    use(pool, recipe("teacher", tp=4, util=0.85, kind=teacher_kind))
    use(pool, recipe("student", tp=1))
    assert engines.log == [("start", "teacher"), ("start", "student")]
    pool.close()
    assert sorted(engines.log[2:]) == [("close", "student"), ("close", "teacher")]


def test_engines_that_cannot_fit_even_alone_are_a_one_line_error():
    pool = EnginePool(factory=RecordingEngines(), on_gpu=True)
    two_models = recipe("m1", extra=("roles.proposer.backend=vllm", "roles.proposer.model=m2"))
    with pytest.raises(MapsTrainError) as err:
        use(pool, two_models)
    assert "vllm:m1 at 0.85 of GPU 0, vllm:m2 at 0.85 of GPU 0) do not fit" in str(err.value)
    assert "\n" not in str(err.value)
    assert len(pool) == 0


def test_two_engines_whose_shares_sum_to_one_are_refused_on_one_gpu_and_placed_on_two(monkeypatch):
    """Issue 63: vLLM starts an engine only where the free memory, read after its own CUDA context is up, is at
    least gpu_memory_utilization x total. 0.45 + 0.55 of one 80 GB GPU "fits" by shares alone, but the second
    engine would find 0.55 x 80 GB less two contexts free and refuse: the pool refuses first, saying why. On two
    GPUs each gets its own."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pair = ("roles.proposer.backend=vllm", "roles.proposer.model=m2")
    one = EnginePool(factory=RecordingEngines(), on_gpu=True, gpus=1, gpu_bytes=80e9)
    with pytest.raises(MapsTrainError) as err:
        use(one, recipe("m1", util=0.5, extra=pair))  # 0.5 + 0.5: the shares alone sum to exactly 1.0
    message = str(err.value)
    assert "vllm:m1 at 0.5 of GPU 0, vllm:m2 at 0.5 of GPU 0) do not fit" in message and "\n" not in message
    assert "free memory is at least its gpu_memory_utilization" in message and "CUDA context (1 GB)" in message
    assert len(one) == 0
    two = PlacedEngines()
    pool = EnginePool(factory=two, on_gpu=True, gpus=2, gpu_bytes=80e9)
    with pool.lease(recipe("m1", util=0.5, extra=pair)) as router:
        router.generate([ChatRequest(role=role, messages=[{"role": "user", "content": "q"}])
                         for role in ("answer", "proposer")])
    assert two.visible == {"m1": "0", "m2": "1"}
    # the 0.45 + 0.55 of the issue, as two systems on one GPU: the second closes the first before it starts
    engines = RecordingEngines()
    pool = EnginePool(factory=engines, on_gpu=True, gpus=1, gpu_bytes=80e9)
    use(pool, recipe("m1", util=0.45))
    use(pool, recipe("m2", util=0.55))
    assert engines.log == [("start", "m1"), ("close", "m1"), ("start", "m2")]
    # and room for both contexts is room: 0.45 + 0.5 leaves 4 GB for two 1 GB contexts
    engines = RecordingEngines()
    pool = EnginePool(factory=engines, on_gpu=True, gpus=1, gpu_bytes=80e9)
    use(pool, recipe("m1", util=0.45))
    use(pool, recipe("m2", util=0.5))
    assert engines.log == [("start", "m1"), ("start", "m2")]


def write_suite(tmp_path: Path, systems: str, parallel_runs: int = 1) -> Path:
    """Two small data sets, a teacher (tp 4) and a student (tp 1) recipe at 0.85, and a suite of `systems`."""
    for name, split in (("nq", "test"), ("hotpotqa", "dev")):
        data = tmp_path / "data" / name
        data.mkdir(parents=True)
        (data / f"{split}.jsonl").write_text("".join(
            json.dumps({"id": f"{name}{i}", "question": f"who wrote book {i}", "golden_answers": ["fine"]}) + "\n"
            for i in range(3)))
    for name, tp in (("teacher", 4), ("student", 1)):
        (tmp_path / f"{name}.yaml").write_text(
            f"name: {name}\nroles:\n  default: {{backend: vllm, model: {name}}}\n"
            f"backend: {{tensor_parallel_size: {tp}, gpu_memory_utilization: 0.85}}\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"""name: placement
out_dir: {tmp_path / 'out'}
data_root: {tmp_path / 'data'}
parallel_runs: {parallel_runs}
datasets: [{{name: nq}}, {{name: hotpotqa}}]
systems:
{systems}
wandb: {{enabled: false}}
""")
    return suite


def scripted(recipe_, questions, out_dir, backend, progress=True):
    """The agent's contract, one call per question through the leased router."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    answers = backend.generate([ChatRequest(role="answer", messages=[{"role": "user", "content": q.question}],
                                            question_id=q.id) for q in questions])
    return [{"question_id": q.id, "answer": a.text} for q, a in zip(questions, answers)]


def test_suite_closes_the_teacher_before_the_student_that_would_not_fit_beside_it(tmp_path):
    suite = write_suite(tmp_path, "  - {name: teacher_maps, recipe: teacher.yaml}\n"
                                  "  - {name: student, recipe: student.yaml}")
    engines = RecordingEngines()
    pool = EnginePool(factory=engines, on_gpu=True)
    outcome = run_suite(suite, runner=scripted, engines=pool, progress=False)
    assert outcome.scored == 12 and outcome.unanswered == 0
    assert engines.log == [("start", "teacher"), ("close", "teacher"), ("start", "student")]
    pool.close()
    assert engines.log[-1] == ("close", "student")


def test_parallel_runs_of_two_engines_on_one_model_wait_for_each_other(tmp_path):
    """think and nothink run the same model on two engines (the reasoning parser is engine-wide): the suite puts
    their four runs in one wave; the second engine waits for the first system's runs instead of overfilling GPU 0."""
    suite = write_suite(tmp_path, "  - {name: think, recipe: teacher.yaml, overrides: [roles.default.enable_thinking=true]}\n"
                                  "  - {name: nothink, recipe: teacher.yaml}", parallel_runs=4)
    engines = RecordingEngines()
    pool = EnginePool(factory=engines, on_gpu=True)
    first: list[str] = []
    lock = threading.Lock()

    def held_until_the_others_wait(recipe_, questions, out_dir, backend, progress=True):
        """The first system's two runs keep their leases until both are in and both runs of the other system
        wait for theirs (so the schedule is the same whichever thread leases first)."""
        system = Path(out_dir).parent.name
        with lock:
            first[:] = first or [system]
            first.append(system)  # first[1:]: the runs that got their lease, in order
        deadline = time.monotonic() + 60  # bounds a failure only
        while system == first[0] and (pool.waiting != 2 or first[1:].count(system) != 2):
            assert time.monotonic() < deadline, "the other system's runs did not wait"
            time.sleep(0.01)
        return scripted(recipe_, questions, out_dir, backend, progress)

    outcome = run_suite(suite, runner=held_until_the_others_wait, engines=pool, progress=False)
    assert outcome.scored == 12 and outcome.unanswered == 0
    assert [event for event, _ in engines.log] == ["start", "close", "start"]  # one engine open at a time


class PlacedEngines(RecordingEngines):
    """`RecordingEngines` that also record the CUDA_VISIBLE_DEVICES each engine was started under."""

    def __init__(self) -> None:
        super().__init__()
        self.visible: dict[str, str | None] = {}

    def __call__(self, kind, model, routes, config):
        import os

        self.visible[model] = os.environ.get("CUDA_VISIBLE_DEVICES")
        return super().__call__(kind, model, routes, config)


def test_engines_are_packed_onto_free_gpus_and_run_side_by_side(monkeypatch):
    """Issue 47: on an 8-GPU node the teacher (tensor parallel 4 at 0.85) takes GPUs 0-3 and, while it runs, a
    student (tp 1 at 0.85) starts on GPU 4 and another on GPU 5, each under CUDA_VISIBLE_DEVICES naming its GPUs,
    instead of waiting for GPU 0 (what `distill.yaml` did: GPUs 4-7 idle). Already restricted GPUs are mapped
    through. An engine with no room beside the running ones still waits for them (tested above)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    engines = PlacedEngines()
    pool = EnginePool(factory=engines, on_gpu=True, gpus=8)
    with pool.lease(recipe("teacher-32b", tp=4)) as teacher:
        teacher.generate([ChatRequest(role="answer", messages=[{"role": "user", "content": "q"}])])
        use(pool, recipe("student-4b"))
        with pool.lease(recipe("student-1.7b")) as student:
            student.generate([ChatRequest(role="answer", messages=[{"role": "user", "content": "q"}])])
    assert engines.visible == {"teacher-32b": "0,1,2,3", "student-4b": "4", "student-1.7b": "5"}
    assert ("close", "teacher-32b") not in engines.log and pool.waiting == 0
    assert "CUDA_VISIBLE_DEVICES" not in __import__("os").environ  # restored after each start

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,4,5,6,7,8,9")
    mapped = PlacedEngines()
    pool = EnginePool(factory=mapped, on_gpu=True, gpus=8)
    use(pool, recipe("teacher-32b", tp=4))
    assert mapped.visible == {"teacher-32b": "2,3,4,5"}
    # an engine needing all 8 GPUs does not fit beside the idle teacher: the teacher is closed first
    use(pool, recipe("wide", tp=8, util=0.5))
    assert mapped.log[-2:] == [("close", "teacher-32b"), ("start", "wide")]
    assert mapped.visible["wide"] == "2,3,4,5,6,7,8,9"
