"""The CPU's feature flags as Linux reports them (/proc/cpuinfo): the independent account of
what the machine runs, for the tests of what the package detects."""


def cpu_flags():
  """The flags of the first processor in /proc/cpuinfo (an empty set where there is none)."""
  with open("/proc/cpuinfo") as f:
    for line in f:
      if line.startswith("flags"):
        return set(line.split(":", 1)[1].split())
  return set()
