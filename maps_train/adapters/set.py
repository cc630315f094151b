"""An adapter set: the role adapters one stage wrote (`train`, `rl`, `distill-on-policy`), read from the manifest
beside them (`adapters.json`), and the one answer to "which route serves role R" and "where is role R's adapter".

The manifest holds, per adapter: its folder (relative to the set when inside it) or null when it holds no weights
(it learned nothing: the base model serves its roles), the trace roles it answers, the roles it learned, the stage
that wrote it, its parent adapter (RL's starting point) and the sha256 of its weights; and for the set: the base
model and its lineage (traces, SFT set). Folders written before the manifest are read once, here, from the records
each adapter folder holds (`train_summary.json`, `rl_summary.json`) and the recipe's role -> adapter mapping.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.paths import write_text_atomic
from maps_train.recipe import RoleRoute

MANIFEST_FILE = "adapters.json"
SFT_SUMMARY_FILE = "train_summary.json"  # an SFT adapter's record, written last: its presence marks it finished
RL_SUMMARY_FILE = "rl_summary.json"  # an RL adapter's record, written last
LEARNED = "learned"  # in SFT_SUMMARY_FILE: false for an adapter that had no rows and holds no weights
WEIGHTS_FILE = "adapter_model.safetensors"
DEFAULT_ROLE = "default"  # the route of every role not listed: the consolidator's
DEFAULT_SOURCE_ROLE = "consolidator"
FORMAT = 1


def weights_sha256(folder: Path | None) -> str | None:
    """The sha256 of an adapter's weights file; None without one."""
    path = Path(folder) / WEIGHTS_FILE if folder else None
    if path is None or not path.is_file():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_record(folder: Path, file: str) -> dict[str, Any] | None:
    """The JSON object in `folder/file` (an adapter's record); None when missing, unreadable or not an object."""
    try:
        record = json.loads((Path(folder) / file).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def learned_nothing(folder: Path) -> bool:
    """Whether `folder`'s SFT record says it had no rows and holds no weights (`maps_train.train.unlearned`)."""
    record = read_record(folder, SFT_SUMMARY_FILE)
    return record is not None and record.get(LEARNED) is False


@dataclass(frozen=True)
class Adapter:
    """One adapter of a set. `folder` None: it holds no weights, the base model serves its roles. `learned` None:
    no record says what it learned (a folder from elsewhere): it serves every role of `roles`."""

    name: str
    folder: Path | None
    roles: tuple[str, ...]
    learned: tuple[str, ...] | None = None
    stage: str = "unknown"  # sft, rl, onpolicy; unknown: read from a folder without a record
    parent: str | None = None  # the adapter it started from (RL), None for a fresh LoRA or SFT
    sha256: str | None = None

    def serves(self, role: str) -> bool:
        """Whether this adapter answers `role` (else the base model does)."""
        return self.folder is not None and role in self.roles and (self.learned is None or role in self.learned)

    @classmethod
    def from_folder(cls, name: str, folder: Path, roles: tuple[str, ...]) -> Adapter:
        """An adapter read from its folder's own record (an RL record first, then an SFT one), or none."""
        rl = read_record(folder, RL_SUMMARY_FILE)
        if rl is not None and isinstance(rl.get("trained_roles"), list):
            return cls(name, folder, roles, tuple(rl["trained_roles"]), "rl", rl.get("source_adapter"),
                       rl.get("rl_sha256"))
        sft = read_record(folder, SFT_SUMMARY_FILE)
        if sft is not None:
            if sft.get(LEARNED) is False:
                return cls(name, None, roles, (), "sft")
            rows = sft.get("rows_per_role")
            learned = tuple(role for role, count in rows.items() if count) if isinstance(rows, dict) else None
            return cls(name, folder, roles, learned, "sft", None, weights_sha256(folder))
        return cls(name, folder, roles, None)

    def to_json(self, root: Path) -> dict[str, Any]:
        folder = None
        if self.folder is not None:
            try:
                folder = str(Path(self.folder).relative_to(root))
            except ValueError:
                folder = str(Path(self.folder).resolve())
        return {"folder": folder, "roles": list(self.roles),
                "learned": None if self.learned is None else list(self.learned),
                "stage": self.stage, "parent": self.parent, "sha256": self.sha256}


@dataclass(frozen=True)
class AdapterSet:
    """The adapters that serve a student's roles. Built by `load` (a folder: its manifest, else its old records)."""

    root: Path
    adapters: dict[str, Adapter]
    base_model: str | None = None
    lineage: dict[str, Any] = field(default_factory=dict)  # traces, sft_set: what the set was trained from
    from_manifest: bool = False

    @classmethod
    def load(cls, root: str | Path, planned: Mapping[str, str]) -> AdapterSet:
        """The set in `root`: its manifest, else (a folder written before manifests) each adapter of `planned`
        (role -> adapter, the recipe's `adapter_of_role`) read from `root/<adapter>` and its records."""
        root = Path(root)
        manifest = root / MANIFEST_FILE
        if manifest.is_file():
            return cls.read_manifest(manifest)
        return cls.from_records(root, planned)

    @classmethod
    def from_records(cls, root: Path, planned: Mapping[str, str], base_model: str | None = None,
                     lineage: Mapping[str, Any] | None = None) -> AdapterSet:
        """The set as its adapter folders' own records say (what `train` writes the manifest from)."""
        by_adapter: dict[str, list[str]] = {}
        for role, adapter in planned.items():
            by_adapter.setdefault(adapter, []).append(role)
        adapters = {name: Adapter.from_folder(name, root / name, tuple(sorted(roles)))
                    for name, roles in by_adapter.items()}
        return cls(root, adapters, base_model, dict(lineage or {}))

    @classmethod
    def read_manifest(cls, path: Path) -> AdapterSet:
        root = path.parent
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            adapters = {}
            for name, entry in data["adapters"].items():
                folder = entry.get("folder")
                learned = entry.get("learned")
                adapters[name] = Adapter(
                    name, None if folder is None else root / folder, tuple(entry["roles"]),
                    None if learned is None else tuple(learned), entry.get("stage", "unknown"), entry.get("parent"),
                    entry.get("sha256"))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise MapsTrainError(f"{path}: not an adapter manifest ({type(err).__name__}: {err}); delete it and "
                                 "rerun the stage that wrote the adapters") from None
        return cls(root, adapters, data.get("base_model"), data.get("lineage") or {}, True)

    def write(self) -> Path:
        """Write the manifest into `root` (atomically); returns its path."""
        data = {"format": FORMAT, "base_model": self.base_model, "lineage": self.lineage,
                "adapters": {name: adapter.to_json(self.root) for name, adapter in self.adapters.items()}}
        path = self.root / MANIFEST_FILE
        self.root.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(data, indent=2) + "\n")
        return path

    # -- the routing questions ------------------------------------------------------------------------------
    def roles(self) -> list[str]:
        return sorted({role for adapter in self.adapters.values() for role in adapter.roles})

    def adapter_of(self, role: str) -> Adapter:
        """The adapter meant to answer `role` (the default route: the consolidator's); a one-line error else."""
        role = DEFAULT_SOURCE_ROLE if role == DEFAULT_ROLE else role
        for adapter in self.adapters.values():
            if role in adapter.roles:
                return adapter
        raise MapsTrainError(f"{self.root}: no adapter answers role '{role}' (its roles: {', '.join(self.roles())})")

    def folder_of(self, role: str) -> Path | None:
        """Where role `role`'s adapter is; None: the base model answers it (its adapter learned nothing, or not
        this role)."""
        adapter = self.adapter_of(role)
        role = DEFAULT_SOURCE_ROLE if role == DEFAULT_ROLE else role
        return adapter.folder if adapter.serves(role) else None

    def served(self) -> dict[str, Path]:
        """Adapter name -> folder of every adapter with weights: what a vLLM server loads."""
        return {name: adapter.folder for name, adapter in self.adapters.items() if adapter.folder is not None}

    def routes(self, template: RoleRoute, base_model: str, enable_thinking: bool,
               via: str = "engine") -> dict[str, RoleRoute]:
        """Role -> route for the student: `engine` (offline vLLM, the adapter folder) or `server` (the served
        adapter's name); a role its adapter does not serve goes to the base model. "default" (every role the set
        names no route for: the answer, say) takes the consolidator's route, or the base model where the set has
        none for it: an adapter that learned only its own role never answers for another."""
        if via not in ("engine", "server"):
            raise MapsTrainError(f"distilled routes: via must be 'engine' or 'server', got '{via}'")
        def route(adapter: str | None) -> RoleRoute:
            return dataclasses.replace(template, backend="openai" if via == "server" else "vllm", model=base_model,
                                       adapter=adapter, enable_thinking=enable_thinking)

        routes = {}
        for role in self.roles():
            folder = self.folder_of(role)
            routes[role] = route(None if folder is None else
                                 (self.adapter_of(role).name if via == "server" else str(folder)))
        if routes:
            routes[DEFAULT_ROLE] = routes.get(DEFAULT_SOURCE_ROLE) or route(None)
        return routes

    # -- new sets from this one -----------------------------------------------------------------------------
    def with_adapter(self, adapter: Adapter, root: Path | None = None) -> AdapterSet:
        """This set with `adapter` in place of the one of its name (an RL'd adapter), rooted at `root`."""
        if adapter.name not in self.adapters:
            raise MapsTrainError(f"{self.root}: no adapter named '{adapter.name}' to replace "
                                 f"(its adapters: {', '.join(self.adapters)})")
        adapters = {**self.adapters, adapter.name: adapter}
        return dataclasses.replace(self, root=root or self.root, adapters=adapters, from_manifest=False)

    def swapped(self, folders: Mapping[str, str]) -> AdapterSet:
        """This set with some adapters' folders replaced (an eval system's `adapters:`). A swapped folder serves
        the roles its own record says it learned (an RL adapter's trained roles, an SFT adapter's rows); with no
        record, those this set's adapter served."""
        unknown = sorted(set(folders) - set(self.adapters))
        if unknown:
            raise MapsTrainError(f"adapters: {', '.join(unknown)}: not an adapter of the set {self.root} "
                                 f"(its adapters: {', '.join(sorted(self.adapters))})")
        adapters = dict(self.adapters)
        for name, folder in folders.items():
            old = self.adapters[name]
            new = Adapter.from_folder(name, Path(folder), old.roles)
            if new.learned is None:
                new = dataclasses.replace(new, learned=tuple(r for r in old.roles if old.serves(r)))
            adapters[name] = new
        return dataclasses.replace(self, adapters=adapters, from_manifest=False)
