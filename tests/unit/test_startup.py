"""trainer.startup: each process's start read from /proc, one group's marks, and the driver's report."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from trainer.startup import Marks, latest, process_start, report


def test_a_process_start_is_when_it_was_spawned_not_when_python_asked():
    before = time.time()
    out = subprocess.run([sys.executable, "-c", "import time; time.sleep(0.6); from trainer.startup import Marks; "
                          "import json; m = Marks(); m.mark('late'); print(json.dumps(m.get()))"],
                         capture_output=True, text=True, check=True).stdout
    marks = json.loads(out)
    after = time.time()
    assert list(marks) == ["process", "late"]
    # the process began right after the spawn (clock ticks of 10 ms, and the clocks' reads), not after the sleep
    assert before - 0.05 <= marks["process"] <= before + 0.5
    assert marks["late"] - marks["process"] >= 0.6 and marks["late"] <= after
    here = process_start()
    assert here is not None and here < before


def test_a_group_is_as_late_as_its_slowest_rank_at_each_mark():
    ranks = [{"process": 1.0, "loaded": 5.0, "ready": 9.0}, {"process": 2.0, "loaded": 4.0, "ready": 12.0}]
    assert latest(ranks) == {"process": 2.0, "loaded": 5.0, "ready": 12.0}
    assert latest([]) == {}


def test_the_report_orders_rows_by_their_first_mark_and_names_every_metric():
    origin = 100.0
    rows = {"rollout engine 0": {"process": 130.0, "imported": 141.5, "ready": 200.25},
            "driver": {"process": 100.0, "trainer": 104.0, "step1": 230.0},
            "policy": {"process": 110.0, "ready": 150.0}, "critic": {}}
    line, metrics = report(rows, origin)
    assert line == ("start-up, seconds after the driver's process began: driver: process 0.0, trainer 4.0, step1 "
                    "130.0; policy: process 10.0, ready 50.0; rollout engine 0: process 30.0, imported 41.5, "
                    "ready 100.2")
    assert metrics["startup/rollout_engine_0/ready_s"] == 100.25
    assert metrics["startup/driver/step1_s"] == 130.0
    assert len(metrics) == 8 and not any("critic" in k for k in metrics)


def test_marks_keep_their_order_and_a_copy_is_handed_out():
    m = Marks()
    m.mark("init")
    m.mark("ready")
    got = m.get()
    got["ready"] = 0.0
    assert list(m.get())[-2:] == ["init", "ready"] and m.get()["ready"] > 0
