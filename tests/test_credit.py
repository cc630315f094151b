"""Credit per role, counted by hand on hand-built MAPS traces: which gold passages each sub-query, writer and
proposer call found and how many were new, whether each consolidator's stop-or-continue was right, the answer's
EM and F1; gold matched by corpus id and by title and text; then the real MAPS engine writing it into its traces."""

from __future__ import annotations

import json

from scripted_backend import RecordingRetriever, ScriptedBackend, consolidator_sufficient_after

from maps_train.agents.runner import run_method
from maps_train.questions import Question
from maps_train.recipe import load_recipe
from maps_train.records.credit import call_credits, compute_credit
from maps_train.records.evidence import gold_evidence
from maps_train.records.trace import CallUsage, RoleCall, RoundRecord, SubQueryHits, TraceRecord, iter_traces
from maps_train.retrieval.base import Hit

GOLD = gold_evidence({"supporting_paragraphs": [
    {"title": "Gustave Eiffel", "text": "Gustave Eiffel was born in Dijon.", "corpus_id": "p4"},
    {"title": "Dijon", "text": "Dijon is in Burgundy.", "corpus_id": "p5"},
]})


def call(role: str, parsed: dict | None = None, ok: bool = True) -> RoleCall:
    return RoleCall(role=role, messages=[{"role": "user", "content": role}], raw_text="{}", parsed=parsed or {},
                    parse_ok=ok, usage=CallUsage())


def maps_round(index: int, hits: list[list[str]], sufficient: bool) -> RoundRecord:
    calls = [call("proposer")] + [call("writer") for _ in hits] + [call("consolidator")]
    return RoundRecord(index=index, calls=calls, sub_queries=[f"q{index}.{n}" for n in range(len(hits))],
                       retrieved=[SubQueryHits(f"q{index}.{n}", ids) for n, ids in enumerate(hits)],
                       sufficient=sufficient)


def maps_trace(rounds: list[RoundRecord], answer: str = "Dijon") -> TraceRecord:
    return TraceRecord(question_id="q", question="Where was Eiffel born?", dataset="toy", method="maps",
                       config_digest="d", rounds=rounds, stop_reason="sufficient", final_call=call("answer"),
                       final_answer=answer, golden_answers=["Dijon"])


def test_credit_by_corpus_id_counted_by_hand():
    # Round 1: writer 0 finds p4 (new), writer 1 finds p4 again (not new), writer 2 nothing; the consolidator goes
    # on with 1 of 2 gold found: right. Round 2: writer 0 finds p5 (new) and p4 (known); the consolidator stops
    # with 2 of 2: right.
    trace = maps_trace([maps_round(1, [["p1", "p4"], ["p4"], ["p9"]], sufficient=False),
                        maps_round(2, [["p5", "p4"], ["p2"], ["p3"]], sufficient=True)])
    credit = compute_credit(trace, GOLD)
    assert credit["gold"] == 2 and credit["found"] == 2
    assert [(q["gold"], q["new"]) for q in credit["queries"]] == [
        ([0], 1), ([0], 0), ([], 0), ([0, 1], 1), ([], 0), ([], 0)]
    by_call = [entry for _, entry in call_credits(_with(trace, credit))]
    roles = [entry["role"] for entry in by_call]
    assert roles == ["proposer", "writer", "writer", "writer", "consolidator"] * 2 + ["answer"]
    proposer1, w10, w11, w12, cons1, proposer2, w20, _, _, cons2, answer = by_call
    assert (proposer1["gold"], proposer1["new"]) == ([0], 1)
    assert (w10["new"], w11["new"], w12["new"]) == (1, 0, 0) and w11["gold"] == [0]
    assert (proposer2["gold"], proposer2["new"], w20["new"]) == ([0, 1], 1, 1)
    assert (cons1["stopped"], cons1["covered"], cons1["complete"], cons1["right"]) == (False, 0.5, False, True)
    assert (cons2["stopped"], cons2["covered"], cons2["complete"], cons2["right"]) == (True, 1.0, True, True)
    assert (answer["em"], answer["f1"], answer["cover_em"]) == (1.0, 1.0, 1.0)


def test_wrong_decisions_and_a_partial_answer():
    # Stopping after round 1 with 1 of 2 gold is wrong; going on after both are found would be wrong as well.
    early = compute_credit(maps_trace([maps_round(1, [["p4"]], sufficient=True)], answer="Dijon France"), GOLD)
    consolidator, answer = early["calls"][-2:]
    assert consolidator["right"] is False and consolidator["covered"] == 0.5
    assert answer["em"] == 0.0 and answer["cover_em"] == 1.0 and abs(answer["f1"] - 2 / 3) < 1e-6
    late = compute_credit(maps_trace([maps_round(1, [["p4", "p5"]], sufficient=False),
                                      maps_round(2, [["p1"]], sufficient=True)]), GOLD)
    decisions = [c for c in late["calls"] if c["role"] == "consolidator"]
    # Going on with every gold passage found is wrong; stopping in round 2 (all still found) is right.
    assert [d["right"] for d in decisions] == [False, True]


def test_a_go_on_is_right_only_when_later_rounds_find_more_gold():
    # Round 1 goes on with 1 of 2 gold; round 2 finds nothing more and goes on; round 3 finds p5 and stops. Round
    # 1's go-on was right (p5 came later), round 2's too; a go-on after which no round found anything was wrong.
    found_late = compute_credit(maps_trace([maps_round(1, [["p4"]], sufficient=False),
                                            maps_round(2, [["p1"]], sufficient=False),
                                            maps_round(3, [["p5"]], sufficient=True)]), GOLD)
    decisions = [c for c in found_late["calls"] if c["role"] == "consolidator"]
    assert [(d["later_new"], d["right"]) for d in decisions] == [(1, True), (1, True), (0, True)]
    futile = compute_credit(maps_trace([maps_round(1, [["p4"]], sufficient=False),
                                        maps_round(2, [["p1"]], sufficient=True)]), GOLD)
    decisions = [c for c in futile["calls"] if c["role"] == "consolidator"]
    # Round 1's go-on found nothing more: wrong. Round 2 stops with 1 of 2: wrong too.
    assert [(d["later_new"], d["right"]) for d in decisions] == [(0, False), (0, False)]
    # A go-on in the last round (the round cap ended the run) cannot be judged: no round shows what it found.
    capped = compute_credit(maps_trace([maps_round(1, [["p4"]], sufficient=False)]), GOLD)
    assert capped["calls"][-2]["right"] is None and capped["calls"][-2]["later_new"] == 0
    assert "known" not in capped["calls"][-2] and "followed" not in capped["calls"][-2]


def test_no_gold_leaves_decisions_unjudged():
    credit = compute_credit(maps_trace([maps_round(1, [["p4"]], sufficient=True)]), [])
    consolidator = credit["calls"][-2]
    assert credit["gold"] == 0 and consolidator["right"] is None and consolidator["covered"] is None


def test_gold_by_title_and_text_needs_the_passages():
    gold = gold_evidence({"supporting_facts": {"title": ["Dijon"], "sent_id": [0]},
                          "context": {"title": ["Dijon"], "sentences": [["Dijon is in Burgundy."]]}})
    trace = maps_trace([maps_round(1, [["c7"]], sufficient=True)])
    assert compute_credit(trace, gold)["found"] == 0  # ids alone cannot match a gold known by text
    passages = {"c7": Hit("c7", "Dijon", "Dijon is in Burgundy. It has mustard.", 1.0)}
    assert compute_credit(trace, gold, passages)["queries"][0] == {"round": 1, "position": 0, "gold": [0], "new": 1}


def test_a_trace_without_credit_has_none_per_call():
    trace = maps_trace([maps_round(1, [["p4"]], sufficient=True)])
    assert all(entry is None for _, entry in call_credits(trace))


def _with(trace: TraceRecord, credit: dict) -> TraceRecord:
    trace.credit = credit
    return TraceRecord.from_dict(trace.to_dict())  # through the file format


def test_the_maps_engine_writes_credit_into_its_traces(tmp_path):
    recipe = load_recipe(None, ["agent.num_directions=2", "agent.max_rounds=2"])
    question = Question(id="q1", question="Where was Gustave Eiffel born?", golden_answers=["Dijon"],
                        metadata={"supporting_paragraphs": [
                            {"title": "Gustave Eiffel", "text": "Gustave Eiffel was born in Dijon.", "corpus_id": "p1"}]})
    passages = [Hit("p1", "Gustave Eiffel", "Gustave Eiffel was born in Dijon.", 0.0),
                Hit("p2", "Lyon", "Lyon is on the Rhone.", 0.0)]
    backend = ScriptedBackend({"consolidator": consolidator_sufficient_after(1),
                               "answer": lambda request, turn: json.dumps({"answer": "Dijon"})})
    run_method(recipe, [question], tmp_path, backend=backend, retriever=RecordingRetriever(passages), progress=False)
    [(_, trace)] = list(iter_traces(tmp_path / "traces.jsonl"))
    assert trace.credit is not None and trace.credit["gold"] == 1 and trace.credit["found"] == 1
    credits = call_credits(trace)
    assert [c.role for c, _ in credits] == ["proposer", "writer", "writer", "consolidator", "answer"]
    assert all(entry is not None for _, entry in credits)
    assert sum(entry["new"] for call, entry in credits if call.role == "writer") == 1
    assert credits[3][1]["right"] is True and credits[-1][1]["em"] == 1.0


def write_credited(path, traces_and_gold) -> str:
    """The traces with their credit, one per line; every call's completion distinct, so no row is a duplicate."""
    lines = []
    for n, (trace, gold) in enumerate(traces_and_gold):
        trace.credit = compute_credit(trace, gold)
        for k, c in enumerate(trace.all_calls()):
            c.raw_text = json.dumps({"sample": n, "call": k})
        lines.append(json.dumps(trace.to_dict()))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_sft_data_keeps_rows_by_role_credit_counted_by_hand(tmp_path):
    from maps_train.traces.sft import build_sft_sets

    # Sample 1 (answer right): round 1 writer 0 finds p4 (new), writer 1 re-finds it, the consolidator goes on
    # (right); round 2 writer 0 finds p5 (new), writer 1 nothing, the consolidator stops with both (right).
    # Sample 2 (answer wrong): one round whose writer 0 finds p4 (new to this sample) and a consolidator that stops
    # with 1 of 2 (wrong). Rows by hand: proposer 2 rounds + 1 = 3 kept; writer 1 + 1 + 1 = 3 kept, 2 dropped;
    # consolidator 2 kept, 1 dropped; answer 1 kept (F1 1), 1 dropped (F1 0). Writer rows: sample 1 keeps 2 of 4,
    # sample 2 1 of 2.
    right = maps_trace([maps_round(1, [["p4"], ["p4"]], sufficient=False),
                        maps_round(2, [["p5"], ["p1"]], sufficient=True)], answer="Dijon")
    wrong = maps_trace([maps_round(1, [["p4"], ["p2"]], sufficient=True)], answer="Lyon")
    # A question without gold passages: its search and stop rows cannot be judged; its answer row can.
    nogold = maps_trace([maps_round(1, [["p4"], ["p2"]], sufficient=True)], answer="Dijon")
    nogold.question_id, nogold.question = "n", "Another question"
    traces = write_credited(tmp_path / "traces.jsonl", [(right, GOLD), (wrong, GOLD), (nogold, [])])
    recipe = load_recipe(None, ["sft_data.filter=role", "sft_data.tokenizer=null", "sft_data.max_samples_per_question=null",
                                "train.student=builtin:tiny-qwen3", f"sft_data.out_dir={tmp_path / 'sft'}"])
    stats = build_sft_sets(recipe, traces_dir=traces)
    assert stats.examples == {"proposer": 3, "writer": 3, "consolidator": 4}  # consolidator adapter: 2 + 2 answers
    rules = stats.to_dict()["credit_rules"]
    assert rules["new_gold"]["writer"] == {"kept": 3, "dropped": 5}  # 3 without new gold + the no-gold question's 2
    assert rules["new_gold"]["proposer"] == {"kept": 3, "dropped": 1}
    assert rules["right_decision"]["consolidator"] == {"kept": 2, "dropped": 2}
    assert rules["answer_f1"]["answer"] == {"kept": 2, "dropped": 1}
    assert stats.rows["writer"]["no_new_gold"] == 3 and stats.rows["writer"]["no_gold"] == 2
    assert stats.rows["consolidator"]["wrong_decision"] == 1 and stats.rows["answer"]["wrong_answer"] == 1
    saved = json.loads((tmp_path / "sft" / "stats.json").read_text())
    assert saved["credit_rules"] == rules
    kept_writers = [json.loads(line) for line in (tmp_path / "sft" / "writer" / "train.jsonl").read_text().splitlines()]
    assert [json.loads(r["completion"][0]["content"]) for r in kept_writers] == [
        {"sample": 0, "call": 1}, {"sample": 0, "call": 5}, {"sample": 1, "call": 1}]


def test_a_role_below_the_floor_keeps_no_rows_and_says_so(tmp_path):
    from maps_train.traces.sft import build_sft_sets

    # Two samples of the test above, by hand: proposer 3 rows kept, writer 3, consolidator 2, answer 1 (the right
    # one). A floor of 2 drops the answer's 1 row: the consolidator adapter trains on its 2 consolidator rows only.
    right = maps_trace([maps_round(1, [["p4"], ["p4"]], sufficient=False),
                        maps_round(2, [["p5"], ["p1"]], sufficient=True)], answer="Dijon")
    wrong = maps_trace([maps_round(1, [["p4"], ["p2"]], sufficient=True)], answer="Lyon")
    traces = write_credited(tmp_path / "traces.jsonl", [(right, GOLD), (wrong, GOLD)])
    overrides = ["sft_data.filter=role", "sft_data.tokenizer=null", "sft_data.max_samples_per_question=null",
                 "train.student=builtin:tiny-qwen3"]
    unfloored = build_sft_sets(load_recipe(None, [*overrides, f"sft_data.out_dir={tmp_path / 'all'}"]),
                               traces_dir=traces)
    assert {role: unfloored.rows[role]["kept"] for role in unfloored.rows} == {
        "proposer": 3, "writer": 3, "consolidator": 2, "answer": 1}
    recipe = load_recipe(None, [*overrides, "sft_data.min_rows_per_role=2", f"sft_data.out_dir={tmp_path / 'sft'}"])
    stats = build_sft_sets(recipe, traces_dir=traces)
    assert stats.examples == {"proposer": 3, "writer": 3, "consolidator": 2}
    assert stats.below_floor == {"answer": 1}
    assert stats.rows["answer"]["kept"] == 0 and stats.rows["answer"]["below_floor"] == 1
    assert stats.prompt_tokens["answer"] == 0 and stats.prompt_tokens["writer"] == unfloored.prompt_tokens["writer"]
    assert json.loads((tmp_path / "sft" / "stats.json").read_text())["below_floor"] == {"answer": 1}
    consolidator = (tmp_path / "sft" / "consolidator" / "train.jsonl").read_text().splitlines()
    assert [json.loads(line)["role"] for line in consolidator] == ["consolidator", "consolidator"]
    assert len((tmp_path / "sft" / "writer" / "train.jsonl").read_text().splitlines()) == 3
    assert "answer (1 row)" in stats.table()


def test_a_role_its_adapter_never_learned_is_routed_to_the_base_model(tmp_path):
    from maps_train.adapters import distilled_set, student_routes
    from maps_train.train.data import rows_per_role

    # SFT rows as sft-data writes them (each names its role): the consolidator adapter saw no answer row.
    sft = tmp_path / "sft"
    row = {"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "{}"}]}
    for adapter, roles in {"proposer": ["proposer"], "writer": ["writer", "writer"],
                           "consolidator": ["consolidator"]}.items():
        (sft / adapter).mkdir(parents=True)
        (sft / adapter / "train.jsonl").write_text("".join(json.dumps({**row, "role": r}) + "\n" for r in roles))
    adapters = tmp_path / "adapters"
    recipe = load_recipe(None, [f"train.sft_dir={sft}", f"train.output_dir={adapters}"])
    counts = {adapter: rows_per_role(recipe, adapter) for adapter in ("proposer", "writer", "consolidator")}
    assert counts == {"proposer": {"proposer": 1}, "writer": {"writer": 2},
                      "consolidator": {"consolidator": 1, "answer": 0}}
    for adapter, rows in counts.items():  # the training summary records them (maps_train/train/__main__.py)
        (adapters / adapter).mkdir(parents=True)
        (adapters / adapter / "train_summary.json").write_text(json.dumps({"rows_per_role": rows}))
    routes = student_routes(recipe, distilled_set(recipe))
    assert routes["answer"].adapter is None and routes["answer"].model == routes["consolidator"].model
    assert routes["consolidator"].adapter == str(adapters / "consolidator")
    assert routes["writer"].adapter == str(adapters / "writer")
    assert student_routes(recipe, distilled_set(recipe), via="server")["answer"].adapter is None
    # An eval system that swaps in another consolidator adapter (an RL one) keeps the answer on the base model.
    from maps_train.evaluate.suite import apply_routes

    swapped = apply_routes(recipe, "distilled", {"consolidator": str(tmp_path / "rl")}).roles
    assert swapped["consolidator"].adapter == str(tmp_path / "rl") and swapped["answer"].adapter is None
    # A row that names no role of its adapter (a hand-written set): unknown, and every role keeps its adapter.
    (sft / "consolidator" / "train.jsonl").write_text(json.dumps(row) + "\n")
    assert rows_per_role(recipe, "consolidator") is None


def test_analyze_credit_summarises_roles_from_traces(tmp_path):
    from maps_train.analysis.credit import credit_markdown, credit_summary

    # The first test's trace (counted there by hand) and an early stop with 1 of 2 gold.
    right = maps_trace([maps_round(1, [["p1", "p4"], ["p4"], ["p9"]], sufficient=False),
                        maps_round(2, [["p5", "p4"], ["p2"], ["p3"]], sufficient=True)])
    early = maps_trace([maps_round(1, [["p4"]], sufficient=True)], answer="Lyon")
    # A go-on after which round 2 found nothing more (then a stop with 1 of 2): both wrong.
    futile = maps_trace([maps_round(1, [["p4"]], sufficient=False), maps_round(2, [["p1"]], sufficient=True)],
                        answer="Lyon")
    old = maps_trace([maps_round(1, [["p4"]], sufficient=True)])  # written before credit existed
    for trace in (right, early, futile):
        trace.credit = compute_credit(trace, GOLD)
    path = tmp_path / "traces.jsonl"
    path.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in (right, early, futile, old)))
    summary = credit_summary(path)
    assert summary["traces"] == 4 and summary["no_credit"] == 1
    writer, consolidator, answer = (summary["roles"][r] for r in ("writer", "consolidator", "answer"))
    assert (writer["calls"], writer["found_new"], writer["new"]) == (9, 4, 4)
    assert (consolidator["judged"], consolidator["right"], consolidator["stopped_missing"]) == (5, 2, 2)
    assert consolidator["went_on_futile"] == 1
    assert (answer["em"], answer["judged"]) == (1.0, 3)
    table = credit_markdown([("t", summary)])
    assert "| t | consolidator | 5 | 5 | - | - | 40.0 | 40.0 | 0.0 | 20.0 | - | - |" in table
    assert "| t | writer | 9 | 9 | 44.4 | 0.44 |" in table
