"""The annotation teacher through the user's own commands: `maps-train traces` writes its traces end to end over a
real BM25 index, `maps-train sft-data` keeps rows of every role from them by role credit, `maps-train
score-traces` scores them into a results file as an eval system (resumable, no duplicate rows), and an evaluation
or a plain run with it is refused in one line (exit 2), before any work."""

from __future__ import annotations

import json
import subprocess
import sys

from test_annotation_teacher import PASSAGES, QUESTIONS


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "maps_train.cli", *args], capture_output=True, text=True, cwd=cwd)


def deployed_grammar_accepts(role: str, text: str) -> bool:
    import xgrammar
    from xgrammar.testing import _is_grammar_accept_string

    from maps_train.agents import outputs

    schema = {"proposer": outputs.directions_schema(3), "writer": outputs.query_schema(),
              "consolidator": outputs.consolidation_schema(), "answer": outputs.answer_schema()}[role]
    grammar = xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False,
                                                separators=outputs.DEPLOYED_JSON_SEPARATORS)
    return _is_grammar_accept_string(grammar, text)


def test_a_json_target_is_written_as_the_deployed_grammar_writes_it():
    from maps_train.traces.sft import render_completion

    spaced = '{"query": "Gawvi", "extra": ["a", "b"]}'
    assert render_completion(spaced, None, False) == '{"query":"Gawvi","extra":["a","b"]}'
    assert not deployed_grammar_accepts("writer", '{"query": "Gawvi"}')
    assert deployed_grammar_accepts("writer", render_completion('{"query": "Gawvi"}', None, False))
    for text in ("Paris", '{"query": "cut', "[1, 2]", '{"a": 1} and more'):  # not one JSON object: as it is
        assert render_completion(text, None, False) == text
    assert render_completion('{"answer": "Brême"}', None, False) == '{"answer":"Brême"}'  # non-ASCII kept
    # A bounded string under xgrammar takes no escape: a quote, a backslash or a line break inside one is written
    # as the nearest character the student can write.
    quoted = json.dumps({"query": 'the song "Nobody\'s Hero"\nby Rush \\ 1993'})
    assert not deployed_grammar_accepts("writer", json.dumps(json.loads(quoted), separators=(",", ":")))
    assert render_completion(quoted, None, False) == '{"query":"the song \'Nobody\'s Hero\' by Rush / 1993"}'
    assert deployed_grammar_accepts("writer", render_completion(quoted, None, False))


def write_world(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": pid, "contents": f"{title}\n{text}"}) + "\n"
                              for pid, title, text in PASSAGES), encoding="utf-8")
    questions = tmp_path / "data" / "train.jsonl"
    questions.parent.mkdir()
    questions.write_text("".join(json.dumps(q.to_dict()) + "\n" for q in QUESTIONS), encoding="utf-8")
    recipe = tmp_path / "teacher.yaml"
    recipe.write_text(f"""
name: annotation-teacher
retrieval: {{kind: bm25, corpus: {corpus}, index_dir: {tmp_path / 'index'}}}
roles:
  default: {{backend: annotation, model: question}}
agent: {{num_directions: 3, max_rounds: 3, top_k: 1}}
traces: {{questions: [{questions}], out_dir: {tmp_path / 'traces'}}}
sft_data: {{out_dir: {tmp_path / 'sft'}, filter: role, min_answer_f1: 0.5, require_parsed: true}}
wandb: {{enabled: false}}
""", encoding="utf-8")
    return recipe, questions


def test_traces_sft_data_and_score_through_the_commands(tmp_path):
    recipe, questions = write_world(tmp_path)
    traces = run_cli("traces", str(recipe))
    assert traces.returncode == 0, traces.stderr[-3000:]
    [run] = list((tmp_path / "traces").rglob("traces.jsonl"))
    rows = [json.loads(line) for line in run.read_text(encoding="utf-8").splitlines()]
    assert {row["question_id"] for row in rows} == {q.id for q in QUESTIONS}
    models = {call["usage"]["model"] for row in rows for round_ in row["rounds"] for call in round_["calls"]}
    assert models == {"annotation", "annotation>question"}  # who played each call, kept in the trace

    sft = run_cli("sft-data", str(recipe))
    assert sft.returncode == 0, sft.stderr[-3000:]
    stats = json.loads(next((tmp_path / "sft").rglob("stats.json")).read_text())
    kept = {role: counts["kept"] for role, counts in stats["rows"].items()}
    assert all(kept.get(role, 0) > 0 for role in ("proposer", "writer", "consolidator", "answer")), stats["rows"]
    # Every target is text the student can write under its deployed decoding (the role's schema compiled as vLLM's
    # xgrammar backend compiles it with disable_any_whitespace): `{"query": "x"}` with a space is not, and a student
    # trained on it wrote `{"query":"}systemsystem..."` under the grammar.
    targets = [json.loads(line) for path in (tmp_path / "sft").rglob("train.jsonl")
               for line in path.read_text(encoding="utf-8").splitlines()]
    refused = [(row["role"], row["completion"][0]["content"]) for row in targets
               if not deployed_grammar_accepts(row["role"], row["completion"][0]["content"])]
    assert targets and not refused, refused[:3]

    results = tmp_path / "eval" / "results.jsonl"
    args = ["score-traces", str(tmp_path / "traces"), "--questions", str(questions), "--results", str(results)]
    scored = run_cli(*args)
    assert scored.returncode == 0, scored.stderr[-3000:]
    lines = [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == len(QUESTIONS) and {line["system"] for line in lines} == {"teacher"}
    assert all(line["evidence_recall"] == 1.0 and line["em"] == 1.0 for line in lines), lines
    again = run_cli(*args)
    assert again.returncode == 0 and "0 new rows" in again.stdout
    assert len(results.read_text(encoding="utf-8").splitlines()) == len(QUESTIONS)


def test_an_evaluation_with_it_is_refused_in_one_line(tmp_path):
    recipe, questions = write_world(tmp_path)
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"""
name: refused
out_dir: {tmp_path / 'eval'}
datasets: [{{name: mine, path: {questions}}}]
systems: [{{name: teacher, recipe: {recipe}}}]
wandb: {{enabled: false}}
""", encoding="utf-8")
    refused = run_cli("eval", str(suite))
    assert refused.returncode == 2
    assert [line for line in refused.stderr.splitlines() if line.strip()] == [
        f"maps-train: error: {suite}: systems[0] (teacher): roles.default.backend: annotation reads the gold "
        "annotations: it writes teacher traces (maps-train traces) and is refused in an evaluation"]
    assert not (tmp_path / "eval").exists()  # refused before any work
    run = run_cli("run", str(recipe), "--questions", str(questions), "--out", str(tmp_path / "run"))
    assert run.returncode == 2 and "roles.default.backend: annotation reads the gold annotations" in run.stderr
