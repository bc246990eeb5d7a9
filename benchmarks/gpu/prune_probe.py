"""Whether pruned 2-D transforms pay on the GPU: a measurement, not a test.

The GPU FFT path keeps each transform as a contiguous plane and runs cuFFT's 2-D real
transforms over a round's planes in one batched call. A pruned transform splits the 2-D
transform into its row pass (real <-> complex along the width) and its column pass (complex
along the height) so that the row pass can skip rows: the forward transform the rows of a
tile that are all zero, the inverse the rows that are not stored. cuFFT's advanced layout
has one batch distance, so the column pass batches over every plane of a round only when
the planes' rows are interleaved, [height][plane][pitch]: the columns of all planes are then
evenly spaced and the kept rows of all planes are one contiguous run.

For the transform sizes the GPU planner picks on the bench cases, this times (CUDA events,
min over repeats, in place, float32) a round's forward and inverse transforms:
  plane    cuFFT's batched 2-D R2C / C2R over contiguous planes (what the path runs)
  split    row and column passes over interleaved planes, every row (the split's own cost)
  pruned   the same with the row pass over the kept rows only
and, with --profile, each bench case's FFT step timed and under torch.profiler
(benchmarks/gpu/fft_steps.py): the share of its GPU time in cuFFT's kernels, which bounds what
pruning can save.

  python -m benchmarks.gpu.prune_probe [--repeats 20] [--profile] [--json PATH]

Needs a CUDA device and torch (cuFFT is the one torch loads); --profile also needs _cuda.
"""

import argparse
import ctypes
import json

import torch

R2C, C2R, C2C = 0x2A, 0x2C, 0x29
FORWARD, INVERSE = -1, 1

# (name, fft_h, fft_w, planes forward, planes inverse, rows kept forward, rows kept
# inverse): the planner's transform size and round for each bench case's forward pass
# (_core.cuda_plan with the case's shapes): a round of `chunk` items, times the source
# channels forward and the destination channels inverse; rows kept: the source tile's
# rows that can hold data, the output tile's rows that are stored. The 21x21 case takes
# 75x80, the size the planner settles on where cuFFT reports its work area (75x75 needs
# twice its data there).
SHAPES = [
  ("seed_forward", 324, 486, 14, 42, 321, 190),
  ("k63_train", 160, 160, 64, 64, 128, 128),
  ("replk31_train", 72, 72, 7 * 128, 7 * 128, 56, 56),
  ("slak51_train", 60, 60, 5 * 256, 5 * 256, 32, 32),
  ("k21_c32_train", 75, 80, 8 * 32, 8 * 32, 64, 64),
]


def _cufft():
  """The cuFFT library torch loaded, through ctypes."""
  torch.fft.rfft(torch.zeros(8, device="cuda"))
  with open("/proc/self/maps") as maps:
    paths = sorted({line.split()[-1] for line in maps if "libcufft.so" in line})
  if not paths:
    raise RuntimeError("torch did not load libcufft")
  lib = ctypes.CDLL(paths[0])
  ll = ctypes.c_longlong
  lib.cufftMakePlanMany64.argtypes = [
    ctypes.c_int,
    ctypes.c_int,
    ctypes.POINTER(ll),
    ctypes.POINTER(ll),
    ll,
    ll,
    ctypes.POINTER(ll),
    ll,
    ll,
    ctypes.c_int,
    ll,
    ctypes.POINTER(ctypes.c_size_t),
  ]
  lib.cufftExecR2C.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
  lib.cufftExecC2R.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
  lib.cufftExecC2C.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
  lib.cufftSetStream.argtypes = [ctypes.c_int, ctypes.c_void_p]
  return paths[0], lib


class Plan:
  """One cufftMakePlanMany64 plan: n (1 or 2 sizes), strides and distances in elements of
  the input and output types (embedded as the plain layout with those strides)."""

  def __init__(self, lib, kind, n, istride, idist, ostride, odist, batch, inembed, onembed):
    self.lib, self.kind = lib, kind
    handle = ctypes.c_int()
    assert lib.cufftCreate(ctypes.byref(handle)) == 0
    self.handle = handle.value

    def arr(v):
      return (ctypes.c_longlong * len(v))(*v)

    work = ctypes.c_size_t()
    rc = lib.cufftMakePlanMany64(
      self.handle,
      len(n),
      arr(n),
      arr(inembed),
      istride,
      idist,
      arr(onembed),
      ostride,
      odist,
      kind,
      batch,
      ctypes.byref(work),
    )
    if rc != 0:
      raise RuntimeError(f"cufftMakePlanMany64 returned {rc} for n={n} batch={batch}")
    self.work = work.value
    lib.cufftSetStream(self.handle, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))

  def __call__(self, ptr, direction=FORWARD):
    p = ctypes.c_void_p(ptr)
    if self.kind == R2C:
      rc = self.lib.cufftExecR2C(self.handle, p, p)
    elif self.kind == C2R:
      rc = self.lib.cufftExecC2R(self.handle, p, p)
    else:
      rc = self.lib.cufftExecC2C(self.handle, p, p, direction)
    assert rc == 0, rc

  def close(self):
    self.lib.cufftDestroy(self.handle)


def _time(fn, repeats):
  fn()
  torch.cuda.synchronize()
  best = float("inf")
  for _ in range(repeats):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    best = min(best, start.elapsed_time(end))
  return best


def _plans(lib, fh, fw, planes, kept, inverse):
  """Callables for one direction of a round: plane (2-D batched), split and pruned."""
  cw = fw // 2 + 1
  pitch = 2 * cw
  if not inverse:
    plane = Plan(lib, R2C, [fh, fw], 1, fh * pitch, 1, fh * cw, planes, [fh, pitch], [fh, cw])
  else:
    plane = Plan(lib, C2R, [fh, fw], 1, fh * cw, 1, fh * pitch, planes, [fh, cw], [fh, pitch])
  # Interleaved: row (r, p) at (r * planes + p) * pitch reals; column (p, c) of complex
  # values at stride planes * cw, columns one apart.
  col = Plan(lib, C2C, [fh], planes * cw, 1, planes * cw, 1, planes * cw, [fh], [fh])
  rows = {}
  for n_rows in sorted({fh, kept}):
    if not inverse:
      rows[n_rows] = Plan(lib, R2C, [fw], 1, pitch, 1, cw, n_rows * planes, [fw], [cw])
    else:
      rows[n_rows] = Plan(lib, C2R, [fw], 1, cw, 1, pitch, n_rows * planes, [cw], [fw])

  def split(p, n):
    if inverse:
      col(p, INVERSE)
      rows[n](p)
    else:
      rows[n](p)
      col(p, FORWARD)

  all_plans = [plane, col] + list(rows.values())
  work = max(p.work for p in all_plans)
  return plane, (lambda p: split(p, fh)), (lambda p: split(p, kept)), all_plans, work


def _check(lib, fh, fw, planes, kept, inverse):
  """The pruned split against torch's FFT on the kept rows: relative error."""
  cw = fw // 2 + 1
  pitch = 2 * cw
  gen = torch.Generator(device="cuda").manual_seed(0)
  _, _, pruned, plans, _ = _plans(lib, fh, fw, planes, kept, inverse)
  buf = torch.zeros(fh, planes, pitch, device="cuda")
  if not inverse:
    x = torch.zeros(planes, fh, fw, device="cuda")
    x[:, :kept] = torch.randn(planes, kept, fw, device="cuda", generator=gen)
    buf[:, :, :fw] = x.permute(1, 0, 2)
    pruned(buf.data_ptr())
    got = torch.view_as_complex(buf.view(fh, planes, cw, 2)).permute(1, 0, 2)
    want = torch.fft.rfft2(x)
  else:
    spec = torch.fft.rfft2(torch.randn(planes, fh, fw, device="cuda", generator=gen))
    buf.copy_(torch.view_as_real(spec.permute(1, 0, 2).contiguous()).reshape(fh, planes, pitch))
    pruned(buf.data_ptr())
    got = buf.permute(1, 0, 2)[:, :kept, :fw]
    want = (torch.fft.irfft2(spec, s=(fh, fw)) * (fh * fw))[:, :kept]
  for p in plans:
    p.close()
  return ((got - want).abs().max() / want.abs().max()).item()


def _probe(lib, shape, repeats):
  name, fh, fw, planes_f, planes_i, kept_f, kept_i = shape
  out = {"case": name, "fft": [fh, fw]}
  for label, planes, kept, inverse in (
    ("forward", planes_f, kept_f, False),
    ("inverse", planes_i, kept_i, True),
  ):
    cw = fw // 2 + 1
    data = torch.randn(planes * fh * 2 * cw, device="cuda")
    ptr = data.data_ptr()
    plane, split, pruned, plans, work = _plans(lib, fh, fw, planes, kept, inverse)
    row = {
      "planes": planes,
      "rows kept": kept,
      "cufft work MiB": work / 2**20,
      "plane ms": _time(lambda f=plane, p=ptr: f(p), repeats),
      "split ms": _time(lambda f=split, p=ptr: f(p), repeats),
      "pruned ms": _time(lambda f=pruned, p=ptr: f(p), repeats),
      "pruned rel err": _check(lib, fh, fw, planes, kept, inverse),
    }
    for p in plans:
      p.close()
    row["pruned / plane"] = row["pruned ms"] / row["plane ms"]
    out[label] = row
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument(
    "--profile",
    nargs="*",
    default=None,
    help="bench cases to profile (none named: the probe's cases)",
  )
  parser.add_argument("--json")
  args = parser.parse_args(argv)
  path, lib = _cufft()
  print("cuFFT:", path, "GPU:", torch.cuda.get_device_name(), flush=True)
  results = {"cufft": path, "device": torch.cuda.get_device_name(), "shapes": []}
  for shape in SHAPES:
    r = _probe(lib, shape, args.repeats)
    results["shapes"].append(r)
    for d in ("forward", "inverse"):
      x = r[d]
      print(
        f"{r['case']:<14} {d:<8} {r['fft'][0]:4d}x{r['fft'][1]:<4d} planes {x['planes']:5d}"
        f" kept {x['rows kept']:3d}: plane {x['plane ms']:.3f}  split {x['split ms']:.3f}"
        f"  pruned {x['pruned ms']:.3f} ms  (pruned/plane {x['pruned / plane']:.2f},"
        f" err {x['pruned rel err']:.1e}, work {x['cufft work MiB']:.1f} MiB)",
        flush=True,
      )
  if args.profile is not None:
    cases = args.profile or [
      "seed_forward",
      "k63_train",
      "replk31_train_f32",
      "slak51_train_f32",
      "k21_c32_train",
    ]
    from benchmarks.gpu import fft_steps

    results["profile"] = fft_steps.measure(cases, args.repeats, limited=())["rows"]
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
