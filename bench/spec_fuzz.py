"""Hostile job specs against `orchestrator launch` validation: accepted or refused cleanly, never a
traceback or a hang, and nothing left behind after a refusal.

    python bench/spec_fuzz.py [--examples 1000] [--subprocess 12] [--seed 0] [--verbs-every 1] [--verbs-match TEXT]

Two parts. First, the named hostile specs of bench/hostile_specs.py (issue 21's list: gce storage on this
machine, bad CIDRs, project ids, network and image names with newlines, reserved ports, /proc, inventories
with .inf prices or no host of the GPU, `!!binary`, a 1e-9 deadline, an unprofiled hparam_set; issue 56's
storage in /etc, /, the results DB or the home's own files, LD_PRELOAD in env:, a variable in env: and secrets:,
a secret this machine lacks, ...; 379 of them) through `plan`, `launch --dry-run` and `launch`, printed as a table
per verb: tried, refused cleanly, accepted wrongly, tracebacks, hangs, left anything. Every one must be refused by
every verb (a secret this machine lacks: by `launch` and its dry run; `plan` needs no secret).

Second, generated specs. Hypothesis generates them: mutations of examples/*.yaml (and of a command job and an SSH job)
with hostile values (inf, nan, 1e-300, true as a count, 10k-char strings, control characters, paths
such as /dev/null, /etc/passwd, '..'), arbitrary YAML documents, and hostile files (duplicate keys,
100k-deep nesting, alias bombs, non-UTF-8 bytes, a directory, a FIFO, /dev/null, /etc/passwd as the
spec). Each runs in-process through the check every verb runs before it records a job
(planning/judge.py: load, inventory, planning, budget and deadline; the GCE quota read is left out: it is
a network call, not validation) under a per-spec alarm; a sample also runs as `orchestrator launch --dry-run` in
a subprocess with a timeout. Prints: specs tried, refused cleanly, accepted, tracebacks, hangs, and
refusals that left a file, folder, process or DB row behind.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hostile_specs import Hang, _alarm, _children, _tree  # noqa: E402  (one alarm and leak check for both)

REPO = Path(__file__).resolve().parent.parent
HANG_S = 20  # a spec that takes longer than this to validate counts as a hang
SUBPROCESS_TIMEOUT_S = 90  # a fresh interpreter on a loaded 2-core machine

# ---------------------------------------------------------------- seeds and hostile values

_SEEDS: list[dict[str, Any]] = []
for _p in sorted((REPO / "examples").glob("*.yaml")):
    with contextlib.suppress(Exception):
        _SEEDS.append(yaml.safe_load(_p.read_text()))
_SEEDS += [
    {"name": "cmd", "storage": "./runs",
     "training": {"job": "command", "command": "python train.py", "files": ["train.py", "sub"], "train_steps": 50},
     "cluster": {"workers": [{"gpu": "t4", "count": 2}]}},
    {"name": "mine", "provider": {"kind": "ssh", "inventory": "hosts.yaml"}, "storage": "./runs",
     "cluster": {"workers": [{"gpu": "t4"}]}},
]

HOSTILE = st.sampled_from([
    float("inf"), float("-inf"), float("nan"), 1e-300, 1e300, -1, 0, 10**30, -(10**30), 2**63, True, False, None,
    "", " ", "x" * 10_000, "a\nb", "\x00", "\x1b[31mred", "é" * 70, "..", "../..", "../../etc/passwd", "/",
    "/dev/null", "/etc/passwd", "/tmp", "~", "~/..", "train.py", "sub", "hosts.yaml", "gs://", "gs://b",
    "s3://bucket/x", "1e-300", "nan", "inf", "6h", "-5m", "1e12", "99999999999999999999d", "sync", "async",
    "local", "ssh", "gce", "command", "t4", "k80", "v100", "h100", "us-central1-a", "2019-02", [], {},
    [[[[[[[[[[[[]]]]]]]]]]]], ["..", "/etc/passwd"], ["train.py", "train.py"], {"kind": "local"},
    "/etc", "/usr/lib", "/var", "../orchestrator.db", "../orchestrator.db-wal", {"LD_PRELOAD": "/tmp/x.so"},
    {"PYTHONHOME": "/tmp"}, ["LD_PRELOAD"], ["TOKEN", "TOKEN"], ["0.0.0.0/0"], ["::/0"],
])
PLAUSIBLE = st.sampled_from([1, 2, 4, 8, 0.5, 3600, 100, 32, 64, True, False, "t4", "l4", "v100", "sync", "async",
                             "6h", "./runs", "out", "replace", "shrink", "2019-02"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20), HOSTILE)
VALUES = st.recursive(
    SCALARS, lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=10), kids,
                                                                                 max_size=4)),
    max_leaves=12)
FIELDS = ["name", "provider", "kind", "time_scale", "seed", "revocations", "schedule", "inventory", "project",
          "zones", "api_endpoint", "credentials", "ssh_user", "storage", "training", "job", "command", "files",
          "train_steps", "batch_per_worker", "global_batch", "mode", "hparam_set", "checkpoint_every",
          "cluster", "workers", "gpu", "count", "spot", "zone", "machine_type", "batch", "parameter_servers",
          "search", "gpus", "max_workers", "mixed", "policy", "deadline", "budget_usd", "max_replacements",
          "pricing", "book", "overrides", "at_s", "instance", "emulation_k80_step_s"]


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield (*prefix, i)
            yield from _paths(v, (*prefix, i))


@st.composite
def mutated_example(draw: st.DrawFn) -> Any:
    doc = copy.deepcopy(draw(st.sampled_from(_SEEDS)))
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2, 3]))):
        paths = list(_paths(doc))
        if not paths or not isinstance(doc, dict):
            break
        where = draw(st.sampled_from(paths))
        node: Any = doc
        for key in where[:-1]:
            node = node[key]
        action = draw(st.sampled_from(["set", "set", "set", "drop", "add"]))
        value = copy.deepcopy(draw(st.one_of(PLAUSIBLE, PLAUSIBLE, HOSTILE, VALUES)))  # HOSTILE's [] and {} are shared
        if action == "drop":
            node.pop(where[-1]) if isinstance(node, dict) else node.pop(where[-1])
        elif action == "add" and isinstance(node, dict):
            node[draw(st.sampled_from(FIELDS))] = value
        else:
            node[where[-1]] = value
    return doc


def _dump(doc: Any) -> bytes:
    try:
        return yaml.safe_dump(doc, allow_unicode=True, width=10**6).encode("utf-8", "surrogatepass")
    except (yaml.YAMLError, ValueError, RecursionError):
        return b"name: unrepresentable\n"


RAW_DOCS = st.sampled_from([
    b"name: dup\ncluster: {workers: [{gpu: t4}]}\ncluster: {workers: [{gpu: v100, count: 64, spot: false}]}\n",
    b"name: x\nname: y\ncluster: {workers: [{gpu: t4}]}\n",
    b"name: " + b"[" * 100_000 + b"]" * 100_000 + b"\n",
    b"name: x\ncluster:\n" + b"".join(b"  " * i + b"a:\n" for i in range(1, 2000)),
    b"a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    b"d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\nname: [*e,*e,*e,*e]\n",
    b"name: caf\xe9\ncluster: {workers: [{gpu: t4}]}\n",
    b"\xff\xfe\x00n\x00a\x00m\x00e",
    b"name: x\ncluster: {workers: [{gpu: t4, count: " + b"9" * 100_000 + b"}]}\n",
    b"name: x\ncluster: {workers: [{gpu: t4, count: true}]}\n",
    b"name: x\nprovider: {kind: local, time_scale: 1e-300}\ncluster: {workers: [{gpu: t4}]}\n",
    b"name: x\nprovider: {kind: local, time_scale: .inf}\ncluster: {workers: [{gpu: t4}]}\n",
    b"name: x\npolicy: {budget_usd: .nan}\ncluster: {workers: [{gpu: t4}]}\n",
    b"name: x\nstorage: /dev/null\ncluster: {workers: [{gpu: t4}]}\n",
    b"name: x\nstorage: /etc/passwd/runs\ncluster: {workers: [{gpu: t4}]}\n",
    b"name: x\ntraining: {job: command, command: 'true', files: [../../etc/passwd]}\ncluster: {workers: [{gpu: t4}]}\n",
    b"name: x\ntraining: {job: command, command: 'true', files: [/etc/passwd]}\ncluster: {workers: [{gpu: t4}]}\n",
    b"name: x\ntraining: {job: command, command: 'true', files: [nope.py]}\ncluster: {workers: [{gpu: t4}]}\n",
    b"name: x\nprovider: {kind: ssh, inventory: /etc/passwd}\ncluster: {workers: [{gpu: t4}]}\n",
    b"name: x\nprovider: {kind: ssh, inventory: sub}\ncluster: {workers: [{gpu: t4}]}\n",
    b"name: x\nprovider: {kind: ssh, inventory: /dev/null}\ncluster: {workers: [{gpu: t4}]}\n",
    b"name: x\nsearch: {gpus: [t4, l4, v100, a100, h100], max_workers: 256, max_ps: 16, mixed: true}\n",
    b"name: x\npricing: 7\ncluster: {workers: [{gpu: t4}]}\n",
    b"name: x\n---\nname: y\n", b"", b"\x00\x01\x02", b"\t- a\n", b"!!python/object/apply:os.system ['true']\n",
    b"name: x\ncluster: {workers: [{gpu: t4}]}\n" + b"#" * (2 << 20),
])
SPECIAL = st.sampled_from(["dir", "fifo", "/etc/passwd", "/dev/null", "/dev/zero", "missing"])


def cases() -> st.SearchStrategy[tuple[str, Any]]:
    return st.one_of(
        st.tuples(st.just("mutated"), mutated_example().map(_dump)),
        st.tuples(st.just("arbitrary"), VALUES.map(_dump)),
        st.tuples(st.just("raw"), RAW_DOCS),
        st.tuples(st.just("special"), SPECIAL),
    )


# ---------------------------------------------------------------- running one spec


_KINDS = {"mutated", "arbitrary", "raw", "special"}


def validate_like_launch(path: Path) -> None:
    """What `plan`, `launch --dry-run` and `launch` run before anything is created (less the GCE quota read)."""
    from orchestrator.planning.admission import judge_file

    judge_file(path)


def clean_refusal(exc: BaseException) -> str | None:
    """None if ``exc`` is a clean refusal (field-named, one line per problem); else why not."""
    from orchestrator.model.catalog import CatalogError
    from orchestrator.model.errors import UserError
    from orchestrator.model.spec import SpecError

    if isinstance(exc, SpecError):
        if not exc.errors:
            return "SpecError without errors"
        for e in exc.errors:
            text = str(e)
            if not e.message or "\n" in text or len(text) > 2100 or "Traceback" in text:
                return f"unclean error line: {text[:200]!r}"
        return None
    if isinstance(exc, UserError | CatalogError):
        return None if str(exc).strip() else "empty message"
    return f"{type(exc).__name__}"


@dataclass
class Fuzzer:
    root: Path
    subprocess_every: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    samples: dict[str, list[str]] = field(default_factory=dict)
    sub_counts: Counter[str] = field(default_factory=Counter)

    def _case_dir(self) -> Path:
        d = self.root / f"case-{self.counts['tried']:05d}"
        (d / "sub").mkdir(parents=True)
        (d / "train.py").write_text("print('hi')\n")
        (d / "hosts.yaml").write_text("hosts:\n  - {name: a, host: 127.0.0.1, gpu: t4}\n")
        return d

    def _spec_path(self, d: Path, kind: str, payload: Any) -> Path:
        if kind != "special":
            (d / "spec.yaml").write_bytes(payload)
            return d / "spec.yaml"
        if payload == "dir":
            return d / "sub"
        if payload == "fifo":
            os.mkfifo(d / "spec.yaml")
            return d / "spec.yaml"
        return d / "nope.yaml" if payload == "missing" else Path(payload)

    def note(self, outcome: str, detail: str) -> None:
        self.counts[outcome] += 1
        bucket = self.samples.setdefault(outcome, [])
        if len(bucket) < 5:
            bucket.append(detail[:1500])

    def check(self, kind: str, payload: Any) -> None:
        d = self._case_dir()
        path = self._spec_path(d, kind, payload)
        self.counts["tried"] += 1
        before, kids = _tree(d), _children()
        cwd = os.getcwd()
        os.chdir(d)  # ./runs and other relative storage land in the case folder
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(HANG_S)
        start = time.monotonic()
        try:
            validate_like_launch(path)
            outcome, detail = "accepted", ""
        except Hang:
            outcome, detail = "hangs", f"{kind}: over {HANG_S} s: {payload!r:.300}"
        except Exception as exc:  # classified below: a clean refusal, or a traceback
            why = clean_refusal(exc)
            outcome = "refused cleanly" if why is None else "tracebacks"
            detail = "" if why is None else f"{kind} {payload!r:.300}\n{traceback.format_exc()[-1200:]}"
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
            os.chdir(cwd)
        self.counts["max_ms"] = max(self.counts["max_ms"], int((time.monotonic() - start) * 1000))
        if outcome == "refused cleanly":
            left = (_tree(d) - before) | {f"pid {p}" for p in _children() - kids}
            if left:
                self.note("left behind", f"{payload!r:.200}: {sorted(left)[:5]}")
        self.note(outcome, detail)
        self.counts[f"{kind} {outcome}"] += 1
        if self.subprocess_every and self.counts["tried"] % self.subprocess_every == 0 and kind != "special":
            self.in_subprocess(d, path)

    def in_subprocess(self, d: Path, path: Path) -> None:
        env = {**os.environ, "ORCHESTRATOR_DB_URL": f"sqlite:///{d}/orchestrator.db", "COLUMNS": "80"}
        try:
            out = subprocess.run([sys.executable, "-m", "orchestrator", "launch", "--dry-run", str(path)], cwd=d,
                                 env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.sub_counts["hangs"] += 1
            return
        if "Traceback" in out.stdout + out.stderr:
            self.sub_counts["tracebacks"] += 1
            self.samples.setdefault("subprocess tracebacks", []).append(out.stderr[-1500:])
        else:
            self.sub_counts["accepted" if out.returncode == 0 else "refused cleanly"] += 1
        self.sub_counts["tried"] += 1

    def figures(self) -> dict[str, Any]:
        c = self.counts
        return {"specs tried": c["tried"], "refused cleanly": c["refused cleanly"], "accepted": c["accepted"],
                "tracebacks": c["tracebacks"], "hangs": c["hangs"], "refusals that left something": c["left behind"],
                "slowest validation ms": c["max_ms"],
                "by kind": {k: v for k, v in sorted(c.items()) if k.split()[0] in _KINDS},
                "subprocess": dict(self.sub_counts),
                "db created": any(self.root.glob("*.db"))}


def fuzz(examples: int, root: Path, subprocess_every: int = 0, seed: int = 0) -> Fuzzer:
    """Run ``examples`` generated specs; every example is counted exactly once."""
    fuzzer = Fuzzer(root, subprocess_every)
    os.environ["ORCHESTRATOR_DB_URL"] = f"sqlite:///{root}/orchestrator.db"  # validation must not create it

    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=cases())
    def one(case: tuple[str, Any]) -> None:
        fuzzer.check(*case)

    hypothesis.seed(seed)(one)()  # the same specs on every run with the same seed
    return fuzzer


def verbs_table(every: int, match: str = "") -> None:
    """The named hostile specs through `plan`, `launch --dry-run` and `launch`: the table, then what went wrong."""
    from hostile_specs import HANG_S as VERB_HANG_S
    from hostile_specs import run_suite

    with tempfile.TemporaryDirectory(prefix="spec-verbs-") as tmp:
        t0 = time.monotonic()
        suite = run_suite(Path(tmp), every=every, match=match)
        wall = time.monotonic() - t0
    print(suite.table())
    print(f"({wall:.0f} s; every verb in this process, each under a {VERB_HANG_S} s alarm)")
    for kind, found in suite.samples.items():
        for s in found:
            print(f"--- {kind}:\n{s}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=1000, help="generated specs (0: the named ones only)")
    ap.add_argument("--subprocess", type=int, default=12, help="also run this many specs as a subprocess")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--verbs-every", type=int, default=1, help="run every N-th named hostile spec through the "
                    "three verbs (1: all of them; 0: none)")
    ap.add_argument("--verbs-match", default="", help="only the named hostile specs whose name contains this "
                    "(e.g. 'storage', 'training.env')")
    args = ap.parse_args()
    if args.verbs_every:
        verbs_table(args.verbs_every, args.verbs_match)
    if not args.examples:  # --examples 0: the named specs only
        return
    with tempfile.TemporaryDirectory(prefix="spec-fuzz-") as tmp:
        t0 = time.monotonic()
        every = max(1, args.examples // args.subprocess) if args.subprocess else 0
        fuzzer = fuzz(args.examples, Path(tmp), every, args.seed)
        figures = fuzzer.figures()
        figures["wall s"] = round(time.monotonic() - t0, 1)
    for outcome in ("tracebacks", "hangs", "left behind", "subprocess tracebacks"):
        for s in fuzzer.samples.get(outcome, []):
            print(f"--- {outcome}:\n{s}")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
