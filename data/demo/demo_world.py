"""The demo world: a small invented corpus with single-hop and multi-hop questions, generated deterministically.

Everything is fictional (syllable-built names for towns, rivers, provinces, seas, people, companies and bands), so
no model can answer from memory and retrieval has to find the facts. Each fact is stated in exactly one passage
(one passage per entity); entities come in look-alike groups (families sharing a surname, companies and towns
sharing a name root) so that retrieval has near-miss distractors. Questions:

- single: one fact of one entity ("Who founded Kavlin Works?");
- bridge, 2 hops: "In which town was the founder of Kavlin Works born?" (company passage, then person passage);
- bridge, 3 hops: "Which river flows through the birthplace of the founder of Kavlin Works?";
- comparison, 2 hops: "Which company was founded first, Kavlin Works or Kavlin Optics?".

Output (FlashRAG formats): `corpus.jsonl` ({id, title, contents = title + "\\n" + text}), `train.jsonl` and
`test.jsonl` ({id, question, golden_answers, metadata: {hops, type, supporting_paragraphs: [{corpus_id, title}],
decomposition, decomposition_answers}}). Train and test questions are asked about disjoint anchor entities.
Same seed, same bytes: `python data/demo/demo_world.py data/demo` regenerates the committed files.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SEED = 20261130
SPLIT_COUNTS = {  # questions per split and kind, filled scarcest kind first
    "train": {"bridge3": 12, "comparison": 24, "bridge2": 48, "single": 36},
    "test": {"bridge3": 4, "comparison": 8, "bridge2": 16, "single": 12},
}
NUM = {"province": 6, "sea": 4, "river": 12, "town": 40, "person": 120, "company": 50, "band": 36}

_ONSETS = [
    "b",
    "br",
    "d",
    "dr",
    "f",
    "g",
    "gr",
    "h",
    "k",
    "kr",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "st",
    "t",
    "th",
    "v",
    "z",
]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou", "y"]
_CODAS = ["", "", "l", "n", "r", "s", "th", "v", "nd", "rk", "lm", "st"]

OCCUPATIONS = ["glassblower", "surveyor", "cartographer", "beekeeper", "luthier", "archivist", "stonemason", "farrier"]
SUBJECTS = ["geology", "botany", "astronomy", "metallurgy", "linguistics", "hydraulics", "optics", "forestry"]
PRODUCTS = [
    "ceramic valves",
    "wool blankets",
    "bicycle gears",
    "tinned herring",
    "glass lenses",
    "river barges",
    "clock springs",
    "felt hats",
    "copper kettles",
    "paper lanterns",
]
GENRES = ["folk", "jazz", "surf rock", "synth-pop", "brass", "post-punk"]
COMPANY_KINDS = ["Works", "Optics", "Textiles", "Foods", "Instruments", "Motors", "Ceramics", "Shipyards"]
TOWN_ENDINGS = ["vik", "holm", "stad", "ford", "mere", "wick", "dal", "haven"]
SURNAME_ENDINGS = ["sen", "ard", "ell", "ow", "ius", "ley", "mark", "ton"]
FIRST_ENDINGS = ["a", "o", "in", "el", "is", "ric", "ette", "an"]
BAND_PATTERNS = ["The {root} Lanterns", "{root} Static", "The {root} Tide", "{root} Parade", "The {root} Owls"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def _article(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


@dataclass
class Entity:
    kind: str
    name: str
    facts: dict[str, Any] = field(default_factory=dict)
    corpus_id: str = ""
    text: str = ""


class _Names:
    """Invented names: unique, and none a substring of another (so Cover-EM and answer checks stay exact)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: list[str] = []
        self.roots: set[str] = set()

    def root(self, syllables: int = 2) -> str:
        while True:
            parts = [self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)]
            parts += [self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(syllables - 1)]
            word = "".join(parts)
            if 4 <= len(word) <= 9 and word not in self.roots:
                self.roots.add(word)
                return word.capitalize()

    def claim(self, name: str) -> bool:
        low = name.lower()
        if any(low in other or other in low for other in self.used):
            return False
        self.used.append(low)
        return True


def _build_entities(rng: random.Random) -> dict[str, list[Entity]]:
    names = _Names(rng)

    def unique(make) -> str:
        while True:
            name = make()
            if names.claim(name):
                return name

    world: dict[str, list[Entity]] = {}
    world["province"] = [Entity("province", unique(lambda: f"{names.root()} Province")) for _ in range(NUM["province"])]
    world["sea"] = [Entity("sea", unique(lambda: f"{names.root()} Sea")) for _ in range(NUM["sea"])]
    world["river"] = [
        Entity(
            "river",
            unique(lambda: f"{names.root()} River"),
            {
                "sea": rng.choice(world["sea"]).name,
                "source": unique(lambda: f"{names.root()} Hills"),
                "length_km": rng.randrange(40, 400),
            },
        )
        for _ in range(NUM["river"])
    ]
    # Towns in look-alike pairs: one root, two endings (Talvik, Talholm).
    towns = []
    while len(towns) < NUM["town"]:
        root = names.root()
        for ending in rng.sample(TOWN_ENDINGS, 2):
            if len(towns) < NUM["town"] and names.claim(root + ending):
                towns.append(
                    Entity(
                        "town",
                        root + ending,
                        {
                            "province": rng.choice(world["province"]).name,
                            "river": rng.choice(world["river"]).name,
                            "founded": rng.randrange(1150, 1850),
                            "population": rng.randrange(2100, 60000),  # never year-like
                            "group": root,
                            "market_day": rng.choice(WEEKDAYS),
                        },
                    )
                )
    world["town"] = towns
    # People in families of 2-4 sharing a surname.
    people = []
    while len(people) < NUM["person"]:
        surname = names.root() + rng.choice(SURNAME_ENDINGS)
        for _ in range(rng.randrange(2, 5)):
            if len(people) >= NUM["person"]:
                break
            name = unique(lambda surname=surname: f"{names.root(1) + rng.choice(FIRST_ENDINGS)} {surname}")
            people.append(
                Entity(
                    "person",
                    name,
                    {
                        "birthplace": rng.choice(towns).name,
                        "born": rng.randrange(1890, 1990),
                        "studied": rng.choice(SUBJECTS),
                        "occupation": rng.choice(OCCUPATIONS),
                        "group": surname,
                    },
                )
            )
    world["person"] = people
    by_name = {e.name: e for e in towns + people}
    # Founders and singers are distinct people; a company's headquarters (a band's home town) differs from its
    # founder's (singer's) birthplace, so the birthplace fact co-occurs with the person's name in one passage only.
    pool = people[:]
    rng.shuffle(pool)
    companies = []
    while len(companies) < NUM["company"]:
        root = names.root()
        for kind in rng.sample(COMPANY_KINDS, 2):
            if len(companies) >= NUM["company"] or not names.claim(f"{root} {kind}"):
                continue
            founder = pool.pop()
            hq = rng.choice([t for t in towns if t.name != founder.facts["birthplace"]])
            companies.append(
                Entity(
                    "company",
                    f"{root} {kind}",
                    {
                        "founder": founder.name,
                        "founded": min(2024, founder.facts["born"] + rng.randrange(22, 50)),
                        "headquarters": hq.name,
                        "product": rng.choice(PRODUCTS),
                        "employees": rng.randrange(12, 900),  # below every year in the world
                        "group": root,
                    },
                )
            )
    world["company"] = companies
    bands = []
    while len(bands) < NUM["band"]:
        pattern = rng.choice(BAND_PATTERNS)
        name = unique(lambda pattern=pattern: pattern.format(root=names.root()))
        singer = pool.pop()
        home = rng.choice([t for t in towns if t.name != singer.facts["birthplace"]])
        bands.append(
            Entity(
                "band",
                name,
                {
                    "singer": singer.name,
                    "formed": min(2022, max(1960, singer.facts["born"] + rng.randrange(16, 30))),
                    "town": home.name,
                    "genre": rng.choice(GENRES),
                    "album": unique(
                        lambda: f"{names.root()} {rng.choice(['Nights', 'Letters', 'Weather', 'Harbour'])}"
                    ),
                    "group": pattern,
                },
            )
        )
    world["band"] = bands
    assert all(by_name[c.facts["founder"]].facts["birthplace"] != c.facts["headquarters"] for c in companies)
    return world


def _write_passages(world: dict[str, list[Entity]], rng: random.Random) -> list[Entity]:
    """One passage per river, town, person, company and band (provinces and seas are only named)."""

    def pick(*options: str) -> str:
        return rng.choice(options)

    for r in world["river"]:
        f = r.facts
        r.text = " ".join(
            [
                pick(
                    f"The {r.name} rises in the {f['source']} and flows into the {f['sea']}.",
                    f"Rising in the {f['source']}, the {r.name} empties into the {f['sea']}.",
                ),
                f"It is {f['length_km']} kilometres long.",
                pick(
                    "Its lower course is slow and wide, with reed beds along both banks.",
                    "Anglers prize its cold upper reaches, where the water runs clear over gravel.",
                ),
                pick(
                    "Flat-bottomed boats once carried timber and grain down its length.",
                    "Spring floods used to reshape its channel almost every year.",
                ),
                pick(
                    "Herons and otters are common along its quieter stretches, and a towpath follows part of it.",
                    "Several old water mills still stand on its banks, though none of them grinds grain today.",
                ),
            ]
        )
    for t in world["town"]:
        f = t.facts
        t.text = " ".join(
            [
                pick(
                    f"{t.name} is a town in {f['province']}, on the banks of the {f['river']}.",
                    f"{t.name} lies on the {f['river']} in {f['province']}.",
                ),
                pick(f"It was founded in {f['founded']}.", f"The town was founded in {f['founded']}."),
                f"About {f['population']} people live there, and a market is held every {f['market_day']}.",
                pick(
                    "A narrow stone bridge and a clock tower stand beside the old square.",
                    "Its harbour wall and whitewashed warehouses date from the town's trading days.",
                ),
                pick(
                    "Visitors come for the autumn lantern fair and the smoked fish sold at the quay.",
                    "The surrounding farmland is known for apples, barley and slow, heavy horses.",
                ),
            ]
        )
    for p in world["person"]:
        f = p.facts
        surname = p.name.split()[-1]
        p.text = " ".join(
            [
                pick(
                    f"{p.name} was born in {f['birthplace']} in {f['born']}.",
                    f"Born in {f['born']} in {f['birthplace']}, {p.name} grew up near the water.",
                ),
                f"{surname} studied {f['studied']} and later worked as {_article(f['occupation'])}.",
                pick(
                    "Friends remembered a patient, methodical person who kept detailed notebooks.",
                    "In later life the family moved twice, and letters from that time survive.",
                ),
                pick(
                    "A small collection of personal papers is kept by a local archive.",
                    "Neighbours described long walks every evening, whatever the weather.",
                ),
                pick(
                    "A portrait painted by a friend still hangs in the family home.",
                    "Several of those notebooks were later copied by hand and passed around among students.",
                ),
            ]
        )
    for c in world["company"]:
        f = c.facts
        c.text = " ".join(
            [
                pick(
                    f"{c.name} was founded in {f['founded']} by {f['founder']}.",
                    f"{f['founder']} founded {c.name} in {f['founded']}.",
                ),
                f"The company makes {f['product']} and has its headquarters in {f['headquarters']}.",
                f"It employs about {f['employees']} people.",
                pick(
                    "Its first workshop was a rented shed with a single furnace.",
                    "Early orders came mostly from small shops and travelling traders.",
                ),
                pick(
                    "The firm survived two fires and a long strike, and it still publishes an annual catalogue.",
                    "Its delivery vans, painted dark green, are a familiar sight on the regional roads.",
                ),
            ]
        )
    for b in world["band"]:
        f = b.facts
        b.text = " ".join(
            [
                pick(
                    f"{b.name} is a {f['genre']} band formed in {f['town']} in {f['formed']}.",
                    f"Formed in {f['formed']} in {f['town']}, {b.name} plays {f['genre']}.",
                ),
                f"Its lead singer is {f['singer']}.",
                f"The band's debut album was called {f['album']}.",
                pick(
                    "They are known for long concerts that end with an unplugged encore.",
                    "Early rehearsals took place in a disused boathouse.",
                ),
                pick(
                    "Critics praised the album's spare arrangements and its unusual use of field recordings.",
                    "The group toured small halls for years before its songs reached the radio.",
                ),
            ]
        )
    passages = [e for kind in ("river", "town", "person", "company", "band") for e in world[kind]]
    rng.shuffle(passages)  # ids carry no hint of an entity's kind
    for index, entity in enumerate(passages):
        entity.corpus_id = f"demo-{index:04d}"
    return passages


@dataclass
class _Candidate:
    kind: str  # single | bridge2 | bridge3 | comparison
    anchors: tuple[str, ...]  # entities named in the question (decide the split)
    question: str
    answer: str
    hops: list[Entity]  # supporting passages, in hop order
    decomposition: list[str]
    decomposition_answers: list[str]


def _candidates(world: dict[str, list[Entity]]) -> list[_Candidate]:
    e = {x.name: x for kind in ("river", "town", "person", "company", "band") for x in world[kind]}
    out: list[_Candidate] = []
    for c in world["company"]:
        f, founder, hq = c.facts, e[c.facts["founder"]], e[c.facts["headquarters"]]
        birthplace = e[founder.facts["birthplace"]]
        out += [
            _Candidate(
                "single",
                (c.name,),
                f"Who founded {c.name}?",
                founder.name,
                [c],
                [f"Who founded {c.name}?"],
                [founder.name],
            ),
            _Candidate(
                "single",
                (c.name,),
                f"In what year was {c.name} founded?",
                str(f["founded"]),
                [c],
                [f"In what year was {c.name} founded?"],
                [str(f["founded"])],
            ),
            _Candidate(
                "single",
                (c.name,),
                f"What does {c.name} make?",
                f["product"],
                [c],
                [f"What does {c.name} make?"],
                [f["product"]],
            ),
            _Candidate(
                "bridge2",
                (c.name,),
                f"In which town was the founder of {c.name} born?",
                birthplace.name,
                [c, founder],
                [f"Who founded {c.name}?", "In which town was #1 born?"],
                [founder.name, birthplace.name],
            ),
            _Candidate(
                "bridge2",
                (c.name,),
                f"In what year was the founder of {c.name} born?",
                str(founder.facts["born"]),
                [c, founder],
                [f"Who founded {c.name}?", "When was #1 born?"],
                [founder.name, str(founder.facts["born"])],
            ),
            _Candidate(
                "bridge2",
                (c.name,),
                f"In which province is the headquarters town of {c.name}?",
                hq.facts["province"],
                [c, hq],
                [f"In which town does {c.name} have its headquarters?", "In which province is #1?"],
                [hq.name, hq.facts["province"]],
            ),
            _Candidate(
                "bridge3",
                (c.name,),
                f"Which river flows through the birthplace of the founder of {c.name}?",
                birthplace.facts["river"],
                [c, founder, birthplace],
                [f"Who founded {c.name}?", "In which town was #1 born?", "Which river flows through #2?"],
                [founder.name, birthplace.name, birthplace.facts["river"]],
            ),
        ]
        river = e[hq.facts["river"]]
        out.append(
            _Candidate(
                "bridge3",
                (c.name,),
                f"Into which sea flows the river of the town where {c.name} has its headquarters?",
                river.facts["sea"],
                [c, hq, river],
                [
                    f"In which town does {c.name} have its headquarters?",
                    "Which river flows through #1?",
                    "Into which sea does #2 flow?",
                ],
                [hq.name, river.name, river.facts["sea"]],
            )
        )
    for b in world["band"]:
        f, singer, home = b.facts, e[b.facts["singer"]], e[b.facts["town"]]
        singer_town = e[singer.facts["birthplace"]]
        out += [
            _Candidate(
                "single",
                (b.name,),
                f"Who is the lead singer of {b.name}?",
                singer.name,
                [b],
                [f"Who is the lead singer of {b.name}?"],
                [singer.name],
            ),
            _Candidate(
                "bridge2",
                (b.name,),
                f"Which river flows through the town where {b.name} was formed?",
                home.facts["river"],
                [b, home],
                [f"In which town was {b.name} formed?", "Which river flows through #1?"],
                [home.name, home.facts["river"]],
            ),
            _Candidate(
                "bridge2",
                (b.name,),
                f"What subject did the lead singer of {b.name} study?",
                singer.facts["studied"],
                [b, singer],
                [f"Who is the lead singer of {b.name}?", "What subject did #1 study?"],
                [singer.name, singer.facts["studied"]],
            ),
            _Candidate(
                "bridge3",
                (b.name,),
                f"In which province was the lead singer of {b.name} born?",
                singer_town.facts["province"],
                [b, singer, singer_town],
                [f"Who is the lead singer of {b.name}?", "In which town was #1 born?", "In which province is #2?"],
                [singer.name, singer_town.name, singer_town.facts["province"]],
            ),
        ]
    for p in world["person"]:
        town = e[p.facts["birthplace"]]
        out += [
            _Candidate(
                "single",
                (p.name,),
                f"In which town was {p.name} born?",
                town.name,
                [p],
                [f"In which town was {p.name} born?"],
                [town.name],
            ),
            _Candidate(
                "bridge2",
                (p.name,),
                f"In what year was the birthplace of {p.name} founded?",
                str(town.facts["founded"]),
                [p, town],
                [f"In which town was {p.name} born?", "When was #1 founded?"],
                [town.name, str(town.facts["founded"])],
            ),
        ]
    for t in world["town"]:
        river = e[t.facts["river"]]
        out += [
            _Candidate(
                "single",
                (t.name,),
                f"Which river flows through {t.name}?",
                river.name,
                [t],
                [f"Which river flows through {t.name}?"],
                [river.name],
            ),
            _Candidate(
                "bridge2",
                (t.name,),
                f"Into which sea does the river through {t.name} flow?",
                river.facts["sea"],
                [t, river],
                [f"Which river flows through {t.name}?", "Into which sea does #1 flow?"],
                [river.name, river.facts["sea"]],
            ),
        ]

    # Comparisons between look-alikes (same root or family) where possible: retrieval must tell them apart.
    def compare(kind: str, fact: str, template: str, sub: str) -> None:
        items = world[kind]
        for i, a in enumerate(items):
            for b in items[i + 1 :]:
                if a.facts[fact] == b.facts[fact]:
                    continue
                if a.facts["group"] != b.facts["group"]:
                    continue
                earlier = a if a.facts[fact] < b.facts[fact] else b
                out.append(
                    _Candidate(
                        "comparison",
                        (a.name, b.name),
                        template.format(a=a.name, b=b.name),
                        earlier.name,
                        [a, b],
                        [sub.format(x=a.name), sub.format(x=b.name)],
                        [str(a.facts[fact]), str(b.facts[fact])],
                    )
                )

    compare("company", "founded", "Which company was founded first, {a} or {b}?", "When was {x} founded?")
    compare("person", "born", "Who was born earlier, {a} or {b}?", "When was {x} born?")
    compare("town", "founded", "Which town is older, {a} or {b}?", "When was {x} founded?")
    compare("band", "formed", "Which band was formed first, {a} or {b}?", "When was {x} formed?")
    return out


def build_demo_world(seed: int = SEED) -> dict[str, list[dict[str, Any]]]:
    """{"corpus": [...], "train": [...], "test": [...]}: the rows of the three files."""
    rng = random.Random(seed)
    world = _build_entities(rng)
    passages = _write_passages(world, rng)
    # Anchor entities are split 3:1, so no test question names an entity a train question names.
    anchors = sorted(x.name for kind in ("town", "person", "company", "band") for x in world[kind])
    rng.shuffle(anchors)
    test_anchors = set(anchors[: len(anchors) // 4])
    candidates = _candidates(world)
    rng.shuffle(candidates)
    chosen: dict[str, list[_Candidate]] = {"train": [], "test": []}
    used_anchors: set[str] = set()
    for split, counts in SPLIT_COUNTS.items():
        for kind, count in counts.items():
            picked = 0
            for cand in candidates:
                if picked == count:
                    break
                in_split = all((a in test_anchors) == (split == "test") for a in cand.anchors)
                # One question per anchor entity, so questions spread over the world.
                if cand.kind == kind and in_split and not used_anchors & set(cand.anchors):
                    chosen[split].append(cand)
                    used_anchors |= set(cand.anchors)
                    picked += 1
            if picked < count:
                raise RuntimeError(f"demo world: only {picked} {kind} questions for {split}; enlarge NUM")
        rng.shuffle(chosen[split])  # mix the kinds in file order
    kind_meta = {
        "single": ("single", 1),
        "bridge2": ("bridge", 2),
        "bridge3": ("bridge", 3),
        "comparison": ("comparison", 2),
    }
    out: dict[str, list[dict[str, Any]]] = {
        "corpus": [
            {"id": p.corpus_id, "title": p.name, "contents": f"{p.name}\n{p.text}"}
            for p in sorted(passages, key=lambda p: p.corpus_id)
        ]
    }
    for split, cands in chosen.items():
        rows = []
        for index, cand in enumerate(cands):
            qtype, hops = kind_meta[cand.kind]
            rows.append(
                {
                    "id": f"demo-{split}-{index:03d}",
                    "question": cand.question,
                    "golden_answers": [cand.answer],
                    "metadata": {
                        "hops": hops,
                        "type": qtype,
                        "supporting_paragraphs": [{"corpus_id": h.corpus_id, "title": h.name} for h in cand.hops],
                        "decomposition": cand.decomposition,
                        "decomposition_answers": cand.decomposition_answers,
                    },
                }
            )
        out[split] = rows
    return out


def write_demo_world(out_dir: str | Path = "data/demo", seed: int = SEED) -> dict[str, int]:
    """Write corpus.jsonl, train.jsonl and test.jsonl under `out_dir`; returns row counts per file."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, rows in build_demo_world(seed).items():
        with (out_dir / f"{name}.jsonl").open("w", encoding="utf-8", newline="\n") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        counts[name] = len(rows)
    return counts


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "data/demo"
    print(write_demo_world(target))
