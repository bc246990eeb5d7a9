"""cuFFT's work area against the GPU planner's estimate (the data of the transform), for the
transform sizes and batches the planner asks about: the data behind EstimatedBytes in
cc/core/cuda/fft_plan.cc.

  python -m benchmarks.gpu.cufft_work
"""

from benchmarks import gpu

gpu.use_test_helpers()
from conftest import load_extension  # noqa: E402

SIZES = [
  (36, 36),
  (48, 48),
  (60, 60),
  (64, 64),
  (72, 72),
  (75, 75),
  (80, 80),
  (81, 81),
  (84, 105),
  (96, 96),
  (100, 100),
  (125, 125),
  (128, 128),
  (150, 150),
  (256, 256),
  (98, 98),
  (112, 112),
  (121, 121),
  (169, 169),
  (1, 4096),
]


def main():
  ext = load_extension("_cuda")
  print(f"{'fft':>10s}{'batch':>7s}{'dir':>5s}{'work MiB':>10s}{'data MiB':>10s}{'ratio':>8s}")
  for fh, fw in SIZES:
    for batch in (1, 64, 1024):
      for inverse in (False, True):
        data = batch * fh * (fw // 2 + 1) * 8
        try:
          work = ext.cufft_work_bytes(fh, fw, batch, inverse)
        except (ValueError, RuntimeError, NotImplementedError) as e:
          print(f"{fh:>4d}x{fw:<5d}{batch:7d}{'c2r' if inverse else 'r2c':>5s}  {e}")
          continue
        print(
          f"{fh:>4d}x{fw:<5d}{batch:7d}{'c2r' if inverse else 'r2c':>5s}"
          f"{work / 2**20:10.2f}{data / 2**20:10.2f}{work / data:8.2f}",
          flush=True,
        )


if __name__ == "__main__":
  main()
