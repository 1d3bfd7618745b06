"""T(n): what one target forward over n query tokens costs on this machine, as a curve
(``CostCurve``) built from round-robin timings whose ratios cancel load (``curve_from_times``),
and where it is kept. Measuring it runs the model: ``autotune.measure_forward_costs``."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from app.engine.device import cache_dir

# Query sizes (tokens per target forward) at which T(n) is measured. 1 is vanilla decoding.
# Dense below 8: on a CPU the best trees have 1-4 nodes and T(n) there is not linear (it
# steps; benchmarks/engine-notes.md), so interpolating between 1 and 8 would misprice exactly
# the trees that compete.
DEFAULT_SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64)
# Length of the cached prefix the forwards attend to: a short prompt plus some answer.
DEFAULT_PREFIX = 256


# --- T(n): the target's forward cost ---------------------------------------------------------

@dataclass
class CostCurve:
    """Milliseconds of one target forward (decoder stack + LM head) over n query tokens."""

    sizes: list[int]              # n, ascending
    ms: list[float]               # median T(1) x median ratio T(n)/T(1), made non-decreasing in n
    key: dict = field(default_factory=dict)   # what it was measured on (model, device, dtype, ...)
    noise: list[float] = field(default_factory=list)   # per size: relative spread of the ratio (half the IQR / median)

    def rel_noise(self, n: float) -> float:
        """Relative uncertainty of T(n), from the nearest measured size (0 if unknown)."""
        if not self.noise:
            return 0.0
        i = min(range(len(self.sizes)), key=lambda j: abs(self.sizes[j] - n))
        return self.noise[i]

    def __call__(self, n: float) -> float:
        """T(n) in ms, linear between measured sizes, extrapolated from the last two beyond."""
        xs, ys = self.sizes, self.ms
        if n <= xs[0]:
            return ys[0]
        for i in range(1, len(xs)):
            if n <= xs[i]:
                w = (n - xs[i - 1]) / (xs[i] - xs[i - 1])
                return ys[i - 1] + w * (ys[i] - ys[i - 1])
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
        return ys[-1] + slope * (n - xs[-1])


def cost_cache_path(key: dict) -> Path:
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key["model"])
    return cache_dir() / "autotune" / f"cost-{safe}-{key['device']}-{key['dtype']}-{digest}.json"


def save_cost_curve(curve: CostCurve, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(curve), indent=1) + "\n")
    tmp.replace(path)  # atomic: a half-written file is never read back


def load_cost_curve(path: Path) -> CostCurve | None:
    try:
        data = json.loads(Path(path).read_text())
        curve = CostCurve(sizes=[int(s) for s in data["sizes"]], ms=[float(m) for m in data["ms"]],
                          key=dict(data.get("key", {})), noise=[float(x) for x in data.get("noise", [])])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not curve.sizes or len(curve.sizes) != len(curve.ms):
        return None
    return curve


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(xs) - 1)
    return xs[lo] + (pos - lo) * (xs[hi] - xs[lo])


def curve_from_times(sizes: list[int], times: dict[int, list[float]]) -> tuple[list[float], list[float]]:
    """(T(n) in ms, relative noise per size) from round-robin times: repeat r of every size was
    taken within moments of repeat r of size 1, so the ratio times[n][r] / times[1][r] cancels
    whatever load the machine had then. T(n) = median T(1) x median ratio, made non-decreasing
    (a forward over more tokens never costs less; a dip is noise); noise = half the
    interquartile range of the ratios over their median (0 for size 1, the reference)."""
    base = times[1]
    t1 = quantile(base, 0.5)
    ms, noise, running = [], [], 0.0
    for n in sizes:
        ratios = [t / b for t, b in zip(times[n], base) if b > 0]
        med = quantile(ratios, 0.5) if ratios else 1.0
        running = max(running, t1 * med)
        ms.append(running)
        spread = (quantile(ratios, 0.75) - quantile(ratios, 0.25)) / 2 if len(ratios) > 1 else 0.0
        noise.append(0.0 if n == 1 else spread / med if med > 0 else 0.0)
    return ms, noise


# in a curve's key, but not part of what it depends on: the raw timings, the 1-minute load average
# before and after measuring and the thread probe's ms per thread count then (how contended the
# machine was), and for a curve scaled from another thread count's, how (``autotune.kept_cost_curve``)
MEASURED_FIELDS = ("raw_ms", "load", "load_after", "probe_ms", "derived_from")


def cost_curve_text(sizes, ms) -> str:
    """T(n) in one line, for logs and reports: "1: 28 ms, 2: 29 ms, ..." (n query tokens: ms)."""
    return ", ".join(f"{n}: {t:.0f} ms" for n, t in zip(sizes, ms))
