"""The GPU FFT path's steps on the bench cases, and the cost model's FFT rates fitted to them:
a measurement, not a test.

  python -m benchmarks.gpu.fft_steps [--cases NAME ...] [--repeats N] [--json PATH]
  python -m benchmarks.gpu.fft_steps --fit PATH [PATH ...]

The first form runs each bench case's step (benchmarks/gpu/cases.py) with the FFT path
forced, at the default workspace limit and, for the cases in LIMITED, at a tenth of the
workspace it plans there (a fifth or a third where a pass needs more): more, smaller
rounds. It records per case:
  event ms    CUDA-event time of the step, min over the repeats (as bench.py times)
  kernel ms   the step's kernels under torch.profiler, each kernel's time per step
  terms       the cost model's terms per pass (the plan's fft_terms: bytes moved by the
              transforms and plane loads, bytes moved by the spectrum products, launches)
  model ms    the cost model's time of the step, as planned
Needs a CUDA device, torch and tf_largeconv/_cuda; no TensorFlow.

The second form (no device: numpy and scipy) fits the model's three FFT rates
(kTransformBytesPerSec, kProductBytesPerSec, kLaunchSec in cc/core/cuda/fft_plan.cc) to the
event times of those JSON files: nonnegative least squares on the relative error of each
step, as the rates were fitted first, and prints the rates and each step's model / measured
under the rates it was measured with and under the fitted ones.
"""

import argparse
import json

# The cases whose FFT step the fit sees: every bench case the FFT path can run, in both
# dtypes where the bench has both.
CASES = (
  "seed_forward",
  "seed_train",
  "k63_train",
  "replk31_train_f32",
  "replk31_train_f16",
  "slak51_train_f32",
  "slak51_train_f16",
  "k15_train_f16",
  "k21_c32_train",
  "k31_c64_train",
  "k31_c64_train_f16",
  "conv1d_4095_train",
  "transpose31_train",
)
# Also run under a tenth of their planned workspace: rounds-bound steps.
LIMITED = ("seed_forward", "k63_train", "replk31_train_f32")


def _kernels(step, repeats):
  """Each kernel's GPU ms per step under torch.profiler."""
  import torch

  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(repeats):
      step()
    torch.cuda.synchronize()
  kernels = {}
  for evt in prof.key_averages():
    us = evt.device_time_total if hasattr(evt, "device_time_total") else evt.cuda_time_total
    if us > 0:
      kernels[evt.key[:100]] = kernels.get(evt.key[:100], 0.0) + us / repeats / 1e3
  return kernels


def short_name(kernel):
  """A kernel's name as the tables show it: our functor's name, cuFFT's kernel (cufft:) or
  another (other:, say a memset)."""
  if "largeconv::cuda::" in kernel and "ForEachKernel" in kernel:
    return kernel.split("ForEachKernel<largeconv::cuda::")[-1].split("<")[0]
  if "largeconv" in kernel:
    return kernel.split("largeconv::cuda::")[-1].split("<")[0].split("(")[0]
  name = kernel.replace("void ", "").split("<")[0]
  return ("cufft:" if "fft" in kernel.lower() else "other:") + name


def measure(cases, repeats, limited=LIMITED):
  """{"device", "rows"}: a row per case's step, and per case in `limited` one under a
  smaller workspace limit."""
  import torch

  from benchmarks.gpu import bench

  ext = bench.load_extension("_cuda")
  rows = []
  for name in cases:
    case = bench.make_case(ext, name)
    limits = [-1]
    if name in limited:
      planned = max(p["workspace_bytes"] for p in case.plans("fft"))
      for part in (10, 5, 3):  # the smallest part of it every pass can run in
        try:
          case.plans("fft", planned // part)
        except ValueError:
          continue
        limits.append(planned // part)
        break
    for limit in limits:
      plans = case.plans("fft", limit)

      def step(c=case, lim=limit):
        c.ours_step("fft", lim)

      event_ms = bench._time(step, repeats)[0]
      kernels = _kernels(step, 3)
      total = sum(kernels.values())
      fft = sum(v for k, v in kernels.items() if short_name(k).startswith("cufft:"))
      row = {
        "case": name,
        "limit": limit,
        "event ms": event_ms,
        "kernel ms": total,
        "cufft share": fft / total if total else 0.0,
        "model ms": 1e3 * sum(p["cost_fft"] for p in plans),
        "terms": [p.get("fft_terms") for p in plans],
        "plans": [
          {k: p[k] for k in ("pass", "fft", "tile", "items", "chunk") if k in p} for p in plans
        ],
        "kernels": sorted(kernels.items(), key=lambda kv: -kv[1]),
      }
      rows.append(row)
      top = ", ".join(f"{short_name(k)} {v:.3f}" for k, v in row["kernels"][:6])
      print(
        f"{name:<20} limit {limit:>11d}: event {event_ms:7.3f} ms  kernels {total:7.3f}"
        f"  model {row['model ms']:7.3f}  cufft {row['cufft share']:.0%}  [{top}]",
        flush=True,
      )
  return {"device": torch.cuda.get_device_name(), "rows": rows}


def fit(paths):
  """(rates, rows): the nonnegative least-squares rates of the steps in these files."""
  import numpy as np
  from scipy.optimize import nnls

  rows = []
  for path in paths:
    with open(path) as f:
      data = json.load(f)
    rows += [dict(r, device=data["device"]) for r in data["rows"] if all(t for t in r["terms"])]
  # Seconds = transform_bytes / T + product_bytes / P + launches * L, linear in (1/T, 1/P, L).
  a = np.array([[sum(t[i] for t in r["terms"]) for i in range(3)] for r in rows])
  m = np.array([r["event ms"] / 1e3 for r in rows])
  coef, _ = nnls(a / m[:, None], np.ones(len(rows)))
  model = a @ coef
  rates = {
    "kTransformBytesPerSec": 1 / coef[0] if coef[0] else float("inf"),
    "kProductBytesPerSec": 1 / coef[1] if coef[1] else float("inf"),
    "kLaunchSec": coef[2],
  }
  return rates, [
    (r["device"], r["case"], r["limit"], r["event ms"], r["model ms"], 1e3 * s)
    for r, s in zip(rows, model)
  ]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cases", nargs="*", default=list(CASES))
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--json")
  parser.add_argument("--fit", nargs="+", metavar="PATH")
  args = parser.parse_args(argv)
  if args.fit:
    rates, rows = fit(args.fit)
    for k, v in rates.items():
      print(f"{k} = {v:.3g}")
    print("model/measured with the rates the file was measured under, then with the fit:")
    for device, name, limit, measured, before, model in rows:
      print(
        f"{device[:16]:<16} {name:<20} limit {limit:>11d}: measured {measured:8.3f} ms"
        f"  model/measured {before / measured:5.2f} -> {model / measured:5.2f}"
      )
    return
  results = measure(args.cases, args.repeats)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
