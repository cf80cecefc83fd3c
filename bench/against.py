"""The intake of this tree against another git tree's, in one run (`--only intake --against REF`).

The other tree is checked out with `git worktree add` under var/ and installed into its own
venv there (`pip install -e` from the checkout). Each tree migrates its own database on the
same PostgreSQL with its own code, creates a Stripe integration there and is served as its
Procfile's `web` line serves it, with the settings' defaults. The two are loaded in ABBA
order (this tree, the other, the other, this tree per round), each run with fresh Stripe
events signed for it, so a slow patch of this shared machine lands on both.
"""

from __future__ import annotations

import shlex
import statistics
import subprocess
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import cpu
from bench import env as benv
from bench.intake import CONNECTIONS, MAX_RATE, THREADS, Run, Target, accepted_per_s, load_run
from bench.loadgen import presign, stripe_request

VAR = benv.ROOT / "var"
STRIPE_SECRET = "whsec_" + "YmVuY2hTdHJpcGVTZWNyZXRGb3JBZ2FpbnN0"
ROUNDS = 3  # ABBA rounds by default: every round loads each tree twice

# Run by each tree's own interpreter in its own checkout: migrate the database with that
# tree's migrations and create the Stripe integration the load signs for; print its public
# id. It uses only what both trees have (the bench's older trees included).
SETUP = """
import sys
from datetime import UTC, datetime
from pathlib import Path

from ledger.access import audit
from ledger.access.integrations import create_integration
from ledger.access.secrets_box import load_box
from ledger.config import Settings
from ledger.db.engine import upgrade
from ledger.services import ledger_engine

url, var_dir, master_key, secret = sys.argv[1:5]
engine = ledger_engine(Settings(database_url=url, var_dir=Path(var_dir), master_key=master_key))
upgrade(engine)
with engine.begin() as conn:
    integration, _ = create_integration(
        conn, load_box(master_key, Path(var_dir)), audit.Actor(name="bench", role="admin"),
        account="bench", name="bench", profile="stripe", now=datetime.now(UTC),
        tolerance=86400, secret=secret)
engine.dispose()
print(integration.public_id)
"""


@dataclass(frozen=True, slots=True)
class Tree:
    """A source tree and the interpreter of the venv it is installed in."""

    root: Path
    python: Path

    def web(self) -> list[str]:
        """Return the tree's Procfile `web` command, run with its venv's executables."""
        for line in (self.root / "Procfile").read_text().splitlines():
            if line.startswith("web:"):
                command = shlex.split(line.removeprefix("web:"))
                return [str(self.python.parent / command[0]), *command[1:]]
        raise LookupError(f"{self.root}/Procfile has no web line")


def _git(*args: str, cwd: Path = benv.ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def checkout(ref: str) -> Tree:
    """Check `ref` out under var/ (once) and install it into its own venv there (once)."""
    sha = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    root = VAR / f"against-{sha[:7]}"
    if not (root / ".git").exists():
        VAR.mkdir(exist_ok=True)
        _git("worktree", "add", "--detach", str(root), sha)
    python = root / ".venv" / "bin" / "python"
    marker = root / ".venv" / ".installed-against"
    if not marker.exists():
        print(f"-- installing {ref} ({sha[:7]}) into {root / '.venv'} ...", file=sys.stderr,
              flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(root / ".venv")], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-e", str(root)],
                       check=True)
        marker.touch()
    return Tree(root=root, python=python)


def prepare(e: benv.BenchEnv, tree: Tree, name: str) -> tuple[str, str, Path]:
    """Create and migrate this side's database with the tree's own code; return its URL,
    the Stripe integration's public id and the side's var dir."""
    url = e.pg_url(name)
    var_dir = e.tmp / name
    var_dir.mkdir()
    done = subprocess.run([str(tree.python), "-c", SETUP, url, str(var_dir), e.master_key,
                           STRIPE_SECRET], cwd=tree.root, check=True, capture_output=True,
                          text=True)
    return url, done.stdout.strip().splitlines()[-1], var_dir


def signed(e: benv.BenchEnv, tag: str, path: str, seconds: float) -> Path:
    """Pre-sign enough new Stripe events for one run of `seconds` at up to MAX_RATE."""
    prefix = e.tmp / f"against-{tag}"
    presign(prefix, path=path, secret=STRIPE_SECRET, threads=THREADS, tag=tag,
            per_thread=int(MAX_RATE * seconds / THREADS) + 500, sign=stripe_request)
    return prefix


def pair_ratios(runs: dict[str, list[Run]]) -> dict[str, list[float]]:
    """Per adjacent pair of runs (this tree's run and the other's next to it): the ratio
    of accepted/s and of p99, this tree over the other."""
    pairs = list(zip(runs["current"], runs["against"], strict=True))
    return {"accepted": [c.accepted_per_second / a.accepted_per_second for c, a in pairs],
            "p99": [c.wrk.p99_ms / a.wrk.p99_ms for c, a in pairs]}


def noise(ratios: list[float]) -> float:
    """Two standard errors of the mean of the per-pair ratios: how far the ratio moves
    between pairs of runs on this machine, scaled to the number of pairs."""
    if len(ratios) < 2:
        return 0.0
    return float(2 * statistics.stdev(ratios) / len(ratios) ** 0.5)


def measure(e: benv.BenchEnv, ref: str, seconds: float, rounds: int = ROUNDS) -> dict[str, Any]:
    """This tree's intake as shipped against `ref`'s, on the same PostgreSQL, ABBA order."""
    other = checkout(ref)
    trees = {"current": Tree(root=benv.ROOT, python=Path(sys.executable)), "against": other}
    each = max(seconds / 2, 5)
    log = e.tmp / "against.log"
    with ExitStack() as stack:
        sides: dict[str, Target] = {}
        for name, tree in trees.items():
            url, public_id, var_dir = prepare(e, tree, name)
            port = benv.free_port()
            env = e.app_env(url) | {"LEDGER_VAR_DIR": str(var_dir),
                                    "LEDGER_BIND": f"127.0.0.1:{port}"}
            base, process = stack.enter_context(benv.serve(tree.web(), env, cwd=tree.root,
                                                           log=log, port=port))
            sides[name] = Target(base, url, f"/hooks/{public_id}", process.pid)
        for name, target in sides.items():
            load_run(target, signed(e, f"warm-{name}", target.path, 2), 2)
        runs: dict[str, list[Run]] = {name: [] for name in sides}
        for n in range(rounds):
            for half, order in (("a", ["current", "against"]), ("b", ["against", "current"])):
                for name in order:
                    files = signed(e, f"{n}{half}-{name}", sides[name].path, each)
                    runs[name].append(load_run(sides[name], files, each))
    ratios = pair_ratios(runs)
    out: dict[str, Any] = {"ref": ref, "sha": _git("rev-parse", f"{ref}^{{commit}}"),
                           "rounds": rounds, "run_seconds": each,
                           "connections": CONNECTIONS, "threads": THREADS,
                           "pair_ratios": ratios,
                           "accepted_noise": noise(ratios["accepted"]),
                           "p99_noise": noise(ratios["p99"]),
                           "runs": {k: [r.to_json() for r in v] for k, v in runs.items()}}
    for name, side_runs in runs.items():
        out[f"{name}_accepted_per_s"] = accepted_per_s(side_runs)
        out[f"{name}_p99_ms"] = statistics.mean(r.wrk.p99_ms for r in side_runs)
        out[f"{name}_errors"] = sum(r.wrk.errors + r.wrk.status_errors for r in side_runs)
        out[f"{name}_wraps"] = sum(r.wrk.wraps for r in side_runs)
        out[f"{name}_cpu"] = cpu.summed([r.cpu for r in side_runs if r.cpu],
                                        sum(r.wrk.requests for r in side_runs))
    return out
