"""One role's RL run (`RoleRun`: the role, the adapter it trains, the recipe sections RL's trainer reads) and where
its files are: `<rl.output_dir>/adapters/<adapter>/` (the RL adapters, `rl_summary.json` written last: finished;
`adapters.json` beside them: the adapter set RL leaves, its RL'd adapters and the rest of the set it started from),
`<rl.output_dir>/_trainer/<role>/` (checkpoints, and `reward_settings.json`: what they were trained under),
`<rl.output_dir>/curves-<role>.png`; what a finished role's records say (a resume, or a finished role skipped, under
other reward settings is refused in one line: it would mix, or pass off, two objectives); which rank this process
is."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maps_train.adapters import Adapter, AdapterSet
from maps_train.errors import MapsTrainError
from maps_train.library_options import GRPOOptions
from maps_train.paths import write_text_atomic
from maps_train.recipe import TRAINER_SUBDIR, BackendConfig, Recipe, RLConfig, TrainConfig, adapter_of_role
from maps_train.rl.curves import plot_rl_curves, read_log_history
from maps_train.tracking import WandbConfig
from maps_train.train.markers import RL_SUMMARY_FILE, RL_WRITER, claim

SUMMARY_FILE = RL_SUMMARY_FILE  # in each RL adapter's folder (written last: finished) and in rl.output_dir
ADAPTERS_SUBDIR = "adapters"
REWARD_SETTINGS_FILE = "reward_settings.json"  # in each role's trainer folder: what its checkpoints were trained on


def adapter_name(recipe: Recipe, role: str) -> str:
    """The adapter that writes `role`'s calls, as the recipe's `sft_data.adapter_roles` names it."""
    mapping = adapter_of_role(recipe)
    if role not in mapping:
        raise MapsTrainError(f"rl.roles: '{role}' is no role of sft_data.adapter_roles ({', '.join(sorted(mapping))})")
    return mapping[role]


@dataclass(frozen=True)
class RoleRun:
    """GRPO on one role's adapter, as a recipe sets it: what RL's trainer reads of the recipe, and nothing else (the
    environment, MAPS itself, is given the whole recipe apart). Built once per role by `of`."""

    name: str = field(metadata={"help": "The recipe's name: in run and W&B artefact names."})
    role: str = field(metadata={"help": "The role of rl.roles whose adapter this run trains."})
    adapter: str = field(metadata={"help": "That adapter's name (sft_data.adapter_roles)."})
    rl: RLConfig = field(metadata={"help": "The recipe's rl section."})
    train: TrainConfig = field(metadata={"help": "The student, its precision and a fresh adapter's LoRA."})
    backend: BackendConfig = field(metadata={"help": "TRL's vLLM engine: dtype, context, KV cache on CPU."})
    wandb: WandbConfig = field(metadata={"help": "Weights & Biases, as TRL's integration reads it."})

    @classmethod
    def of(cls, recipe: Recipe, role: str) -> RoleRun:
        return cls(recipe.name, role, adapter_name(recipe, role), recipe.rl, recipe.train, recipe.backend,
                   recipe.wandb)

    # -- its files ------------------------------------------------------------------------------------------
    @property
    def adapters_root(self) -> Path:
        """The adapter set RL writes: its adapters and their manifest (`adapters.json`)."""
        return Path(self.rl.output_dir) / ADAPTERS_SUBDIR

    @property
    def adapter_dir(self) -> Path:
        """Where RL writes this role's adapter."""
        return self.adapters_root / self.adapter

    @property
    def summary_file(self) -> Path:
        """The adapter's rl_summary.json, written last: its presence marks the adapter finished."""
        return self.adapter_dir / SUMMARY_FILE

    @property
    def trainer_dir(self) -> Path:
        """The Trainer's checkpoints and state, and the reward settings they were trained under."""
        return Path(self.rl.output_dir) / TRAINER_SUBDIR / self.role

    @property
    def curves_png(self) -> Path:
        return Path(self.rl.output_dir) / f"curves-{self.role}.png"

    @property
    def curves_title(self) -> str:
        return f"{self.name}: RL of the {self.adapter} adapter"

    def claim_folders(self) -> None:
        """Create the adapter and trainer folders with RL's marker (`maps_train.train.markers`): RL writes only
        into a folder it made or an empty one, never into SFT's checkpoints (resuming from them would ship the SFT
        adapter as RL's)."""
        for folder in (self.adapter_dir, self.trainer_dir):
            claim_folder(folder, self.role)

    def newest_trainer_state(self) -> Path:
        """The Trainer's final trainer_state.json, else (an interrupted run) its newest complete checkpoint's."""
        from maps_train.train import sft

        final = self.trainer_dir / "trainer_state.json"
        checkpoint = sft.last_complete_checkpoint(self.trainer_dir)
        return final if final.is_file() or not checkpoint else Path(checkpoint) / "trainer_state.json"

    # -- what it was trained under --------------------------------------------------------------------------
    def reward_settings(self) -> dict[str, Any]:
        """What decides the role's reward and its advantages: `rl.reward` with `rl.role_reward.<role>` over it, the
        GRPO options that shape the signal and how the branches are decoded (`rl.decoding`: whose sampling noise a
        branch's reward carries). A run resumed, or a finished role skipped, under other settings would mix or pass
        off two objectives as one."""
        rl = self.rl
        grpo = GRPOOptions.of(rl.grpo)
        settings = {"reward": dataclasses.asdict(rl.reward_for(self.role)), "scale_rewards": grpo.scale_rewards,
                    "mask_truncated_completions": grpo.mask_truncated_completions, "beta": grpo.beta,
                    "num_generations": rl.num_generations, "temperature": rl.temperature, "decoding": rl.decoding}
        if rl.decisions != "sampled":  # recorded when set, so runs recorded before the option still resume
            settings["decisions"] = rl.decisions
        return settings

    def check_reward_settings(self, recorded: Any, where: Path) -> None:
        """Refuse in one line to resume or skip a role trained under other reward settings."""
        changed = _settings_differ(recorded, self.reward_settings())
        if changed:
            raise MapsTrainError(f"{where}: rl {self.role} was trained under other reward settings "
                                 f"({', '.join(changed)} differ); use another rl.output_dir, or remove it to retrain")

    def is_finished(self) -> bool:
        """The role's adapter is finished (its summary written last); one trained under other reward settings is
        refused, not skipped."""
        path = self.summary_file
        if not path.is_file():
            return False
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
            recorded, steps = summary.get("reward_settings"), summary.get("global_step")
        except (OSError, ValueError, AttributeError):
            recorded, steps = None, None
        if isinstance(steps, int) and steps < 1:
            return False  # a summary of no GRPO step (written before runs that trained none were refused)
        self.check_reward_settings(recorded, path)
        return True

    def record_reward_settings(self) -> None:
        """Write the role's reward settings beside its checkpoints, or refuse a resume under other ones."""
        path = self.trainer_dir / REWARD_SETTINGS_FILE
        if path.is_file():
            try:
                recorded = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                recorded = None
            self.check_reward_settings(recorded, path)
            return
        write_text_atomic(path, json.dumps(self.reward_settings(), indent=2) + "\n")

    # -- its adapter in the adapter sets --------------------------------------------------------------------
    def trained_roles(self, source: AdapterSet) -> list[str]:
        """The trace roles whose calls this adapter writes (the consolidator adapter also writes "answer"): the
        policy answers all of them, since its weights are what the adapter becomes. Under `rl.init: distilled`, a
        role the adapter in `source` never learned (no SFT row: `sft_data.min_rows_per_role`) is left out: its
        routes send it to the base model, in the environment as when deployed."""
        adapter = source.adapter_of(self.role)
        roles = sorted(adapter.roles)
        if self.rl.init == "distilled" and adapter.learned is not None:
            roles = [r for r in roles if r in adapter.learned] or roles
        return roles

    def policy_start(self, source: AdapterSet) -> Path | None:
        """The adapter the policy starts from: the role's adapter in `source`, the set the environment serves
        too; None for a fresh LoRA: `rl.init: base`, or an adapter that learned nothing (no SFT rows,
        `train.unlearned`: the base model serves its roles, so RL starts there too)."""
        return source.adapter_of(self.role).folder if self.rl.init == "distilled" else None

    def with_rl_adapter(self, adapters: AdapterSet, trained_roles: Sequence[str], parent: str | None = None,
                        sha256: str | None = None) -> AdapterSet:
        """The adapter set RL leaves: `adapters` with this role's adapter replaced by its RL adapter (serving the
        roles it trained), rooted at `<rl.output_dir>/adapters/`; the other adapters stay where they are."""
        rl_adapter = Adapter(self.adapter, self.adapter_dir, adapters.adapter_of(self.role).roles,
                             tuple(trained_roles), "rl", parent, sha256)
        return adapters.with_adapter(rl_adapter, root=self.adapters_root)


def plot_run_curves(recipe: Recipe) -> list[Path]:
    """Redraw each role's curves from its saved Trainer state (`maps-train rl --plot-only`), finished or not."""
    runs = [RoleRun.of(recipe, role) for role in recipe.rl.roles]
    return [plot_rl_curves(read_log_history(run.newest_trainer_state()), run.curves_png, run.curves_title)
            for run in runs]


def launched_world_size() -> int:
    """The ranks `accelerate launch` (torchrun) started, from WORLD_SIZE: known before anything loads."""
    import os

    return int(os.environ.get("WORLD_SIZE") or 1)


def is_main_rank() -> bool:
    """Rank 0 of the launch (RANK, from torchrun; no launcher: the only rank): it writes what is written once."""
    import os

    return int(os.environ.get("RANK") or 0) == 0


def claim_folder(folder: Path, role: str) -> None:
    """Create `folder` with RL's marker, or refuse one another stage wrote (`maps_train.train.markers.claim`)."""
    claim(folder, RL_WRITER, "rl", "set rl.output_dir to a folder of its own", role=role)


def _settings_differ(recorded: Any, current: dict[str, Any]) -> list[str]:
    if not isinstance(recorded, dict):
        return ["(none recorded)"]
    flat = lambda d: {f"{k}.{kk}" if isinstance(v, dict) else k: vv  # noqa: E731
                      for k, v in d.items() for kk, vv in (v.items() if isinstance(v, dict) else [(None, v)])}
    old, new = flat(recorded), flat(current)
    return sorted(key for key in old.keys() | new.keys() if old.get(key) != new.get(key))
