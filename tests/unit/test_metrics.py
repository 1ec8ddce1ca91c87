import json

from trainer.metrics import MetricsLogger, Timer, parse_log_line


def test_log_writes_jsonl_and_a_tool_line(tmp_path):
    lines: list[str] = []
    logger = MetricsLogger(str(tmp_path / "m.jsonl"), print_fn=lambda s, flush=True: lines.append(s))
    logger.plan(total_steps=7)
    logger.log(3, {"reward/mean": 0.25, "timing/generate": 1.5})
    logger.close()
    row = json.loads((tmp_path / "m.jsonl").read_text())
    assert row["step"] == 3 and row["reward/mean"] == 0.25
    parsed = [parse_log_line(s) for s in lines]
    assert parsed[0] == ("plan", {"total_steps": 7})
    assert lines[1].startswith("step 3: reward/mean=0.25") and "generate=1.50s" in lines[1]
    kind, payload = parsed[2]
    assert kind == "metrics" and payload["step"] == 3 and payload["timing/generate"] == 1.5


def test_parse_log_line_ignores_other_lines():
    assert parse_log_line("step 3: reward/mean=0.25") is None
    assert parse_log_line("@metrics not json") is None
    assert parse_log_line("@metrics [1, 2]") is None
    assert parse_log_line('  @metrics {"step": 1}') is None


def test_timer_accumulates():
    timer = Timer()
    for _ in range(2):
        with timer("x"):
            pass
    assert set(timer.times) == {"timing/x"} and timer.times["timing/x"] >= 0
