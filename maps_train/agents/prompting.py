"""Prompt files: loading, header stripping and rendering into chat messages.

A prompt file (`maps_train/agents/prompts/<name>.txt`, or `<agent.prompts_dir>/<name>.txt` to override) is:

    # header comment lines: what the prompt is for and which slots it fills
    [system]
    ...system message...
    [user]
    ...user message with {{slots}}...

The leading `#` lines are stripped; a file without `[system]`/`[user]` markers is a single user message.
Slots are `{{name}}`, filled in one pass, so braces in retrieved passages are never re-interpreted.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from maps_train.errors import MapsTrainError

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

    def render(self, **values: object) -> list[dict[str, str]]:
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
