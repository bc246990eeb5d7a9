"""The crash harness, at a size CI can afford (`make fuzz` runs it far longer)."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_no_process_dies_on_random_calls():
  out = subprocess.run([sys.executable, os.path.join(HERE, "crash_harness.py"), "--workers",
                        "2", "--calls", "150", "--seed", "1"], capture_output=True, text=True,
                       timeout=900, check=False)
  assert "deaths: 0" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
  assert out.stdout.count("worker done") == 2
