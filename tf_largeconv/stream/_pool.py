"""The memory a sequence of tensor allocations leaves resident under TensorFlow's CPU
allocator: a model of its best-fit pool, fed the allocations the plan predicts.

On the x86 wheels with oneDNN on, TensorFlow serves CPU tensors of 256 KiB and more from a
best-fit-with-coalescing pool that grows by regions and never returns them to the system;
with TF_CPU_ALLOCATOR_USE_BFC=true the same pool serves every tensor, oneDNN on or off
(`allocator()`). Otherwise malloc serves them, and the plan counts the tensors alive at once,
which malloc's retained heap can exceed (MALLOC_WARNING).
So a process's anonymous resident memory after a run is not its largest set of live tensors
but the pages of the pool's regions that some tensor ever wrote:
- a region is made when no free chunk fits a request, sized 2 MiB doubled until the
  request fits, and the size for the next region doubles again;
- a request takes the smallest free chunk that fits (ties: lowest address), split unless
  the rest is under both the request and 128 MiB;
- a freed chunk merges with free neighbours in its region.

`Pool.touched` is the bytes of regions written so far; requests malloc serves are counted
at their peak (`small_peak`). Some of oneDNN's kernels keep a buffer of their own,
outside the pool, for each shape they have run on, as long as the process lives
(`Pool.keep`: once per key, never freed; `kept`). `Pool.grown` is what the process's
anonymous memory grows by.

Fed a known sequence of tensors, the model gives TensorFlow's own in-use peak exactly and the
measured growth to within a few percent. Fed the plan's tensors of a streamed model, whose
kernels' order and temporaries it knows only in outline, measured growth came to 0.85 to
1.29 times the model's figure (`benchmarks.cpu.stream_memory`'s cases: how the chunks
fall decides how many pages are written): the plan states EXPECTED times it, and sizes
tiles so that WORST times it fits the limit.
"""

from __future__ import annotations

import bisect

from tf_largeconv.planning.device import allocator
from tf_largeconv.planning.device import onednn

GRAIN = 256
SMALL = 256 << 10  # requests below this bypass the pool
SPLIT_REST = 128 << 20  # a chunk is split when the rest is at least the request or this
FIRST_REGION = 2 << 20
EXPECTED, WORST = 1.05, 1.3


__all__ = ["allocator", "onednn", "pooled", "Pool"]


def pooled() -> bool:
  """Whether TensorFlow serves CPU tensors from its pool (`allocator()`, from
  `planning.device`, is not malloc)."""
  return allocator() != "malloc"


MALLOC_WARNING = (
  "memory_limit: TensorFlow serves CPU tensors from malloc in this process (oneDNN off, "
  "TF_CPU_ALLOCATOR_USE_BFC unset), and malloc keeps freed blocks resident: the run can "
  "grow to about twice the plan's figure and past the limit. Set "
  "TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow starts for a limit that holds."
)


class Pool:
  """The pool's chunks, regions and written pages, for `allocator` ("onednn", "bfc" or
  "malloc", as `allocator()`); `alloc` returns a handle for `free`. Requests malloc serves
  (all of them for "malloc", those under SMALL bytes for "onednn") are counted while they
  live. With `keeps`, oneDNN's kernels keep their buffers (`keep`); by default where the
  allocator is oneDNN's."""

  def __init__(self, allocator: str = "onednn", keeps: bool | None = None) -> None:
    if allocator not in ("onednn", "bfc", "malloc"):
      raise ValueError(f"allocator: expected 'onednn', 'bfc' or 'malloc', got {allocator!r}")
    self.pooled = allocator != "malloc"
    self.bypass = SMALL if allocator == "onednn" else 0
    self.keeps = allocator == "onednn" if keeps is None else keeps
    self.next_region = FIRST_REGION
    self.top = GRAIN  # the next region's address (above 0: small requests are <= 0)
    # Chunks as address -> [size, free, region end]; free chunks also in `free_list` sorted
    # by (size, address).
    self.chunks: dict[int, list[int]] = {}
    self.free_list: list[tuple[int, int]] = []
    self.written: list[list[list[int]]] = []  # per region: [start, end) written, merged
    self.regions: list[tuple[int, int]] = []
    self.touched = 0
    self.in_use = 0
    self.peak_in_use = 0
    self.small = 0
    self.small_peak = 0
    self.kept_keys: set[object] = set()
    self.kept = 0

  @property
  def grown(self) -> int:
    """The growth of anonymous memory: the pool's written pages, malloc's requests at their
    peak and what kernels keep. (The in-use total counts whole chunks, whose unsplit tails
    no tensor writes: it can exceed the written pages, which are what the process holds.)"""
    return self.touched + self.small_peak + self.kept

  def keep(self, key: object, nbytes: int) -> None:
    """A buffer of `nbytes` a oneDNN kernel keeps for the life of the process, once per
    `key` (the layer and the shape it ran on); nothing without oneDNN (`keeps` False)."""
    if self.keeps and key not in self.kept_keys:
      self.kept_keys.add(key)
      self.kept += nbytes

  def _insert_free(self, addr: int) -> None:
    bisect.insort(self.free_list, (self.chunks[addr][0], addr))

  def _remove_free(self, addr: int) -> None:
    i = bisect.bisect_left(self.free_list, (self.chunks[addr][0], addr))
    del self.free_list[i]

  def _extend(self, rounded: int) -> None:
    grew = False
    while rounded > self.next_region:
      self.next_region *= 2
      grew = True
    size = self.next_region
    if not grew:
      self.next_region *= 2
    addr = self.top
    self.top += size + GRAIN  # regions are never adjacent: chunks never merge across them
    self.regions.append((addr, addr + size))
    self.written.append([])
    self.chunks[addr] = [size, 1, addr + size]
    self._insert_free(addr)

  def alloc(self, nbytes: int, written: int | None = None) -> int:
    """Takes a chunk for `nbytes` and marks its first `written` bytes written (default
    all: a kernel may write only part of a buffer, and pages never written are not
    resident); one malloc serves: -written (an empty tensor takes nothing: 0)."""
    written = nbytes if written is None else min(written, nbytes)
    if nbytes <= 0:
      return 0
    if nbytes < self.bypass or not self.pooled:
      self.small += written
      self.small_peak = max(self.small_peak, self.small)
      return -written
    rounded = -(-nbytes // GRAIN) * GRAIN
    i = bisect.bisect_left(self.free_list, (rounded, -1))
    if i == len(self.free_list):
      self._extend(rounded)
      i = bisect.bisect_left(self.free_list, (rounded, -1))
    size, addr = self.free_list.pop(i)
    chunk = self.chunks[addr]
    rest = size - rounded
    if size >= 2 * rounded or rest >= SPLIT_REST:
      chunk[0] = rounded
      self.chunks[addr + rounded] = [rest, 1, chunk[2]]
      self._insert_free(addr + rounded)
    chunk[1] = 0
    self.in_use += chunk[0]
    self.peak_in_use = max(self.peak_in_use, self.in_use)
    if written > 0:
      self._write(addr, addr + written)
    return addr

  def _write(self, a: int, b: int) -> None:
    r = bisect.bisect_right(self.regions, (a, float("inf"))) - 1
    spans = self.written[r]
    # Merge [a, b) into the region's sorted, disjoint intervals.
    i = bisect.bisect_left(spans, [a, a])
    if i > 0 and spans[i - 1][1] >= a:
      i -= 1
    j = i
    lo, hi = a, b
    while j < len(spans) and spans[j][0] <= hi:
      lo, hi = min(lo, spans[j][0]), max(hi, spans[j][1])
      j += 1
    before = sum(e - s for s, e in spans[i:j])
    spans[i:j] = [[lo, hi]]
    self.touched += (hi - lo) - before

  def free(self, addr: int | None) -> None:
    if addr is None:
      return
    if addr <= 0:
      self.small += addr
      return
    chunk = self.chunks[addr]
    chunk[1] = 1
    self.in_use -= chunk[0]
    nxt = addr + chunk[0]
    if nxt < chunk[2] and self.chunks[nxt][1]:
      self._remove_free(nxt)
      chunk[0] += self.chunks.pop(nxt)[0]
    prev = self._prev(addr)
    if prev is not None and self.chunks[prev][1]:
      self._remove_free(prev)
      self.chunks[prev][0] += self.chunks.pop(addr)[0]
      addr = prev
    self._insert_free(addr)

  def _prev(self, addr: int) -> int | None:
    """The chunk just below `addr` in its region, if any."""
    r = bisect.bisect_right(self.regions, (addr, float("inf"))) - 1
    start = self.regions[r][0]
    if addr == start:
      return None
    # Walk from the region's start: chunks are contiguous.
    a = start
    while True:
      n = a + self.chunks[a][0]
      if n == addr:
        return a
      a = n
