"""The annotation teacher (`roles.<role>.backend: annotation`, maps_train/teachers/): it plays the MAPS roles from a
question's data set annotations inside the real MAPS loop over a real BM25 index, so every prompt it answers is one
the student sees. Hand-built questions of each annotated data set (MuSiQue decomposition, 2Wiki evidence triples,
HotpotQA supporting titles, NQ's gold passage, PopQA subject and relation) over a small hand-written corpus:

- its queries and directions name no entity its prompt does not show (a later hop's entity only once the
  knowledge holds the earlier hop's answer);
- its consolidator states no hop answer that the passages it read do not hold;
- it stops when every hop is resolved;
- what it cannot play falls back to the question, and the trace says who played each call.
The checks below are written from the prompts and the annotations, independently of the teacher's own code."""

from __future__ import annotations

import json
import re

import pytest

from maps_train.agents.runner import run_method
from maps_train.errors import MapsTrainError
from maps_train.llm.router import Router, build_router
from maps_train.questions import Question
from maps_train.recipe import load_recipe
from maps_train.records.metrics import normalize_answer
from maps_train.records.trace import iter_traces
from maps_train.retrieval.bm25 import BM25Retriever, build_bm25_index
from maps_train.teachers import Annotations, annotation_of

PASSAGES = [
    ("m1", "Van Hook Township, Mountrail County, North Dakota",
     "Van Hook Township is a township in Mountrail County, North Dakota, United States. Its population was 100 at "
     "the 2000 census."),
    ("m2", "Mountrail County Courthouse",
     "The Mountrail County Courthouse in Stanley, North Dakota was built in 1914 and served Mountrail County as its "
     "courthouse continuously since then."),
    ("m3", "Stanley Cup", "The Stanley Cup is the championship trophy awarded to the National Hockey League winner."),
    ("w1", "Forbidden Ground", "Forbidden Ground is a Hungarian film directed by Pál Gábor."),
    ("w2", "Free Guy", "Free Guy is a 2021 American action comedy film directed by Shawn Levy."),
    ("w3", "Pál Gábor", "Pál Gábor (2 November 1932 – 21 October 1987) was a Hungarian film director."),
    ("w4", "Shawn Levy", "Shawn Adam Levy (born July 23, 1968) is a Canadian director and producer."),
    ("h1", "Nobody's Hero", "\"Nobody's Hero\" is a song by the Canadian rock band Rush, from the album "
     "Counterparts."),
    ("h2", "Rush (band)", "Rush was a Canadian rock band formed in Toronto in 1968, with drummer Neil Peart."),
    ("n1", "Moon landing", "The last crewed mission departed the lunar surface in December 1972."),
    ("p1", "George Rankin", "George James Rankin (1 May 1887 – 28 December 1957) was an Australian soldier and "
     "politician."),
    ("x1", "Toronto", "Toronto is the capital city of the Canadian province of Ontario."),
    ("x2", "Hungary", "Hungary is a country in Central Europe. Its capital is Budapest."),
]


def gold(*ids):
    by_id = {pid: (title, text) for pid, title, text in PASSAGES}
    return [{"title": by_id[i][0], "text": by_id[i][1], "corpus_id": i, "is_supporting": True} for i in ids]


QUESTIONS = [
    Question("musique-1", "What is the seat of the county where Van Hook Township is located?", ["Stanley"],
             dataset="musique", metadata={
                 "question_decomposition": [
                     {"question": "Van Hook Township >> located in the administrative territorial entity",
                      "answer": "Mountrail County", "paragraph_support_idx": 0},
                     {"question": "#1 >> capital", "answer": "Stanley", "paragraph_support_idx": 1}],
                 "paragraphs": gold("m1", "m2"), "supporting_paragraphs": gold("m1", "m2")}),
    Question("2wiki-1", "Which film whose director is younger, Forbidden Ground or Free Guy?", ["Free Guy"],
             dataset="2wikimultihopqa", metadata={
                 "type": "bridge_comparison",
                 "evidences": [["Forbidden Ground", "director", "Pál Gábor"], ["Free Guy", "director", "Shawn Levy"],
                               ["Pál Gábor", "date of birth", "2 November 1932"],
                               ["Shawn Levy", "date of birth", "July 23, 1968"]],
                 "supporting_paragraphs": gold("w1", "w2", "w3", "w4")}),
    Question("hotpot-1", "Which Canadian rock band released a song called \"Nobody's Hero\"?", ["Rush"],
             dataset="hotpotqa", metadata={
                 "type": "bridge", "supporting_facts": [["Nobody's Hero", 0], ["Rush (band)", 0]],
                 "supporting_paragraphs": gold("h1", "h2")}),
    Question("nq-1", "when was the last time anyone was on the moon", ["December 1972"], dataset="nq",
             metadata={"supporting_paragraphs": gold("n1")}),
    Question("popqa-1", "What is George Rankin's occupation?", ["politician"], dataset="popqa",
             metadata={"subj": "George Rankin", "prop": "occupation", "obj": "politician",
                       "s_wiki_title": "George Rankin", "supporting_paragraphs": gold("p1")}),
]
ANNOTATED = "roles.{role}.backend=annotation roles.{role}.model=question"


@pytest.fixture(scope="module")
def bm25(tmp_path_factory):
    folder = tmp_path_factory.mktemp("teacher-corpus")
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": pid, "contents": f"{title}\n{text}"}) + "\n"
                              for pid, title, text in PASSAGES), encoding="utf-8")
    return BM25Retriever(build_bm25_index(corpus, folder / "index", show_progress=False))


def teacher_recipe(*overrides, roles=("proposer", "writer", "consolidator", "answer")):
    routes = [part for role in roles for part in ANNOTATED.format(role=role).split()]
    return load_recipe(None, ["agent.num_directions=3", "agent.max_rounds=3", "agent.top_k=1", *routes, *overrides])


def run_teacher(tmp_path, bm25, questions=QUESTIONS, recipe=None):
    recipe = recipe or teacher_recipe()
    router = build_router(recipe, annotations=Annotations({q.id: annotation_of(q) for q in questions}))
    run_method(recipe, questions, tmp_path, backend=router, retriever=bm25, progress=False)
    return {trace.question_id: trace for _, trace in iter_traces(tmp_path / "traces.jsonl")}


def user(call) -> str:
    return call.messages[-1]["content"]


def prompt_of(call) -> str:
    return "\n".join(message["content"] for message in call.messages)


def section(prompt: str, heading: str) -> str:
    match = re.search(re.escape(heading) + r"\n(.*?)(?:\n\n|\Z)", prompt, re.DOTALL)
    return match.group(1) if match else ""


def hop_answers(question: Question) -> list[str]:
    return [answer for hop in annotation_of(question).hops for answer in hop.answers]


def norm(text: str) -> str:
    return f" {normalize_answer(text)} "


def test_every_data_set_is_played_from_its_annotation(tmp_path, bm25):
    traces = run_teacher(tmp_path, bm25)
    assert set(traces) == {q.id for q in QUESTIONS}
    for trace in traces.values():
        calls = trace.all_calls()
        assert all(call.parse_ok for call in calls), trace.question_id  # valid JSON per the role's schema
    played = {qid: {call.usage.model for call in t.all_calls() if call.role == "writer"} for qid, t in traces.items()}
    assert played["musique-1"] == played["2wiki-1"] == played["popqa-1"] == {"annotation"}
    # NQ's annotation names no entity its question shows: the writer falls back to the question, and says so.
    assert played["nq-1"] == {"annotation>question"}
    assert [r.sub_queries for r in traces["nq-1"].rounds][0] == [QUESTIONS[3].question]
    # the gold is found and answered where the annotation knows the search
    for qid in ("musique-1", "2wiki-1", "hotpot-1", "popqa-1", "nq-1"):
        assert traces[qid].credit["found"] == traces[qid].credit["gold"], qid
        assert traces[qid].final_answer == next(q for q in QUESTIONS if q.id == qid).golden_answers[0], qid


def test_queries_name_only_entities_their_prompt_shows(tmp_path, bm25):
    traces = run_teacher(tmp_path, bm25)
    for question in QUESTIONS:
        trace = traces[question.id]
        for round_ in trace.rounds:
            for call in round_.calls:
                if call.role not in ("proposer", "writer"):
                    continue
                prompt, said = prompt_of(call), " ".join(json.loads(call.raw_text).get("directions", [])) + \
                    json.loads(call.raw_text).get("query", "")
                # no hop answer before the knowledge (or the question) shows it
                for answer in hop_answers(question):
                    if norm(answer) in norm(said):
                        assert norm(answer) in norm(prompt), (question.id, round_.index, answer, said)
                # no capitalised word or number the prompt does not hold
                shown = {w.lower() for w in re.findall(r"\w+", prompt)}
                unseen = [w for w in re.findall(r"\w+", said) if not w.islower() and w.lower() not in shown]
                assert not unseen, (question.id, said, unseen)
    # MuSiQue: hop 2's entity (hop 1's answer) is searched only after the consolidator recorded it.
    first, second = traces["musique-1"].rounds[:2]
    assert not any("mountrail" in q.lower() for q in first.sub_queries)
    assert "Mountrail County" in (first.observation or "")
    assert any(q.startswith("Mountrail County") for q in second.sub_queries)


def test_consolidator_states_only_answers_its_passages_hold(tmp_path, bm25):
    traces = run_teacher(tmp_path, bm25)
    for question in QUESTIONS:
        for call in traces[question.id].all_calls():
            if call.role != "consolidator":
                continue
            prompt, observation = user(call), json.loads(call.raw_text)["observation"]
            before = section(prompt, "Knowledge gathered so far:") + section(prompt, "Reasoning state:")
            passages = section(prompt, "Passages retrieved in this round:")
            for answer in hop_answers(question):
                if norm(answer) in norm(observation):
                    assert norm(answer) in norm(passages) or norm(answer) in norm(before), (question.id, answer)


def test_it_stops_when_every_hop_is_resolved(tmp_path, bm25):
    traces = run_teacher(tmp_path, bm25)
    musique = traces["musique-1"]
    # top-1 per query: hop 1's passage in round 1, hop 2's (found through "Mountrail County") in round 2
    assert [r.sufficient for r in musique.rounds] == [False, True] and musique.stop_reason == "sufficient"
    for trace in traces.values():
        decisions = [json.loads(c.raw_text)["sufficient"] for c in trace.all_calls() if c.role == "consolidator"]
        assert decisions[-1] is True and not any(decisions[:-1]), trace.question_id


def test_nothing_found_goes_on_and_the_round_cap_ends_it(tmp_path, bm25):
    lost = Question("musique-2", "What is the seat of the county where Nowhere Flats is located?", ["Elsewhere"],
                    dataset="musique", metadata={"question_decomposition": [
                        {"question": "Nowhere Flats >> located in the administrative territorial entity",
                         "answer": "Imaginary County"}, {"question": "#1 >> capital", "answer": "Elsewhere"}]})
    trace = run_teacher(tmp_path, bm25, [lost])["musique-2"]
    assert trace.stop_reason == "max_rounds" and len(trace.rounds) == 3
    assert all("Imaginary" not in q for r in trace.rounds for q in r.sub_queries)
    # the answer the knowledge does not hold is no gold answer: the question fallback says "unknown"
    assert trace.final_answer == "unknown" and trace.final_call.usage.model == "annotation>question"


def test_mixed_teachers_route_per_role(tmp_path, bm25):
    from scripted_backend import ScriptedBackend

    recipe = teacher_recipe("roles.default.backend=vllm", roles=("writer",))
    annotations = Annotations({q.id: annotation_of(q) for q in QUESTIONS[:1]})
    model = ScriptedBackend()
    router = Router(recipe, backends={"vllm": model, "annotation": annotations.backend()})
    run_method(recipe, QUESTIONS[:1], tmp_path, backend=router, retriever=bm25, progress=False)
    [(_, trace)] = list(iter_traces(tmp_path / "traces.jsonl"))
    by_role = {}
    for call in trace.all_calls():
        by_role.setdefault(call.role, set()).add(call.usage.model.startswith("annotation"))
    assert by_role == {"proposer": {False}, "writer": {True}, "consolidator": {False}, "answer": {False}}
    assert {r.role for batch in model.batches for r in batch} == {"proposer", "consolidator", "answer"}


def test_only_the_traces_stage_builds_it():
    recipe = teacher_recipe(roles=("writer",))
    with pytest.raises(MapsTrainError, match=r"^roles\.writer\.backend: annotation reads the gold annotations"):
        build_router(recipe)


def test_a_hop_question_loses_the_entities_its_prompt_does_not_show(tmp_path, bm25):
    """MuSiQue's natural-language hop questions are the annotators' words: an entity in them that the question
    does not name (here the lower-case acronym "mlb") reaches no query, direction, observation or state."""
    asked = Question("musique-3", "Who drummed for the Canadian band that released the song Nobody's Hero?",
                     ["Neil Peart"], dataset="musique", metadata={"question_decomposition": [
                         {"question": "which mlb canadian band released nobody's hero", "answer": "Rush"},
                         {"question": "#1 >> member", "answer": "Neil Peart"}]})
    trace = run_teacher(tmp_path, bm25, [asked])["musique-3"]
    written = [json.dumps(json.loads(call.raw_text)) for call in trace.all_calls()]
    assert written and not any("mlb" in text.lower() for text in written)
    assert any("canadian band released nobody's hero" in q.lower() for q in trace.rounds[0].sub_queries)


def test_what_the_annotation_cannot_play_goes_to_the_routes_model(tmp_path, bm25):
    """An annotation route whose model names a model: NQ's proposer and writer (its annotation names no entity the
    question shows) go to that model, here the scripted double behind the router's model engine, and say so."""
    from scripted_backend import ScriptedBackend

    model = ScriptedBackend()
    recipe = teacher_recipe(*(f"roles.{role}.model=builtin:smollm2-135m-instruct" for role in ("proposer", "writer")))
    annotations = Annotations({q.id: annotation_of(q) for q in QUESTIONS})
    router = Router(recipe, backends={"vllm": model, "annotation:question": annotations.backend(),
                                      "annotation:builtin:smollm2-135m-instruct": annotations.backend(lambda r: model)})
    run_method(recipe, [QUESTIONS[0], QUESTIONS[3]], tmp_path, backend=router, retriever=bm25, progress=False)
    traces = {t.question_id: t for _, t in iter_traces(tmp_path / "traces.jsonl")}
    nq = {(c.role, c.usage.model) for c in traces["nq-1"].all_calls()}
    assert ("writer", "annotation>scripted") in nq and ("proposer", "annotation>scripted") in nq
    assert {c.usage.model for c in traces["musique-1"].all_calls()} == {"annotation"}
    assert {r.role for batch in model.batches for r in batch} == {"proposer", "writer"}
    assert {r.question_id for batch in model.batches for r in batch} == {"nq-1"}
