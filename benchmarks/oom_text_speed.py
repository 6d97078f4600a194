"""Print how long the OOM classifier takes on a 256 KiB log tail of three shapes (not a test).

The operator reads up to 256 KiB of a crashed instance's log; the classifier's text patterns run over
all of it. A pattern that rescans a sentence from every position in it is quadratic on long lines, so
the shapes are: many short lines, fewer 2 KB lines, and one 256 KiB line without a full stop. Each time
is the best of five runs of ``classify`` on that incident, and of ``start_up_phase`` on the same text (the
operator reads a crash's log head, up to 256 KiB, for the phase it reached when it was never Ready).

Run: `.venv/bin/python benchmarks/oom_text_speed.py`. To measure another checkout's classifier, put its
``operator`` directory first on PYTHONPATH.
"""

from __future__ import annotations

import time

from loadline.oom import classify, parse_incident, start_up_phase

SIZE = 256 * 1024
SHAPES = {
    "short lines": "INFO worker.py:1] step ok, max_model_len 4096 kv cache usage 10\n",
    "2 KB lines": "INFO model_runner.py:629] max_model_len kv cache " + "x" * 2000 + "\n",
    "one line": "max_model_len " + "y" * SIZE,
}


def main() -> int:
    for name, unit in SHAPES.items():
        text = (unit * (SIZE // len(unit) + 1))[:SIZE]
        incident = parse_incident(
            {"reason": "Error", "message": "CUDA out of memory", "log_tail": text, "ever_ready": True}
        )
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            classify(incident)
            best = min(best, time.perf_counter() - start)
        phase = float("inf")
        for _ in range(5):  # the operator reads a crash's head for its phase before Ready
            start = time.perf_counter()
            start_up_phase(text, whole=True)
            phase = min(phase, time.perf_counter() - start)
        took = f"{best * 1000:7.1f} ms  (start-up phase {phase * 1000:.1f} ms)"
        print(f"{name:<12} {len(text):>7} chars  {took}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
