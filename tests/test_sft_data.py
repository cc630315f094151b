"""Traces -> per-adapter SFT sets: filtering, TRL prompt-completion rows, statistics, bad lines named by line."""

from __future__ import annotations

import json

import pytest
from scripted_backend import RecordingRetriever, ScriptedBackend, consolidator_sufficient_after

from maps_train.errors import MapsTrainError
from maps_train.recipe import load_recipe
from maps_train.traces.collect import collect_traces, run_dirs
from maps_train.traces.sft import build_sft_sets


def write_questions(path, n):
    rows = [{"id": f"q{i}", "question": f"Who is q{i}?", "golden_answers": [f"answer of q{i}" if i % 2 == 0 else "x"]}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def traced(tmp_path):
    """Real trace files written by the MAPS engine (scripted backend: answers right for even questions)."""
    questions = tmp_path / "train.jsonl"
    write_questions(questions, 4)
    recipe = load_recipe(None, [
        f"traces.questions=[{questions}]", f"traces.out_dir={tmp_path / 'traces'}",
        f"sft_data.traces_dir={tmp_path / 'traces'}", f"sft_data.out_dir={tmp_path / 'sft'}",
        "sft_data.tokenizer=null", "train.student=builtin:tiny-qwen3", "agent.num_directions=2",
    ])
    totals = collect_traces(recipe, backend=ScriptedBackend({"consolidator": consolidator_sufficient_after(2)}),
                            retriever=RecordingRetriever(), progress=False)
    assert totals["questions"] == 4 and totals["calls"] > 0
    return recipe, tmp_path


def test_sft_sets_keep_correct_traces_as_prompt_completion_rows(traced):
    recipe, tmp_path = traced
    stats = build_sft_sets(recipe)
    assert stats.traces == 4 and stats.kept_traces == 2 and stats.rejects["incorrect_answer"] == 2
    # 2 kept traces x 2 rounds: proposer 1 call/round, writer 2 calls/round, consolidator 1/round + the answer call.
    assert stats.examples == {"proposer": 4, "writer": 8, "consolidator": 6}
    rows = [json.loads(line) for line in (tmp_path / "sft" / "writer" / "train.jsonl").read_text().splitlines()]
    row = rows[0]
    assert set(row) == {"prompt", "completion", "chat_template_kwargs", "question_id", "role"}
    assert row["prompt"][-1]["role"] == "user" and row["completion"][0]["role"] == "assistant"
    assert json.loads(row["completion"][0]["content"])["query"].startswith("lookup")
    assert row["chat_template_kwargs"] == {"enable_thinking": False}
    consolidator_roles = {json.loads(line)["role"] for line in (tmp_path / "sft" / "consolidator" / "train.jsonl").open()}
    assert consolidator_roles == {"consolidator", "answer"}
    saved = json.loads((tmp_path / "sft" / "stats.json").read_text())
    assert saved["examples"]["writer"] == 8 and saved["prompt_tokens"]["writer"] > 0


def test_length_caps_and_real_token_counts(traced, tiny_qwen3):
    recipe, _ = traced
    from dataclasses import replace

    capped = replace(recipe, sft_data=replace(recipe.sft_data, tokenizer=tiny_qwen3, max_completion_tokens=5))
    stats = build_sft_sets(capped)
    assert stats.rejects["completion_too_long"] > 0
    assert sum(stats.examples.values()) < 18


def test_bad_trace_lines_name_the_line_and_can_be_skipped(traced):
    recipe, tmp_path = traced
    (_, out_dir, _), = run_dirs(recipe)
    path = out_dir / "traces.jsonl"
    lines = path.read_text().splitlines()
    wrong_version = json.loads(lines[0]) | {"schema_version": 99}
    missing = json.loads(lines[2])
    del missing["rounds"]
    lines[0] = json.dumps(wrong_version)
    lines[2] = json.dumps(missing)
    lines.append(lines[1][: len(lines[1]) // 2])  # a truncated line
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(MapsTrainError, match=rf"{path}:1: schema_version: 99 is not supported"):
        build_sft_sets(recipe)
    stats = build_sft_sets(recipe, skip_bad_lines=True)
    assert stats.rejects["bad_line"] == 3
    assert any(f"{path}:3: rounds: required field is missing" in line for line in stats.bad_lines)
    assert any(f"{path}:5: invalid JSON" in line for line in stats.bad_lines)
    assert stats.traces == 2 and stats.kept_traces == 0  # lines 2 and 4 hold q1 and q3, both answered wrong


def test_several_samples_get_distinct_seeds_and_folders(tmp_path):
    from maps_train.traces.collect import sample_recipe

    recipe = load_recipe(None, ["traces.samples_per_question=3", "traces.sample_temperature=0.8", "traces.seed=5",
                                f"traces.questions=[{tmp_path / 'a' / 'train.jsonl'}]"])
    dirs = run_dirs(recipe)
    assert [d.name for _, d, _ in dirs] == ["sample-0", "sample-1", "sample-2"]
    sampled = sample_recipe(recipe, 2)
    assert sampled.roles == recipe.roles  # sampling travels on the requests now (tests/test_sampling.py)
    assert (sampled.agent.sampling.temperature, sampled.agent.sampling.seed, sampled.agent.sampling.sample) == (0.8, 5, 2)


def test_eval_fraction_holds_out_whole_questions_seeded(tmp_path):
    """A seeded share of the kept questions goes to eval.jsonl, every row of each in every adapter: no question
    is on both sides, for any role; the same seed gives the same split, and a set without eval drops a stale one."""
    questions = tmp_path / "train.jsonl"
    write_questions(questions, 20)
    overrides = [f"traces.questions=[{questions}]", f"traces.out_dir={tmp_path / 'traces'}",
                 "sft_data.tokenizer=null", "sft_data.require_correct=false", "agent.num_directions=2"]
    recipe = load_recipe(None, [*overrides, "sft_data.eval_fraction=0.25", "sft_data.eval_seed=3"])
    collect_traces(recipe, backend=ScriptedBackend({"consolidator": consolidator_sufficient_after(1)}),
                   retriever=RecordingRetriever(), progress=False)
    stats = build_sft_sets(recipe)
    from maps_train.recipe import sft_set_dir

    out = sft_set_dir(recipe)
    assert out.parent == tmp_path / "traces" / "sft"  # the default: under the teacher's traces, keyed by settings

    def split(adapter, name):
        return [json.loads(line) for line in (out / adapter / f"{name}.jsonl").read_text().splitlines()]

    held_out = {row["question_id"] for row in split("writer", "eval")}
    assert stats.eval_questions == len(held_out) == 5  # 25% of 20 kept questions
    for adapter in ("proposer", "writer", "consolidator"):
        train_ids = {row["question_id"] for row in split(adapter, "train")}
        eval_ids = {row["question_id"] for row in split(adapter, "eval")}
        assert eval_ids == held_out and not train_ids & eval_ids and len(train_ids) == 15
        assert stats.eval_examples[adapter] == len(split(adapter, "eval"))
    settings = json.loads((out / "settings.json").read_text())
    assert settings["eval_fraction"] == 0.25 and settings["eval_seed"] == 3

    again = build_sft_sets(recipe, out_dir=str(tmp_path / "again"))
    assert {row["question_id"] for row in map(json.loads, (tmp_path / "again" / "writer" / "eval.jsonl").open())} \
        == held_out and again.eval_questions == 5
    other_seed = load_recipe(None, [*overrides, "sft_data.eval_fraction=0.25", "sft_data.eval_seed=4"])
    build_sft_sets(other_seed, out_dir=str(tmp_path / "again"))
    assert {row["question_id"] for row in map(json.loads, (tmp_path / "again" / "writer" / "eval.jsonl").open())} \
        != held_out
    build_sft_sets(load_recipe(None, overrides), out_dir=str(tmp_path / "again"))
    assert not (tmp_path / "again" / "writer" / "eval.jsonl").exists()


def test_drop_question_echo_drops_only_writer_rows_that_search_the_question(tmp_path):
    """A writer whose first call of each round writes the question itself (any case or punctuation): with
    `sft_data.drop_question_echo` exactly those rows go, counted as question_echo, and the set gets its own folder."""
    from maps_train.recipe import sft_set_dir

    questions = tmp_path / "train.jsonl"
    write_questions(questions, 4)
    texts = {f"q{i}": f"Who is q{i}?" for i in range(4)}

    def writer(request, turn):
        question = texts[request.question_id]
        return json.dumps({"query": question.upper().rstrip("?") if turn % 2 == 0 else f"lookup {question} {turn}"})

    overrides = [f"traces.questions=[{questions}]", f"traces.out_dir={tmp_path / 'traces'}",
                 f"sft_data.traces_dir={tmp_path / 'traces'}", "sft_data.tokenizer=null",
                 "train.student=builtin:tiny-qwen3", "agent.num_directions=2"]
    recipe = load_recipe(None, overrides + [f"sft_data.out_dir={tmp_path / 'kept'}"])
    collect_traces(recipe, backend=ScriptedBackend({"consolidator": consolidator_sufficient_after(2), "writer": writer}),
                   retriever=RecordingRetriever(), progress=False)
    kept = build_sft_sets(recipe)
    dropping = load_recipe(None, overrides + [f"sft_data.out_dir={tmp_path / 'dropped'}",
                                              "sft_data.drop_question_echo=true"])
    dropped = build_sft_sets(dropping)

    def queries(folder):
        return [json.loads(json.loads(line)["completion"][0]["content"])["query"]
                for line in (folder / "writer" / "train.jsonl").read_text().splitlines()]

    assert kept.examples["writer"] == 8 and sum(query.startswith("WHO IS") for query in queries(tmp_path / "kept")) == 4
    assert dropped.examples["writer"] == 4 and all(query.startswith("lookup") for query in queries(tmp_path / "dropped"))
    assert dropped.rejects["question_echo"] == 4 and dropped.rows["writer"]["question_echo"] == 4
    assert dropped.examples["proposer"] == kept.examples["proposer"]
    # with no out_dir, the folder is keyed by what decides the rows
    echo_free = load_recipe(None, overrides + ["sft_data.drop_question_echo=true"])
    assert sft_set_dir(load_recipe(None, overrides)) != sft_set_dir(echo_free)
