"""How a process's memory grows with each tf.function it compiles, with and
without XLA (`jit_compile`), on today's stack.

The `local` runner compiles its round functions with XLA. TensorFlow keeps what
it compiled for the life of the process, even after the function is gone, so a
process that builds many runners (a test suite, a long notebook sweep) grows
with every compilation. This measures the growth: N distinct small functions
(a 4-layer MLP's forward pass, a new input width every time so each is
compiled anew), each built, called once and dropped, with the peak resident memory
and the process's memory maps (Linux: /proc/self/maps) read every `--every`
functions. At the kernel's limit on maps (vm.max_map_count) TensorFlow's next
XLA compilation fails and the interpreter ends in a segmentation fault; the
`local` runner refuses to start near it (`local_runner.MAP_HEADROOM`).

  python benchmarks/xla_compile_growth.py --functions=2000          # both modes
  python benchmarks/xla_compile_growth.py --functions=20000 --modes=xla

Each mode runs in its own interpreter. Prints one line per reading and, per
mode, the growth in MB and in maps per compiled function (least-squares
slopes over the readings after the first). Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def child(functions: int, every: int, jit: bool) -> None:
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  import faulthandler
  faulthandler.enable()
  import tensorflow as tf
  tf.get_logger().setLevel("ERROR")
  start = time.time()
  for i in range(functions + 1):

    @tf.function(jit_compile=jit)
    def f(x, w):
      h = tf.nn.relu(tf.matmul(x, w))
      for _ in range(3):
        h = tf.nn.relu(tf.matmul(h, tf.transpose(w)) @ w + 1.0)
      return tf.reduce_sum(h)

    width = 8 + i % 50
    f(tf.ones([4, width]), tf.ones([width, width]))
    del f
    if i % every == 0:
      rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
      with open("/proc/self/maps", "rb") as maps:
        held = sum(1 for _ in maps)
      print(json.dumps({"functions": i, "seconds": round(time.time() - start, 1),
                        "max_rss_mb": round(rss, 1), "maps": held}), flush=True)


def max_map_count() -> str:
  try:
    with open("/proc/sys/vm/max_map_count") as f:
      return f.read().strip()
  except OSError:
    return "unknown"


def slope(points):
  """Least-squares MB per function over (functions, MB) points."""
  n = len(points)
  mx = sum(p[0] for p in points) / n
  my = sum(p[1] for p in points) / n
  sxx = sum((p[0] - mx) ** 2 for p in points)
  return sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else float("nan")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--functions", type=int, default=2000, help="functions to compile per mode")
  p.add_argument("--every", type=int, default=250, help="read the memory every N functions")
  p.add_argument("--modes", default="xla,graph", help="xla (jit_compile=True), graph (False)")
  p.add_argument("--child", choices=("xla", "graph"), help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.functions < 2 * args.every or args.every < 1:
    p.error(f"--functions ({args.functions}) must be at least twice --every ({args.every}) "
            "and --every at least 1")
  if args.child:
    child(args.functions, args.every, args.child == "xla")
    return 0
  status = 0
  for mode in args.modes.split(","):
    if mode not in ("xla", "graph"):
      p.error(f"unknown mode {mode!r}; valid: xla, graph")
    proc = subprocess.Popen([sys.executable, __file__, f"--functions={args.functions}",
                             f"--every={args.every}", f"--child={mode}"],
                            stdout=subprocess.PIPE, text=True)
    points = []
    for line in proc.stdout:
      row = json.loads(line)
      print(mode, line.strip(), flush=True)
      points.append((row["functions"], row["max_rss_mb"], row["maps"]))
    rc = proc.wait()
    if rc:
      print(f"{mode}: the interpreter ended with exit status {rc} after "
            f"{points[-1][0] if points else 0} functions", flush=True)
      status = 1
    if len(points) > 2:
      rest = points[1:]
      print(f"{mode}: {slope([(f, mb) for f, mb, _ in rest]):.3f} MB and "
            f"{slope([(f, m) for f, _, m in rest]):.2f} memory maps per compiled function "
            f"({points[-1][0]} functions, max RSS {points[-1][1]:.0f} MB, {points[-1][2]} maps; "
            f"the kernel's limit: {max_map_count()})", flush=True)
  return status


if __name__ == "__main__":
  sys.exit(main())
