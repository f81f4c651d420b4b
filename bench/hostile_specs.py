"""Named hostile specs (issue 21's list and its neighbours) through the three verbs that read a spec:
`orchestrator plan`, `launch --dry-run` and `launch` (``--detach``: the same checks as a foreground launch,
up to the job row; what a wrongly accepted spec would then run is not started).

Every case is a spec a user might write by mistake or an attacker on purpose; every one must be refused
cleanly by every verb (exit 2, an "error:" message, no traceback) within HANG_S, leaving nothing behind: no
file or folder in the spec's folder, no results DB, no home folder, no process. A few valid specs (the
bases) are run through `plan` and `launch --dry-run` as controls: they must be accepted, so a refusal is not
simply everything being refused.

The verbs run in this process (the real CLI entry point, argv and exit code), each under an alarm; a fresh
interpreter per call would make the ~1,000 calls take half an hour on a loaded 2-core machine.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import signal
import sys
import sysconfig
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

HANG_S = 60  # a verb that takes longer on a hostile spec counts as a hang
VERBS = (("plan",), ("launch", "--dry-run"), ("launch", "--detach"))

# ---------------------------------------------------------------- valid bases

_TINY = {"job": "resnet-cifar", "hparam_set": "resnet_cifar_15", "problem": "image_cifar10", "train_steps": 100,
         "batch_per_worker": 32, "checkpoint_every": 50}
BASES: dict[str, dict[str, Any]] = {
    "local": {"name": "fz-local", "provider": {"kind": "local", "time_scale": 3600}, "storage": "./runs",
              "training": dict(_TINY, mode="sync"), "cluster": {"workers": [{"gpu": "k80", "count": 1}]},
              "pricing": {"book": "2019-02"}},
    "command": {"name": "fz-cmd", "storage": "./runs",
                "training": {"job": "command", "command": "python train.py", "files": ["train.py"],
                             "train_steps": 50},
                "cluster": {"workers": [{"gpu": "k80", "count": 1}]}, "pricing": {"book": "2019-02"}},
    "run": {"name": "fz-run", "storage": "./runs",
            "training": {"run": "python train.py --steps 10", "files": ["train.py"], "train_steps": 10},
            "cluster": {"workers": [{"gpu": "v100", "count": 1, "spot": False}]}, "pricing": {"book": "2019-02"}},
    "ssh": {"name": "fz-ssh", "provider": {"kind": "ssh", "inventory": "hosts.yaml"}, "storage": "./runs",
            "training": dict(_TINY, mode="sync"), "cluster": {"workers": [{"gpu": "t4", "count": 2}]}},
    "gce": {"name": "fz-gce", "provider": {"kind": "gce", "project": "my-project-1", "zones": ["us-central1-a"],
                                           "ssh_source_ranges": ["203.0.113.7/32"]},
            "storage": "gs://my-bucket/fz", "training": dict(_TINY, mode="sync"),
            "cluster": {"workers": [{"gpu": "t4", "count": 1}]}},
}
# Priced as the ledger bills them (an unpriced host is free, and then no budget, however small, is exceeded).
INVENTORY = {"hosts": [{"name": "a", "host": "127.0.0.1", "gpu": "t4", "price_per_hour": 0.35},
                       {"name": "b", "host": "127.0.0.2", "gpu": "t4", "price_per_hour": 0.35},
                       {"name": "c", "host": "127.0.0.3", "price_per_hour": 0.1}]}


@dataclass(frozen=True)
class Case:
    name: str
    base: str
    text: str  # the spec file
    inventory: str | None = None  # hosts.yaml, when the case is about the inventory
    verbs: tuple[tuple[str, ...], ...] = VERBS  # the verbs that must refuse it (a secret: not `plan`)


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node: Any = out
    keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split(".")]
    for k in keys[:-1]:
        node = node.setdefault(k, {}) if isinstance(node, dict) else node[k]
    node[keys[-1]] = value
    return out


def _dump(doc: Any) -> str:
    return yaml.safe_dump(doc, allow_unicode=True, width=10**6, sort_keys=False)


# ---------------------------------------------------------------- the hostile values, by where they go

GENERIC: list[tuple[str, Any]] = [
    ("name", "Bad Name"), ("name", "x\ny"), ("name", ""), ("name", "a" * 40), ("name", "-x"),
    ("storage", "/proc"), ("storage", "/dev/shm/../../proc/self"), ("storage", "/sys/kernel"), ("storage", "/dev"),
    ("storage", "/dev/null"), ("storage", "/etc/passwd"), ("storage", "runs\nx"), ("storage", "s3://bucket/x"),
    ("storage", "gs://"), ("storage", "gs://B"), ("storage", "\x00"), ("storage", "/etc/passwd/runs"),
    ("policy.deadline", 1e-9), ("policy.deadline", 0), ("policy.deadline", -1), ("policy.deadline", "5s"),
    ("policy.deadline", 59), ("policy.deadline", "soon"), ("policy.deadline", True), ("policy.deadline", "1e-9"),
    ("policy.budget_usd", 0), ("policy.budget_usd", -1), ("policy.budget_usd", 1e-9),
    ("policy.max_replacements", -1), ("training.train_steps", 0), ("training.train_steps", 10**30),
    ("training.train_steps", True), ("training.batch_per_worker", 10**9), ("cluster.workers.0.gpu", "nope"),
    ("cluster.workers.0.gpu", "k80\nx"), ("cluster.workers.0.count", 0), ("cluster.workers.0.count", 1000),
    ("cluster.workers.0.count", True), ("pricing.book", "nope"), ("pricing", 7), ("nmae", "typo"),
    ("cluster.workers.0.zone", "../x"),
]
RAW_GENERIC = [  # YAML a safe reader must refuse, spliced in place of a line of the base
    ("name", "name: !!binary aGVsbG8="), ("name", "name: !!str fz-x"), ("name", "name: !!python/name:os.system"),
    ("name", "name: !custom fz"), ("storage", "storage: !!binary Li9ydW5z"),
]
GCE: list[tuple[str, Any]] = [
    ("storage", "./runs"), ("storage", "/tmp/fz-runs"), ("storage", "runs"), ("storage", "~/runs"),
    ("provider.ssh_source_ranges", ["999.999.999.999/99"]), ("provider.ssh_source_ranges", ["10.0.0.1/8"]),
    ("provider.ssh_source_ranges", ["1.2.3.4/24"]), ("provider.ssh_source_ranges", ["0.0.0.0"]),
    ("provider.ssh_source_ranges", ["0.0.0.0/33"]),
    ("provider.ssh_source_ranges", ["abc"]), ("provider.ssh_source_ranges", ["10.0.0.0/8\n"]),
    ("provider.ssh_source_ranges", ["::1/129"]), ("provider.ssh_source_ranges", ["10.0.0.0/8 1.2.3.4/32"]),
    ("provider.project", "../../x/y/zz"), ("provider.project", "My-Project"), ("provider.project", "p"),
    ("provider.project", "a" * 31), ("provider.project", "1project"), ("provider.project", "proj_ect"),
    ("provider.project", "project-"), ("provider.project", "proj\nect"), ("provider.project", "projects/x"),
    ("provider.project", "my project"),
    ("provider.network", "default\nx"), ("provider.network", "../x"), ("provider.network", "global/networks/Default"),
    ("provider.network", "global/networks/"), ("provider.network", "x" * 64), ("provider.network", "a b"),
    ("provider.network", "http://evil.example/x"), ("provider.network", "projects/../global/networks/x"),
    ("provider.image", "debian\n"), ("provider.image", "projects/debian-cloud/global/images/../x"),
    ("provider.image", "UPPER"), ("provider.image", "projects/x/global/images/"), ("provider.image", "family/"),
    ("provider.image", "-x"), ("provider.image", "projects/debian-cloud/global/images/family/debian-12\n"),
    ("provider.image", "https://evil.example/compute/v1/projects/p/global/images/x"),
    ("provider.task_port", 22), ("provider.task_port", 80), ("provider.task_port", 443), ("provider.task_port", 1),
    ("provider.task_port", 1023), ("provider.task_port", -1), ("provider.task_port", 65536),
    ("provider.task_port", True), ("provider.ssh_user", "root\nx"), ("provider.ssh_user", "a b"),
    ("provider.ssh_user", "a:b"), ("provider.zones", ["us-central1-z"]), ("provider.zones", ["../x"]),
    ("provider.python", "python3\nrm -rf /"), ("provider.termination_action", "KILL"),
]
# A 5-minute flex-start of a real job: past its deadline by the cost model (plan, the dry run and launch alike).
FLEX_5M = {**BASES["gce"], "training": {"job": "resnet-cifar", "hparam_set": "resnet_cifar_32", "mode": "sync",
                                        "train_steps": 64000},
           "cluster": {"workers": [{"gpu": "h100", "machine_type": "a3-highgpu-1g", "count": 1,
                                    "provisioning": "flex_start", "zone": "us-central1-a"}]},
           "policy": {"deadline": "5m"}}
LOCAL = [("provider.base_port", 22), ("provider.base_port", 80), ("provider.time_scale", 1e-300),
         ("training.data_dir", "a\nb"), ("training.data_dir", "/tmp/x\r"), ("training.hparam_set", "nope")]
COMMAND = [("training.files", ["../../etc/passwd"]), ("training.files", ["/etc/passwd"]),
           ("training.files", ["nope.py"]), ("training.files", ["train.py", "train.py"]), ("training.files", ["."]),
           ("training.command", ""), ("training.command", "a\nb"), ("training.hparam_set", "nope"),
           ("training.hparam_set", "../x")]
RUN = [("training.hparam_set", "nope"), ("training.env", {"PATH": "x"}), ("training.env", {"bad name": "x"}),
       ("training.run", "python train.py\nrm -rf /"), ("training.setup", "a\nb"), ("training.files", ["/etc"])]
SSH = [("provider.inventory", "/etc/passwd"), ("provider.inventory", "/dev/null"), ("provider.inventory", "sub"),
       ("provider.inventory", "nope.yaml"), ("cluster.workers.0.gpu", "l4"), ("cluster.workers.0.count", 3)]


# Issue 56: storage that reaches the system, the results DB or the home's own files (each case folder has
# etc-link -> /etc, its DB is ./o.db and its home ./home); the task's environment (loader variables as PATH is
# refused, one variable in both env: and secrets:, a secret named twice or named as a loader variable).
STORAGE_56 = [("storage", "/etc"), ("storage", "/"), ("storage", "/usr/lib"), ("storage", "./etc-link"),
              ("storage", "./etc-link/runs"), ("storage", "./o.db"), ("storage", "./o.db-wal"), ("storage", "./home"),
              ("storage", "./home/keys"), ("storage", "./home/local/x"), ("storage", "/tmp"), ("storage", "/var"),
              ("storage", "/boot/runs"), ("storage", "~")]
ENV_56 = [("training.env", {"LD_PRELOAD": "/tmp/evil.so"}), ("training.env", {"LD_LIBRARY_PATH": "/tmp"}),
          ("training.env", {"LD_AUDIT": "/tmp/a.so"}), ("training.env", {"DYLD_INSERT_LIBRARIES": "/tmp/x"}),
          ("training.env", {"PYTHONHOME": "/tmp"}), ("training.env", {"PYTHONSTARTUP": "/tmp/x.py"}),
          ("training.env", {"BASH_ENV": "/tmp/x.sh"}), ("training.secrets", ["LD_PRELOAD"]),
          ("training.secrets", ["PATH"]), ("training.secrets", ["ORCHESTRATOR_DB_URL"]),
          ("training.secrets", ["TOKEN", {"name": "TOKEN", "file": "train.py"}])]
# Issue 56: a `torch:` factory that is not the user's own (standard library, builtins, the orchestrator itself,
# a user file handing on a standard-library function: alias.py beside each case), and an api_endpoint that would
# receive the caller's credentials somewhere other than a Google API host (or an emulator on loopback, keyless).
MODEL_56 = ["os:system", "subprocess:getoutput", "builtins:exec", "os.path:join", "shutil:rmtree", "posix:system",
            "code:build", "orchestrator.cli.main:main", "orchestrator.store.db:open_session", "alias.py:build"]
ENDPOINT_56 = ["http://169.254.169.254", "http://metadata.google.internal", "https://example.com",
               "http://compute.googleapis.com", "https://compute.googleapis.com.example.com",
               "https://evilgoogleapis.com", "https://user@compute.googleapis.com",
               "https://example.com\\@compute.googleapis.com", "https://compute.googleapis.com/x?y=1",
               "http://0.0.0.0:8080", "http://127.1", "HTTPS://compute.googleapis.com", ""]
MISSING_SECRET = "ORCH_HOSTILE_MISSING_SECRET"  # never set: `launch` refused it; its dry run must too


def issue_56_cases() -> Iterator[Case]:
    for path, value in STORAGE_56:
        for base in ("local", "run"):
            yield Case(f"{base}: {path} = {value!r:.60}", base, _dump(_set(BASES[base], path, value)))
    for path, value in ENV_56:
        yield Case(f"run: {path} = {value!r:.60}", "run", _dump(_set(BASES["run"], path, value)))
    both = _set(_set(BASES["run"], "training.env", {"TOKEN": "x"}), "training.secrets", ["TOKEN"])
    yield Case("run: TOKEN in training.env and training.secrets", "run", _dump(both))
    for ref in MODEL_56 + [f"{sysconfig.get_paths()['stdlib']}/shutil.py:rmtree"]:
        yield Case(f"run: training.model.torch = {ref!r:.60}", "run",
                   _dump(_set(BASES["run"], "training.model", {"torch": ref})))
    for url in ENDPOINT_56:
        yield Case(f"gce: provider.api_endpoint = {url!r:.60}", "gce",
                   _dump(_set(BASES["gce"], "provider.api_endpoint", url)))
    keyed = _set(_set(BASES["gce"], "provider.api_endpoint", "http://127.0.0.1:9"), "provider.credentials", "train.py")
    yield Case("gce: provider.credentials with a loopback api_endpoint", "gce", _dump(keyed))
    missing = _set(BASES["run"], "training.secrets", [MISSING_SECRET])
    yield Case(f"run: training.secrets = [{MISSING_SECRET}] (unset)", "run", _dump(missing), verbs=VERBS[1:])


def _host(**extra: Any) -> str:
    hosts = copy.deepcopy(INVENTORY["hosts"])
    hosts[0].update(extra)
    return _dump({"hosts": hosts})


INVENTORIES = [  # hosts.yaml content for the ssh base
    ("price .inf", "hosts:\n  - {name: a, host: 127.0.0.1, gpu: t4, price_per_hour: .inf}\n"
                   "  - {name: b, host: 127.0.0.2, gpu: t4}\n"),
    ("price .nan", "hosts:\n  - {name: a, host: 127.0.0.1, gpu: t4, price_per_hour: .nan}\n"
                   "  - {name: b, host: 127.0.0.2, gpu: t4}\n"),
    ("price -1", _host(price_per_hour=-1)), ("price 1e9", _host(price_per_hour=1e9)),
    ("no host of the gpu", _dump({"hosts": [{"name": "a", "host": "h1", "gpu": "l4"},
                                            {"name": "b", "host": "h2", "gpu": "l4"}]})),
    ("one host for two workers", _dump({"hosts": [{"name": "a", "host": "h1", "gpu": "t4"}]})),
    ("cpu hosts only", _dump({"hosts": [{"name": "a", "host": "h1"}, {"name": "b", "host": "h2"}]})),
    ("no hosts", "hosts: []\n"), ("host with a space", _host(host="a b")), ("host with a newline", _host(host="h\nx")),
    ("workdir newline", _host(workdir="a\nb")), ("port 0", _host(port=0)), ("port 70000", _host(port=70000)),
    ("user newline", _host(user="root\nx")), ("unknown gpu", _host(gpu="nope")), ("gpus -1", _host(gpus=-1)),
    ("missing key", _host(key="nope-key")), ("missing known_hosts", "known_hosts: nope\n" + _host()),
    ("duplicate names", _dump({"hosts": [{"name": "a", "host": "h1", "gpu": "t4"},
                                         {"name": "a", "host": "h2", "gpu": "t4"}]})),
    ("binary tag", "hosts:\n  - {name: !!binary YQ==, host: h1, gpu: t4}\n  - {name: b, host: h2, gpu: t4}\n"),
    ("not a mapping", "- a\n- b\n"), ("unknown field", _host(passwd="x")),
]


def cases() -> Iterator[Case]:
    """Every named hostile case (at least 220; 404 today)."""
    targets = {"local": GENERIC + LOCAL, "command": GENERIC + COMMAND, "run": GENERIC + RUN,
               "ssh": GENERIC + SSH, "gce": GENERIC + GCE}
    for base, mutations in targets.items():
        for path, value in mutations:
            if base == "gce" and path == "storage" and value in ("s3://bucket/x",):
                continue
            yield Case(f"{base}: {path} = {value!r:.60}", base, _dump(_set(BASES[base], path, value)))
        for key, line in RAW_GENERIC:
            lines = [line if ln.startswith(f"{key}:") else ln for ln in _dump(BASES[base]).splitlines()]
            yield Case(f"{base}: {line!r:.60}", base, "\n".join(lines) + "\n")
    yield Case("gce: a 5-minute flex-start (policy.deadline 5m)", "gce", _dump(FLEX_5M))
    for what, inventory in INVENTORIES:
        yield Case(f"ssh inventory: {what}", "ssh", _dump(BASES["ssh"]), inventory)
    yield from issue_56_cases()


# ---------------------------------------------------------------- running the verbs


class Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise Hang()


def _children() -> set[int]:
    found: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            found |= {int(p) for p in (task / "children").read_text().split()}
    return found


CACHES = ("home", "home/cache")  # derived figures kept for the next run (revocation fits): no job's state


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")
            if str(p.relative_to(root)) not in CACHES and not str(p.relative_to(root)).startswith("home/cache/")}


_MAIN_READY = False


def run_verb(args: list[str], cwd: Path) -> tuple[int | str, str, str]:
    """`orchestrator ARGS` in this process: (exit code, or 'traceback' / 'hang'; stdout; stderr)."""
    global _MAIN_READY
    import orchestrator.cli.main as cli

    if not _MAIN_READY:  # the sub-command groups are added once per process
        cli._register_groups()
        _MAIN_READY = True
    out, err = io.StringIO(), io.StringIO()
    old_argv, old_cwd = sys.argv, os.getcwd()
    old = signal.signal(signal.SIGALRM, _alarm)
    code: int | str
    try:
        sys.argv = ["orchestrator", *args]
        os.chdir(cwd)
        signal.alarm(HANG_S)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                _patched(cli, "_register_groups", lambda: None):
            cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Hang:
        code = "hang"
    except BaseException:  # noqa: BLE001 - what the CLI let escape is the finding
        code = "traceback"
        err.write(traceback.format_exc())
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        sys.argv = old_argv
        os.chdir(old_cwd)
    return code, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)


@dataclass
class VerbSuite:
    root: Path
    counts: dict[str, Counter[str]] = field(default_factory=dict)
    samples: dict[str, list[str]] = field(default_factory=dict)

    def _case_dir(self, case: Case, i: int) -> Path:
        d = self.root / f"verb-{i:04d}"
        (d / "sub").mkdir(parents=True)
        (d / "etc-link").symlink_to("/etc")  # a storage reached through a symlink
        (d / "train.py").write_text("print('hi')\n")
        (d / "alias.py").write_text("from os import system as build\n")  # a standard-library function, renamed
        (d / "hosts.yaml").write_text(case.inventory if case.inventory is not None else _dump(INVENTORY))
        (d / "spec.yaml").write_text(case.text)
        return d

    def key_file(self) -> Path:
        path = self.root / "service-account.json"
        if not path.exists():
            from cryptography.hazmat.primitives import serialization
            from cryptography.hazmat.primitives.asymmetric import rsa

            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode()
            path.write_text(json.dumps({"type": "service_account", "project_id": "my-project-1", "private_key_id": "1",
                                        "private_key": pem, "client_email": "fz@my-project-1.iam.gserviceaccount.com",
                                        "client_id": "1", "token_uri": "http://127.0.0.1:9/token"}))
        return path

    def note(self, kind: str, detail: str) -> None:
        bucket = self.samples.setdefault(kind, [])
        if len(bucket) < 8:
            bucket.append(detail[:1500])

    def run_case(self, case: Case, i: int, *, valid: bool = False) -> None:
        d = self._case_dir(case, i)
        verbs = VERBS[:2] if valid else case.verbs
        for verb in verbs:
            label = " ".join(verb) if not valid else f"{' '.join(verb)} (valid controls)"
            c = self.counts.setdefault(label, Counter())
            before, kids = _tree(d), _children()
            # No cloud account here: a key file that parses (no account behind it, its token endpoint on a closed
            # local port) passes the credentials check, so the valid gce control reaches the dry run.
            env = {"ORCHESTRATOR_DB_URL": f"sqlite:///{d}/o.db", "ORCHESTRATOR_HOME": str(d / "home"),
                   "COLUMNS": "100", "GOOGLE_APPLICATION_CREDENTIALS": str(self.key_file())}
            with _env(env):
                code, out, err = run_verb([*verb, str(d / "spec.yaml")], d)
            c["tried"] += 1
            where = f"{label} | {case.name}"
            if code == "traceback" or "Traceback" in out + err:
                c["tracebacks"] += 1
                self.note("tracebacks", f"{where}\n{err[-1200:]}")
            elif code == "hang":
                c["hangs"] += 1
                self.note("hangs", where)
            elif valid:
                c["accepted" if code == 0 else "refused wrongly"] += 1
                if code != 0:
                    self.note("valid spec refused", f"{where}: {err[-600:]}")
            elif code == 2 and "error" in err:
                c["refused cleanly"] += 1
            else:
                c["accepted wrongly"] += 1
                self.note("accepted wrongly", f"{where}: exit {code} {err[-300:]}")
            left = (_tree(d) - before) | {f"pid {p}" for p in _children() - kids}
            if not valid and left:
                c["left anything"] += 1
                self.note("left anything", f"{where}: {sorted(left)[:5]}")

    def table(self) -> str:
        cols = ["tried", "refused cleanly", "accepted wrongly", "tracebacks", "hangs", "left anything"]
        lines = [f"{'verb':<34}" + "".join(f"{c:>17}" for c in cols)]
        for label, c in self.counts.items():
            if "valid" in label:
                continue
            lines.append(f"{label:<34}" + "".join(f"{c[k]:>17}" for k in cols))
        for label, c in self.counts.items():
            if "valid" in label:
                lines.append(f"{label:<34} tried {c['tried']}, accepted {c['accepted']}, refused wrongly "
                             f"{c['refused wrongly']}, tracebacks {c['tracebacks']}, hangs {c['hangs']}")
        return "\n".join(lines)


@contextlib.contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_suite(root: Path, limit: int | None = None, every: int = 1, match: str = "") -> VerbSuite:
    """Every ``every``-th named case whose name contains ``match`` (``limit`` at most) and every valid base
    through the verbs."""
    suite = VerbSuite(root)
    chosen = [c for c in cases() if match in c.name][::every][:limit]
    for i, case in enumerate(chosen):
        suite.run_case(case, i)
    for j, (name, doc) in enumerate(BASES.items()):
        suite.run_case(Case(f"valid {name}", name, _dump(doc)), len(chosen) + j, valid=True)
    return suite
