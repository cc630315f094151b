"""Training throughput in the logs: tokens per second, next to the loss, in the console, the JSON logs and W&B.

TRL's `SFTTrainer` already counts the non-padding tokens of every batch, summed over ranks (`num_tokens`: the
attention mask's sum, or the flattened length when padding-free/packing). This callback turns that running count
into rates between two log events and over the whole run. It must run before the reporting callbacks so they
see the new keys: `install()` puts it first.
"""

from __future__ import annotations

import time

from transformers import TrainerCallback


class TokensPerSecondCallback(TrainerCallback):
    """Adds `train_tokens_per_second` (since the previous log), `train_tokens_per_second_avg` (since the start)
    and `train_tokens_per_second_per_device` to each training log."""

    def __init__(self) -> None:
        self.start_time: float | None = None
        self.last_time: float | None = None
        self.last_tokens = 0
        self.rates: list[float] = []  # interval rates, for the run summary
        self.total_tokens = 0
        self.total_seconds = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self.start_time = self.last_time = time.perf_counter()
        self.last_tokens = 0

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "num_tokens" not in logs or self.last_time is None:
            return
        now = time.perf_counter()
        tokens = int(logs["num_tokens"])
        interval = now - self.last_time
        if interval > 0 and tokens > self.last_tokens:
            rate = (tokens - self.last_tokens) / interval
            self.rates.append(rate)
            logs["train_tokens_per_second"] = round(rate, 2)
            logs["train_tokens_per_second_per_device"] = round(rate / max(1, args.world_size), 2)
        self.total_tokens = tokens
        self.total_seconds = now - self.start_time
        logs["train_tokens_per_second_avg"] = round(tokens / max(self.total_seconds, 1e-9), 2)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            # The trainer stored its copy of the logs before calling us; keep the history complete too.
            state.log_history[-1].update({k: v for k, v in logs.items() if k.startswith("train_tokens_per_second")})
        self.last_time, self.last_tokens = now, tokens

    def summary(self) -> dict[str, float]:
        return {
            "train_tokens": self.total_tokens,
            "train_seconds": round(self.total_seconds, 3),
            "train_tokens_per_second": round(self.total_tokens / self.total_seconds, 2) if self.total_seconds else 0.0,
        }


def install(trainer, callback: TrainerCallback) -> None:
    """Put `callback` first, so the reporting callbacks (W&B, console, progress bar) see what it adds."""
    trainer.callback_handler.callbacks.insert(0, callback)
