"""A small hand-written SFT set in the builder's format, for smoke runs, tests and benchmarks on CPU.

Twelve multi-hop questions, each with the calls a MAPS teacher would make: a proposer listing directions, a writer
turning one direction into a sub-query, a consolidator folding evidence into an observation and state, and the
final answer (trained into the consolidator adapter, as `sft_data.adapter_roles` maps it by default).
`write_toy_sft(folder)` writes `<folder>/<adapter>/train.jsonl` and `eval.jsonl` with the metadata columns the
real builder adds (`question_id`, `role`), which training must ignore.
"""

from __future__ import annotations

import json
from pathlib import Path

# (question, two directions, a sub-query per direction, evidence, observation, answer)
QUESTIONS = [
    ("Who directed the film in which Tom Hanks played a FedEx employee stranded on an island?",
     ["film with Tom Hanks as a FedEx employee", "director of that film"],
     ["Tom Hanks FedEx employee stranded island film", "Cast Away 2000 film director"],
     "Cast Away (2000) stars Tom Hanks as a FedEx systems engineer; it was directed by Robert Zemeckis.",
     "The film is Cast Away, directed by Robert Zemeckis.", "Robert Zemeckis"),
    ("What is the capital of the country where the Douro river reaches the sea?",
     ["country at the mouth of the Douro", "capital of that country"],
     ["Douro river mouth country", "capital city of Portugal"],
     "The Douro flows into the Atlantic at Porto, Portugal. Lisbon is the capital of Portugal.",
     "The Douro reaches the sea in Portugal, whose capital is Lisbon.", "Lisbon"),
    ("In which year was the author of 'The Old Man and the Sea' awarded the Nobel Prize in Literature?",
     ["author of The Old Man and the Sea", "year that author won the Nobel Prize"],
     ["The Old Man and the Sea author", "Ernest Hemingway Nobel Prize in Literature year"],
     "Ernest Hemingway wrote The Old Man and the Sea (1952) and received the Nobel Prize in Literature in 1954.",
     "Hemingway wrote it and won the Nobel Prize in 1954.", "1954"),
    ("Which university did the founder of Microsoft who left in 2000 as CEO attend?",
     ["Microsoft CEO who stepped down in 2000", "university attended by that person"],
     ["Microsoft CEO stepped down 2000", "Bill Gates university attended"],
     "Bill Gates stepped down as Microsoft CEO in January 2000. He attended Harvard University before dropping out.",
     "The founder is Bill Gates, who attended Harvard.", "Harvard University"),
    ("What instrument did the composer of 'The Four Seasons' primarily play?",
     ["composer of The Four Seasons", "that composer's instrument"],
     ["The Four Seasons violin concertos composer", "Antonio Vivaldi instrument virtuoso"],
     "Antonio Vivaldi composed The Four Seasons and was a virtuoso violinist.",
     "Vivaldi composed it and played the violin.", "violin"),
    ("Which ocean borders the state where the Golden Gate Bridge is located?",
     ["state of the Golden Gate Bridge", "ocean bordering that state"],
     ["Golden Gate Bridge location state", "ocean on the coast of California"],
     "The Golden Gate Bridge spans the strait in San Francisco, California, which borders the Pacific Ocean.",
     "The bridge is in California, on the Pacific.", "Pacific Ocean"),
    ("Who was the father of the queen who succeeded George VI?",
     ["monarch who succeeded George VI", "father of that monarch"],
     ["successor of King George VI", "Elizabeth II father"],
     "George VI was succeeded in 1952 by his daughter Elizabeth II; her father was George VI himself.",
     "Elizabeth II succeeded George VI, who was her father.", "George VI"),
    ("What is the currency of the country whose capital is Nairobi?",
     ["country with capital Nairobi", "currency of that country"],
     ["Nairobi capital of which country", "Kenya official currency"],
     "Nairobi is the capital of Kenya. The Kenyan shilling is the currency of Kenya.",
     "Nairobi is Kenya's capital; the currency is the Kenyan shilling.", "Kenyan shilling"),
    ("Which team did the 1998 FIFA World Cup final winner's captain play for in 1998?",
     ["winner of the 1998 World Cup and its captain", "club of that captain in 1998"],
     ["1998 FIFA World Cup final winner captain", "Didier Deschamps club 1998"],
     "France won the 1998 World Cup, captained by Didier Deschamps, who played for Juventus in 1998.",
     "The captain was Deschamps, then at Juventus.", "Juventus"),
    ("What element has the atomic number equal to the number of planets in the Solar System?",
     ["number of planets in the Solar System", "element with that atomic number"],
     ["how many planets in the Solar System", "element atomic number 8"],
     "The Solar System has eight planets. Oxygen has atomic number 8.",
     "There are 8 planets; element 8 is oxygen.", "oxygen"),
    ("In which city was the painter of 'The Starry Night' born?",
     ["painter of The Starry Night", "birthplace of that painter"],
     ["The Starry Night painter", "Vincent van Gogh birthplace"],
     "Vincent van Gogh painted The Starry Night in 1889. He was born in Zundert, Netherlands.",
     "Van Gogh painted it and was born in Zundert.", "Zundert"),
    ("Which language is officially spoken in the country that hosted the 2016 Summer Olympics?",
     ["host country of the 2016 Summer Olympics", "official language of that country"],
     ["2016 Summer Olympics host city country", "official language of Brazil"],
     "The 2016 Summer Olympics were held in Rio de Janeiro, Brazil. Portuguese is Brazil's official language.",
     "Brazil hosted them; its official language is Portuguese.", "Portuguese"),
]

SYSTEM = {
    "proposer": "You are the direction proposer of a multi-hop retrieval agent. Given the question, the "
    "observations so far and the current state, list up to {n} distinct retrieval directions as JSON "
    '{{"directions": [...]}}.',
    "writer": "You are the query writer of a multi-hop retrieval agent. Write one search query for the given "
    'direction as JSON {{"query": "..."}}.',
    "consolidator": "You are the consolidator of a multi-hop retrieval agent. Read the retrieved evidence, write "
    'an observation and the new state, and say whether the evidence suffices, as JSON {{"observation": "...", '
    '"state": "...", "sufficient": true|false}}.',
    "answer": "Answer the question from the observations and state. Reply with the short answer only.",
}


def _row(question_id: str, role: str, user: str, completion: str, num_directions: int = 2) -> dict:
    return {
        "prompt": [
            {"role": "system", "content": SYSTEM[role].format(n=num_directions)},
            {"role": "user", "content": user},
        ],
        "completion": [{"role": "assistant", "content": completion}],
        "chat_template_kwargs": {"enable_thinking": False},
        "question_id": question_id,
        "role": role,
    }


def toy_rows() -> dict[str, list[dict]]:
    """adapter -> rows (four rows per question for the consolidator adapter, two for the others)."""
    rows: dict[str, list[dict]] = {"proposer": [], "writer": [], "consolidator": []}
    for i, (question, directions, queries, evidence, observation, answer) in enumerate(QUESTIONS):
        qid = f"toy-{i:02d}"
        start = f"Question: {question}\nObservations: (none yet)\nState: (empty)"
        later = f"Question: {question}\nObservations: 1. {observation}\nState: {observation}"
        rows["proposer"].append(_row(qid, "proposer", start, json.dumps({"directions": directions})))
        rows["proposer"].append(_row(qid, "proposer", later, json.dumps({"directions": [directions[1]]})))
        for direction, query in zip(directions, queries):
            user = f"Question: {question}\nObservations: (none yet)\nState: (empty)\nDirection: {direction}"
            rows["writer"].append(_row(qid, "writer", user, json.dumps({"query": query})))
        consolidate = f"Question: {question}\nObservations: (none yet)\nState: (empty)\nEvidence:\n[1] {evidence}"
        verdict = {"observation": observation, "state": observation, "sufficient": True}
        rows["consolidator"].append(_row(qid, "consolidator", consolidate, json.dumps(verdict)))
        partial = {"observation": evidence.split(". ")[0] + ".", "state": "first hop found", "sufficient": False}
        rows["consolidator"].append(_row(qid, "consolidator", consolidate.split(".")[0], json.dumps(partial)))
        final = f"Question: {question}\nObservations: 1. {observation}\nState: {observation}"
        rows["consolidator"].append(_row(qid, "answer", final, answer))
        rows["consolidator"].append(_row(qid, "answer", final + "\nAnswer briefly.", answer))
    return rows


def write_toy_sft(folder: str | Path, eval_questions: int = 2) -> dict[str, int]:
    """Write the toy set under `folder`; the last `eval_questions` questions go to eval.jsonl. Returns row counts."""
    folder = Path(folder)
    eval_ids = {f"toy-{i:02d}" for i in range(len(QUESTIONS) - eval_questions, len(QUESTIONS))}
    counts = {}
    for adapter, rows in toy_rows().items():
        (folder / adapter).mkdir(parents=True, exist_ok=True)
        train = [r for r in rows if r["question_id"] not in eval_ids]
        evaluation = [r for r in rows if r["question_id"] in eval_ids]
        for split, split_rows in (("train", train), ("eval", evaluation)):
            with (folder / adapter / f"{split}.jsonl").open("w", encoding="utf-8") as handle:
                for row in split_rows:
                    handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        counts[adapter] = len(train)
    return counts


def train_without_writer_rows(root: Path, name: str, extra: dict | None = None) -> tuple[Path, str, list[list[str]]]:
    """The toy SFT set with the writer's rows gone (an empty train.jsonl, as sft-data leaves a role under its floor),
    trained by the real `maps-train train RECIPE --role all` on the tiny Qwen3, its launcher running
    `python -m maps_train.train ...` in this process (one rank) instead of `accelerate launch`. Returns the recipe
    path (adapters under `<root>/adapters`), what the command printed and the launches it made."""
    import pytest
    import yaml
    from typer.testing import CliRunner

    from maps_train.cli import app
    from maps_train.train import launch
    from maps_train.train.__main__ import main

    sft = root / "sft"
    write_toy_sft(sft)
    (sft / "writer" / "train.jsonl").write_text("")
    (sft / "writer" / "eval.jsonl").unlink(missing_ok=True)
    raw = {"name": name,
           "train": {"student": "builtin:tiny-qwen3", "sft_dir": str(sft), "output_dir": str(root / "adapters"),
                     "lora": {"r": 8, "lora_alpha": 16}, "one_launch": True,
                     "sft": {"max_steps": 1, "save_steps": 100, "eval_strategy": "no", "max_length": 512}},
           **(extra or {})}
    recipe = root / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    launches: list[list[str]] = []

    def in_process(command: list[str]) -> int:
        launches.append(command)
        return main(command[command.index("maps_train.train") + 1:])

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        patch.setattr(launch.subprocess, "call", in_process)
        result = CliRunner().invoke(app, ["train", str(recipe), "--role", "all", "--no-plan"])
    assert result.exit_code == 0, result.output
    return recipe, result.output, launches
