"""Prompt files: loading, header stripping and rendering into chat messages.

A prompt file (`maps_train/agents/prompts/<name>.txt`, or `<agent.prompts_dir>/<name>.txt` to override) is:

    # header comment lines: what the prompt is for and which slots it fills
    [system]
    ...system message...
    [user]
    ...user message with {{slots}}...

The leading `#` lines are stripped; a file without `[system]`/`[user]` markers is a single user message.
Slots are `{{name}}`, filled in one pass, so braces in retrieved passages are never re-interpreted.

A slot value may be a `ShrinkableSlot` (observations, passages, a trajectory: pieces the prompt can do without,
least needed first). `render_shrinkable` then also returns a `SlotShrinker`, which the request carries to the
backend: when the prompt does not fit the context, the backend renders it again with fewer pieces, so the system
prompt, the question and the instructions always stay.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from maps_train.errors import MapsTrainError
from maps_train.llm.types import ChatRequest

PACKAGED_PROMPTS = Path(__file__).resolve().parent / "prompts"
_SLOT = re.compile(r"\{\{(\w+)\}\}")
_SECTION = re.compile(r"^\[(system|user)\]\s*$", re.MULTILINE)


@dataclass(frozen=True)
class PromptTemplate:
    name: str
    path: Path
    system: str | None
    user: str

    @property
    def slots(self) -> set[str]:
        return set(_SLOT.findall(self.user)) | set(_SLOT.findall(self.system or ""))

    @property
    def digest(self) -> str:
        return hashlib.sha256(f"{self.system}\0{self.user}".encode()).hexdigest()[:12]

    def render_shrinkable(self, **values: object) -> tuple[list[dict[str, str]], SlotShrinker | None]:
        """The messages, and a shrinker when some slot value is a `ShrinkableSlot` with pieces to leave out."""
        messages = self.render(**values)
        slots = {name: v for name, v in values.items() if isinstance(v, ShrinkableSlot) and v.steps > 0}
        return messages, (SlotShrinker(self, values, slots) if slots else None)

    def render(self, **values: object) -> list[dict[str, str]]:
        values = {name: v.text(0) if isinstance(v, ShrinkableSlot) else v for name, v in values.items()}
        missing = self.slots - set(values)
        if missing:
            raise MapsTrainError(f"{self.path}: no value for slot(s) {', '.join(sorted(missing))}")

        def fill(text: str) -> str:
            return _SLOT.sub(lambda m: str(values[m.group(1)]), text)

        messages = []
        if self.system:
            messages.append({"role": "system", "content": fill(self.system)})
        messages.append({"role": "user", "content": fill(self.user)})
        return messages


@dataclass(frozen=True)
class ShrinkableSlot:
    """A slot value the prompt can shorten: `text(k)` is the value without its k least needed pieces (the
    oldest observation, the lowest-ranked passage, ...; k = 0 is the whole value), for k up to `steps`. Slots
    of one prompt shrink one after the other, lowest `order` first."""

    steps: int
    text: Callable[[int], str]
    order: int = 0


class SlotShrinker:
    """A `PromptShrinker` over a template's shrinkable slots: step s leaves out s pieces, the first slot's (by
    `order`) until it has none left, then the next one's."""

    def __init__(self, template: PromptTemplate, values: dict[str, object], slots: dict[str, ShrinkableSlot]):
        self.template = template
        self.values = values
        self.slots = sorted(slots.items(), key=lambda item: item[1].order)
        self.steps = sum(slot.steps for _, slot in self.slots)

    def messages(self, step: int) -> list[dict[str, str]]:
        filled = dict(self.values)
        for name, slot in self.slots:
            taken = min(max(step, 0), slot.steps)
            filled[name] = slot.text(taken)
            step -= taken
        return self.template.render(**filled)

    def apply(self, request: ChatRequest, step: int) -> ChatRequest:
        return replace(request, messages=self.messages(step))


def parse_prompt_file(path: Path, name: str) -> PromptTemplate:
    lines = path.read_text(encoding="utf-8").splitlines()
    while lines and (lines[0].startswith("#") or not lines[0].strip()):
        lines.pop(0)
    body = "\n".join(lines).strip("\n")
    sections = _SECTION.split(body)
    if len(sections) == 1:
        return PromptTemplate(name=name, path=path, system=None, user=body.strip())
    if sections[0].strip():
        raise MapsTrainError(f"{path}: text before the first [system]/[user] marker")
    parts = dict(zip(sections[1::2], (s.strip() for s in sections[2::2])))
    if "user" not in parts or not parts["user"]:
        raise MapsTrainError(f"{path}: no [user] section")
    return PromptTemplate(name=name, path=path, system=parts.get("system") or None, user=parts["user"])


class PromptLibrary:
    """Prompt templates by name, from `prompts_dir` first (when given), then the packaged files."""

    def __init__(self, prompts_dir: str | Path | None = None):
        self.dirs = ([Path(prompts_dir)] if prompts_dir else []) + [PACKAGED_PROMPTS]
        if prompts_dir and not Path(prompts_dir).is_dir():
            raise MapsTrainError(f"agent.prompts_dir: '{prompts_dir}' is not a folder")
        self._cache: dict[str, PromptTemplate] = {}

    def get(self, name: str) -> PromptTemplate:
        if name not in self._cache:
            for folder in self.dirs:
                path = folder / f"{name}.txt"
                if path.is_file():
                    self._cache[name] = parse_prompt_file(path, name)
                    break
            else:
                raise MapsTrainError(f"prompt '{name}': no {name}.txt in {', '.join(str(d) for d in self.dirs)}")
        return self._cache[name]

    def render(self, name: str, **values: object) -> list[dict[str, str]]:
        return self.get(name).render(**values)

    def render_shrinkable(self, name: str, **values: object) -> tuple[list[dict[str, str]], SlotShrinker | None]:
        return self.get(name).render_shrinkable(**values)
