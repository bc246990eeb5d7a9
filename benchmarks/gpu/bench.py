"""GPU benchmark: tf_largeconv's CUDA kernels against torch.nn.functional.conv2d (cuDNN with
benchmark mode on, so it picks its fastest algorithm), same device, same run.

  python -m benchmarks.gpu.bench [--cases NAME ...] [--algorithms auto direct fft]
                                 [--repeats N] [--json PATH]

Needs a CUDA device, torch and tf_largeconv/_cuda (`make cuda`); no TensorFlow. Times are
CUDA-event milliseconds (min and median over the repeats, after a warm-up). torch runs twice
for float32 cases: TF32 off (exact float32, as ours) and TF32 on (its fastest). Memory:
  ws   the temporary memory a method takes beyond its operands: for torch, its allocator's
       peak minus the operands; for ours, the workspace the kernels allocate (their only
       temporary, cuFFT's work area included), the largest of the passes run;
  peak the operands (inputs, outputs and gradients of the step) plus ws.
With --algorithms, ours runs once per algorithm; "auto" is what the planner picks (shown per
pass: d = direct, f = FFT). The error column is ours against torch with TF32 off, the largest
over the step's results, relative to each result's largest magnitude. "model ms" is the CUDA
planner's cost model per pass (for cuDNN rows, its cuDNN model). Each case ends with the
route tf_largeconv's 'auto' takes under TensorFlow on this GPU (cuDNN, as TF runs it with
TF32 on, or ours) and whether the measured times agree.
"""

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from benchmarks import gpu
from benchmarks.gpu.cases import CASES
from benchmarks.gpu.cases import STRIDES

gpu.use_test_helpers()
import torch_conv  # noqa: E402
from conftest import load_extension  # noqa: E402

MiB = 2**20


def _time(fn, repeats, budget_ms=3000.0):
  """(min, median) CUDA-event ms of fn after one warm-up call; fewer repeats for slow fns."""
  fn()
  torch.cuda.synchronize()
  times = []
  while len(times) < repeats:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    times.append(start.elapsed_time(end))
    if sum(times) > budget_ms and len(times) >= 2:
      break
  times.sort()
  return times[0], times[len(times) // 2]


def _rel(a, b):
  a, b = a.double(), b.double()
  return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)


def _kwargs(algorithm, limit=-1):
  return dict(
    data_format="NCHW",
    stream=torch.cuda.current_stream().cuda_stream,
    algorithm=algorithm,
    workspace_limit=limit,
  )


class Case:
  """Operands of one case on the device and both methods' step functions."""

  def __init__(self, ext, name):
    x_shape, w_shape, padding, self.mode, dtype = CASES[name]
    self.ext, self.name, self.dtype = ext, name, getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    dt = self.dtype
    self.x = torch.rand(x_shape, device="cuda", generator=gen).to(dt)
    self.w = (torch.randn(w_shape, device="cuda", generator=gen) / (w_shape[0] * w_shape[1])).to(dt)
    self.groups = x_shape[1] // w_shape[2]
    kh, kw = w_shape[:2]
    pt, pl = ((kh - 1) // 2, (kw - 1) // 2) if padding == "SAME" else (0, 0)
    pb, pr = ((kh - 1) - pt, (kw - 1) - pl) if padding == "SAME" else (0, 0)
    self.pads = (pl, pr, pt, pb)
    self.padding = padding
    self.w_oihw = self.w.permute(3, 2, 0, 1).contiguous()
    self.train = self.mode == "train"
    self.xg = self.x.clone().requires_grad_(self.train)
    self.wg = self.w_oihw.clone().requires_grad_(self.train)
    with torch.no_grad():
      y = self._torch_forward(self.x, self.w_oihw)
    self.dy = torch.randn(y.shape, device="cuda", generator=gen).to(dt)
    self.y, self.dx, self.dw = (
      torch.empty_like(y),
      torch.empty_like(self.x),
      torch.empty_like(self.w),
    )

  def _torch_forward(self, x, w):
    return F.conv2d(F.pad(x, self.pads), w, groups=self.groups)

  def torch_step(self):
    if self.train:
      self.xg.grad = self.wg.grad = None
      self._torch_forward(self.xg, self.wg).backward(self.dy)
      return
    with torch.no_grad():
      self._torch_forward(self.x, self.w_oihw)

  def torch_results(self):
    """(y,) or, for a training step, (y, dx, dw) in our layouts from torch with the current
    TF32 setting."""
    if not self.train:
      with torch.no_grad():
        return (self._torch_forward(self.x, self.w_oihw),)
    xg = self.x.clone().requires_grad_(True)
    wg = self.w_oihw.clone().requires_grad_(True)
    y = self._torch_forward(xg, wg)
    y.backward(self.dy)
    return y.detach(), xg.grad, wg.grad.permute(2, 3, 1, 0).contiguous()

  def ours_step(self, algorithm, limit=-1):
    kw, attrs = _kwargs(algorithm, limit), ([1, 1, 1, 1], self.padding)
    self.ext.conv2d(self.x, self.w, self.y, *attrs, **kw)
    if self.train:
      self.ext.conv2d_backprop_input(self.w, self.dy, self.dx, *attrs, **kw)
      self.ext.conv2d_backprop_filter(self.x, self.dy, self.dw, *attrs, **kw)

  def plans(self, algorithm, limit=-1):
    ps = self.ext.plan(
      list(self.x.shape),
      list(self.w.shape),
      [1, 1, 1, 1],
      self.padding,
      data_format="NCHW",
      algorithm=algorithm,
      workspace_limit=limit,
      dtype=str(self.dtype).replace("torch.", ""),
    )
    return ps[: 3 if self.train else 1]

  def routes_to_cudnn(self):
    """Whether tf_largeconv's 'auto' under TensorFlow on this GPU would hand the case to
    TF's own kernel (cuDNN): the CUDA planner's forward plan as
    tf_largeconv.planning.routing.device_routes asks it (grouped cases stay ours)."""
    if self.groups != 1:
      return False
    shape = [self.ext.GPU_ROUTE_BATCH] + list(self.x.shape[1:])
    forward = self.ext.plan(
      shape,
      list(self.w.shape),
      [1, 1, 1, 1],
      self.padding,
      data_format="NCHW",
      dtype=str(self.dtype).replace("torch.", ""),
    )[0]
    return forward["tf_faster"]

  def results(self):
    return (self.y, self.dx, self.dw) if self.train else (self.y,)

  def operand_bytes(self):
    tensors = [self.x, self.w, self.y] + ([self.dy, self.dx, self.dw] if self.train else [])
    return sum(t.numel() * t.element_size() for t in tensors)


class TransposeCase:
  """conv2d_transpose's training step, yt = conv2d_transpose(xt, w) at stride s: ours runs
  the conv2d's input-gradient pass for yt, its forward pass over dyt for d xt and its
  filter-gradient pass (dyt as the conv2d's input, xt as its output gradient) for d w;
  torch runs conv_transpose2d (torch_conv.conv2d_transpose) with autograd."""

  train = True

  def __init__(self, ext, name):
    y_shape, w_shape, self.padding, _, dtype = CASES[name]
    self.ext, self.name, self.dtype = ext, name, getattr(torch, dtype)
    self.stride = s = STRIDES.get(name, 1)
    gen = torch.Generator(device="cuda").manual_seed(0)
    dt = self.dtype
    n, _, h, wd = y_shape
    kh, kw, _, cout = w_shape
    if self.padding == "SAME":
      oh, ow = -(-h // s), -(-wd // s)
    else:
      oh, ow = (h - kh) // s + 1, (wd - kw) // s + 1
    self.y_shape, self.out_hw = list(y_shape), (h, wd)
    self.xt = torch.rand((n, cout, oh, ow), device="cuda", generator=gen).to(dt)
    self.w = (torch.randn(w_shape, device="cuda", generator=gen) / (kh * kw)).to(dt)
    self.dyt = torch.randn(y_shape, device="cuda", generator=gen).to(dt)
    self.yt, self.dxt, self.dw = (
      torch.empty_like(self.dyt),
      torch.empty_like(self.xt),
      torch.empty_like(self.w),
    )
    self.xg = self.xt.clone().requires_grad_(True)
    self.wg = self.w.clone().requires_grad_(True)

  def _torch_forward(self, xt, w):
    return torch_conv.conv2d_transpose(xt, w, self.out_hw, self.stride, self.padding)

  def torch_step(self):
    self.xg.grad = self.wg.grad = None
    self._torch_forward(self.xg, self.wg).backward(self.dyt)

  def torch_results(self):
    xg, wg = self.xt.clone().requires_grad_(True), self.w.clone().requires_grad_(True)
    yt = self._torch_forward(xg, wg)
    yt.backward(self.dyt)
    return yt.detach(), xg.grad, wg.grad

  def results(self):
    return self.yt, self.dxt, self.dw

  def _attrs(self):
    return [1, 1, self.stride, self.stride], self.padding

  def ours_step(self, algorithm, limit=-1):
    kw, attrs = _kwargs(algorithm, limit), self._attrs()
    self.ext.conv2d_backprop_input(self.w, self.xt, self.yt, *attrs, **kw)
    self.ext.conv2d(self.dyt, self.w, self.dxt, *attrs, **kw)
    self.ext.conv2d_backprop_filter(self.dyt, self.xt, self.dw, *attrs, **kw)

  def _plans(self, shape, algorithm="auto", limit=-1):
    return self.ext.plan(
      shape,
      list(self.w.shape),
      *self._attrs(),
      data_format="NCHW",
      algorithm=algorithm,
      workspace_limit=limit,
      dtype=str(self.dtype).replace("torch.", ""),
    )

  def plans(self, algorithm, limit=-1):
    return self._plans(self.y_shape, algorithm, limit)

  def routes_to_cudnn(self):
    """As Case's: conv2d_transpose asks the route of the conv2d it transposes."""
    return self._plans([self.ext.GPU_ROUTE_BATCH] + self.y_shape[1:])[0]["tf_faster"]

  def operand_bytes(self):
    tensors = [self.xt, self.w, self.yt, self.dyt, self.dxt, self.dw]
    return sum(t.numel() * t.element_size() for t in tensors)


def make_case(ext, name):
  """The bench case `name` on the device: a TransposeCase or a Case."""
  return (TransposeCase if CASES[name][3] == "transpose_train" else Case)(ext, name)


def _ours(case, algorithm, repeats, limit=-1):
  plans = case.plans(algorithm, limit)
  ws = max(p["workspace_bytes"] for p in plans)
  chosen = "".join(p["algorithm"][0] for p in plans)
  t = _time(lambda: case.ours_step(algorithm, limit), repeats)
  case.ours_step(algorithm, limit)
  torch.cuda.synchronize()
  label = f"ours {algorithm}" + ("" if limit < 0 else "@ws/10")
  return {
    "method": f"{label}:{chosen}",
    "ms": t,
    "ws": ws,
    "limit": limit,
    "peak": case.operand_bytes() + ws,
    "cost_model_ms": [
      1e3 * (p["cost_fft"] if p["algorithm"] == "fft" else p["cost_direct"]) for p in plans
    ],
  }


def _torch(case, tf32, repeats):
  torch.backends.cuda.matmul.allow_tf32 = tf32
  torch.backends.cudnn.allow_tf32 = tf32
  case.torch_step()
  torch.cuda.synchronize()
  base = torch.cuda.memory_allocated()
  torch.cuda.reset_peak_memory_stats()
  t = _time(case.torch_step, repeats)
  extra = max(torch.cuda.max_memory_allocated() - base, 0)
  return {
    "method": "cudnn tf32" if tf32 else "cudnn",
    "ms": t,
    "ws": extra,
    "peak": case.operand_bytes() + extra,
    "cost_model_ms": [1e3 * p["cost_tf"] for p in case.plans("auto")],
  }


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cases", nargs="*", default=list(CASES))
  parser.add_argument(
    "--algorithms", nargs="*", default=["auto"], choices=["auto", "direct", "fft"]
  )
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--json", help="also write the results here")
  parser.add_argument(
    "--cudnn-heuristics",
    action="store_true",
    help="cuDNN's heuristic choice instead of benchmark mode (its exhaustive "
    "search over the seed case's 135x135 gradients takes minutes)",
  )
  args = parser.parse_args(argv)
  ext = load_extension("_cuda")
  if ext is None or not torch.cuda.is_available():
    sys.exit("needs a CUDA device and tf_largeconv/_cuda (run `make cuda`)")
  torch.backends.cudnn.benchmark = not args.cudnn_heuristics
  print(
    f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
    f"cuDNN {torch.backends.cudnn.version()}"
    f" ({'heuristics' if args.cudnn_heuristics else 'benchmark mode'})"
  )
  print(f"cuFFT: {ext.cufft()}")
  print(
    f"{'case':20s}{'method':>16s}{'min/med ms':>20s}{'cudnn/this':>11s}{'ws MiB':>10s}"
    f"{'peak MiB':>10s}{'rel err':>10s}  model ms",
    flush=True,
  )
  results = []

  def show(r):
    err = f"{r['rel_err']:10.1e}" if "rel_err" in r else " " * 10
    model = " ".join(f"{m:.2f}" for m in r.get("cost_model_ms", []))
    print(
      f"{r['case']:20s}{r['method']:>16s}{r['ms'][0]:10.2f}/{r['ms'][1]:<9.2f}"
      f"{r['cudnn_ms'] / r['ms'][1]:10.2f}x{r['ws'] / MiB:10.1f}{r['peak'] / MiB:10.1f}"
      f"{err}  {model}",
      flush=True,
    )
    record(r)

  def record(r):
    results.append(r)
    if args.json:  # rewritten after every row, so a run cut short keeps what it measured
      with open(args.json, "w") as f:
        json.dump(results, f, indent=1)

  for name in args.cases:
    case = make_case(ext, name)
    base = _torch(case, False, args.repeats)
    base.update(case=name, cudnn_ms=base["ms"][1])
    show(base)
    ref = case.torch_results()
    # TensorFlow runs cuDNN with TF32 on for float32.
    tf_cudnn = base
    if case.dtype == torch.float32:
      tf_cudnn = dict(_torch(case, True, args.repeats), case=name, cudnn_ms=base["ms"][1])
      show(tf_cudnn)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    auto_ms = None
    # Ours per algorithm, then again with a tenth of cuDNN's temporary memory as the limit.
    for algorithm, limit in [(a, -1) for a in args.algorithms] + [("auto", base["ws"] // 10)]:
      try:
        row = _ours(case, algorithm, args.repeats, limit)
      except (ValueError, RuntimeError) as e:
        print(f"{name:20s}{'ours ' + algorithm:>16s}  failed: {e}", flush=True)
        continue
      got = case.results()
      row.update(
        case=name, cudnn_ms=base["ms"][1], rel_err=max(_rel(a, b) for a, b in zip(got, ref))
      )
      show(row)
      if algorithm == "auto" and limit < 0:
        auto_ms = row["ms"][1]
    if auto_ms is not None:
      cudnn_faster = tf_cudnn["ms"][1] < auto_ms
      route = case.routes_to_cudnn()
      verdict = "right" if route == cudnn_faster else "WRONG"
      print(
        f"{name:20s} route under TF: {'cuDNN' if route else 'ours'}; measured faster: "
        f"{'cuDNN' if cudnn_faster else 'ours'} ({verdict})",
        flush=True,
      )
      record(
        {
          "case": name,
          "route": "cudnn" if route else "ours",
          "faster": "cudnn" if cudnn_faster else "ours",
        }
      )
    del case, ref
    torch.cuda.empty_cache()


if __name__ == "__main__":
  main()
