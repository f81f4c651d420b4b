"""Reading user-supplied YAML files and checking user-supplied paths, safely.

A job spec or an inventory is untrusted input: it may be a directory, a device, a FIFO (which would
block a read forever), huge, not UTF-8, nested 100k deep (PyYAML's composer recurses), repeat a key
(YAML keeps the last one silently), or expand through aliases into billions of values. Each of those is
one clear message here, before anything acts on the document.
"""

from __future__ import annotations

import fnmatch
import math
import os
import re
import shlex
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node

MAX_BYTES = 1 << 20  # a job spec or an inventory is a few KB; 1 MiB is generous
MAX_DEPTH = 32  # a spec nests ~5 deep
MAX_VALUES = 100_000  # values after alias expansion (guards "billion laughs")
SHORT = 60
PATH_SHORT = 200  # a path a message names (not the value quoted back): long enough to be found
KERNEL_FOLDERS = ("/proc", "/sys", "/dev")  # pseudo-filesystems: never a place for a job's files
# The operating system's own trees: a job's storage is never in them (as root, `storage: /etc` would write
# /etc/<job>/...). macOS's too (/etc is /private/etc there).
SYSTEM_TREES = (*KERNEL_FOLDERS, "/bin", "/boot", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/run", "/sbin",
                "/usr", "/System", "/Library", "/private/etc")
# Folders everyone shares: a folder of one's own under them is fine (/tmp/runs, /home/me/runs, /var/tmp/x), the
# folder itself is not (each job's files would land among everyone's, or the system's, at the top).
SHARED_FOLDERS = ("/", "/home", "/media", "/mnt", "/opt", "/root", "/srv", "/tmp", "/var", "/var/cache", "/var/lib",
                  "/var/local", "/var/log", "/var/mail", "/var/opt", "/var/spool", "/var/tmp", "/Users", "/Volumes",
                  "/private", "/private/tmp", "/private/var")


def short(value: Any, limit: int = SHORT) -> str:
    """A user value for a message: one line, control characters escaped, at most ``limit`` chars + '…'."""
    text = value if isinstance(value, str) else repr(value)
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[: limit + 1])
    return out if len(out) <= limit else out[:limit] + "…"


class YamlFileError(ValueError):
    """The file cannot be read as a YAML document; the message says why, in one line."""


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and deep nesting, and reads YAML 1.2 floats such as 1e-3."""

    depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self.depth += 1
        try:
            event = self.peek_event()  # type: ignore[no-untyped-call]
            if self.depth > MAX_DEPTH:
                raise YamlFileError(f"nested more than {MAX_DEPTH} levels deep (line {event.start_mark.line + 1})")
            if getattr(event, "tag", None) is not None:
                # `name: !!binary aGVsbG8=` would be decoded and coerced into a name without a word: a spec's
                # values are plain YAML scalars, lists and mappings.
                tag = short(event.tag.replace("tag:yaml.org,2002:", "!!"))
                raise YamlFileError(f"YAML tag '{tag}' (line {event.start_mark.line + 1}) is not "
                                    "allowed; write the plain value (quote it to make it a string)")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` then overriding a key of base is what merge keys are for
            key = self.construct_object(key_node, deep=True)
            try:
                if key in seen:
                    raise YamlFileError(
                        f"key '{short(key)}' appears twice in one mapping (lines {seen[key]} and "
                        f"{key_node.start_mark.line + 1}); YAML would silently keep only the last one"
                    )
                seen[key] = key_node.start_mark.line + 1
            except TypeError:  # an unhashable key (a list): construct_mapping below reports it
                pass
        return super().construct_mapping(node, deep=deep)


# YAML 1.2 reads 1e-3 and 1.0e3 as numbers; PyYAML's YAML 1.1 rules would make them strings.
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _count_values(data: Any, budget: int) -> int:
    """How many values ``data`` holds, counting shared (aliased) ones every time; stops past ``budget``."""
    stack = [data]
    seen = 0
    while stack and seen <= budget:
        item = stack.pop()
        seen += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return seen


def parse_yaml(text: str) -> Any:
    """Parse one YAML document with the checks above; raises YamlFileError."""
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except YamlFileError:
        raise
    except yaml.YAMLError as exc:
        where = str(exc).replace('in "<unicode string>", ', "")
        raise YamlFileError("not valid YAML: " + " ".join(where.split())[:300]) from None
    except (ValueError, RecursionError, OverflowError) as exc:  # e.g. an integer with 100k digits
        raise YamlFileError(f"not a usable YAML value: {short(str(exc), 120)}") from None
    if _count_values(data, MAX_VALUES) > MAX_VALUES:
        raise YamlFileError(f"expands to more than {MAX_VALUES:,} values (anchors and aliases?)")
    return data


def read_text_file(path: Path, what: str) -> str:
    """The UTF-8 text of a regular file of at most MAX_BYTES; raises YamlFileError naming ``what``."""
    name = short(str(path), 120)
    try:
        st = path.stat()
    except (OSError, ValueError) as exc:
        raise YamlFileError(f"cannot read {what} {name}: {_why(exc)}") from None
    if stat.S_ISDIR(st.st_mode):
        raise YamlFileError(f"{what} {name} is a directory; give a YAML file")
    if not stat.S_ISREG(st.st_mode):
        raise YamlFileError(f"{what} {name} is not a regular file (a device, FIFO or socket); give a YAML file")
    if st.st_size > MAX_BYTES:
        raise YamlFileError(f"{what} {name} is {st.st_size:,} bytes; at most {MAX_BYTES:,} are read")
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise YamlFileError(f"cannot read {what} {name}: {_why(exc)}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlFileError(f"{what} {name} is not UTF-8 text (byte {raw[exc.start]:#04x} at offset "
                            f"{exc.start}); save it as UTF-8") from None


def read_yaml_file(path: Path, what: str) -> Any:
    """Read and parse a YAML file with every check above; raises YamlFileError naming ``what``."""
    text = read_text_file(path, what)
    try:
        return parse_yaml(text)
    except YamlFileError as exc:
        raise YamlFileError(f"{what} {short(str(path), 120)}: {exc}") from None


def _why(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else short(str(exc), 120)


# ---------------------------------------------------------------- paths named in a spec


def resolve_under(base: Path, value: Path) -> Path:
    """``value`` as an absolute path: relative paths are taken from ``base`` (the spec's folder)."""
    p = value.expanduser()
    return p if p.is_absolute() else base / p


def folder_problem(path: Path) -> str | None:
    """Why ``path`` cannot be (or become) a writable folder, or None. Creates nothing."""
    try:
        real = path.resolve()
        if any(real == Path(k) or real.is_relative_to(k) for k in KERNEL_FOLDERS):
            # As root, os.access says /proc is writable; the job would then fail every pass.
            return (f"'{short(str(path))}' is in {', '.join(KERNEL_FOLDERS)} (the kernel's pseudo-files, not a "
                    "folder for a job's files); give a folder on a disk")
        if path.exists():
            if not path.is_dir():
                return f"'{short(str(path))}' exists and is not a directory; give a folder (created if missing)"
            return None if os.access(path, os.W_OK | os.X_OK) else f"'{short(str(path))}' is not writable"
        parent = path.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir():
            return f"'{short(str(parent))}' is not a directory, so '{short(str(path))}' cannot be created"
        if not os.access(parent, os.W_OK | os.X_OK):
            return f"cannot create '{short(str(path))}': '{short(str(parent))}' is not writable"
    except (OSError, ValueError, RuntimeError) as exc:
        return f"'{short(str(path))}' is not a usable folder: {_why(exc)}"
    return None


def _real(path: Path) -> Path:
    """``path`` with every symlink resolved (``/lib`` is ``/usr/lib`` on most Linuxes); itself if it cannot be."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return path


def _under(real: Path, folder: Path) -> bool:
    return real == folder or real.is_relative_to(folder)


def _shown(path: Path) -> str:
    return short(str(path), PATH_SHORT)


def storage_folder_problem(value: str, *, db_files: tuple[Path, ...], home: Path,
                           home_entries: tuple[str, ...]) -> str | None:
    """Why a job's local storage must not be ``value``, or None: the operating system's trees, a shared folder
    itself, the results DB (``db_files``: the SQLite file and its side files), the orchestrator's home itself or
    one of its own files and folders (``home_entries``: names or glob patterns; a folder of the user's own there,
    such as <home>/runs, is fine). Symlinks are resolved first; nothing is created."""
    text = short(value)
    real = _real(Path(value).expanduser().absolute())
    system = (next((t for t in SYSTEM_TREES if _under(real, Path(t))), None)  # /usr/lib: /usr, not /lib -> /usr/lib
              or next((t for t in SYSTEM_TREES if _under(real, _real(Path(t)))), None))
    resolved = "" if str(real) == value else f" (it resolves to {_shown(real)})"
    if system is not None:
        return (f"'{text}' is in {system}, a folder of the operating system{resolved}; give a folder of your own, "
                "e.g. ./runs")
    if any(real in (Path(f), _real(Path(f))) for f in (*SHARED_FOLDERS, str(Path.home()))):
        example = "./runs" if real == Path("/") else _shown(real / "runs")
        return (f"'{text}' is the shared folder {_shown(real)} itself: each job's files would land at its top; give "
                f"a folder of your own, e.g. {example}")
    for db in db_files:
        if _under(real, db_real := _real(db.expanduser().absolute())):
            return (f"'{text}' is the results DB's file {_shown(db_real)} (the DB URL names it); give a folder of "
                    "your own, e.g. ./runs")
    home_real = _real(home.expanduser().absolute())
    own = real.relative_to(home_real).parts[:1] if real.is_relative_to(home_real) else None
    if own == () or (own and any(fnmatch.fnmatchcase(own[0], entry) for entry in home_entries)):
        what = (f"in {_shown(home_real / own[0])}, one of the orchestrator's own files in its home" if own
                else f"the orchestrator's home {_shown(home_real)} itself")
        return (f"'{text}' is {what} (its DB, SSH keys, local instances); give a folder of your own, e.g. "
                f"{_shown(home_real / 'runs')} or ./runs")
    return None


def pushed_file_problem(base: Path, value: Path) -> str | None:
    """Why a ``files:`` entry cannot be pushed to instances, or None.

    It must exist, be a regular file or a folder, and lie inside the spec's folder (no '..', no absolute
    path elsewhere, no symlink out), and not be the spec's folder itself (it would copy into itself).
    """
    text = short(str(value))
    if ".." in value.parts:
        return f"'{text}' contains '..'; name files inside the spec's folder"
    try:
        root = base.resolve()
        target = resolve_under(base, value).resolve()
        if not target.is_relative_to(root):
            return f"'{text}' is outside the spec's folder ({short(str(root))}); copy it there"
        if target == root:
            return "this is the spec's folder itself; name the files or sub-folders to push"
        if not target.exists():
            return f"'{text}' does not exist (looked for {short(str(target))})"
        mode = target.stat().st_mode
    except (OSError, ValueError, RuntimeError) as exc:
        return f"'{text}' is not usable: {_why(exc)}"
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return f"'{text}' is not a regular file or a folder"
    return None


# ---------------------------------------------------------------- the planner's search space

MAX_CANDIDATES = 40_000  # the planner scores a few thousand clusters a second: this is seconds, not hours


def search_size(gpu_types: int, lo: int, hi: int, mixed: bool, zones: int, spots: int, ps_counts: int) -> int:
    """How many clusters the planner would score: worker sets (one type, or 2-3 types mixed in every
    split of n workers) x zones x spot/on-demand x parameter-server counts."""
    sets = 0
    for n in range(lo, hi + 1):
        sets += gpu_types
        if mixed:
            sets += math.comb(gpu_types, 2) * (n - 1) + math.comb(gpu_types, 3) * math.comb(n - 1, 2)
    return sets * max(zones, 1) * max(spots, 1) * max(ps_counts, 1)


# ---------------------------------------------------------------- run:/setup: commands and env: (pytorch jobs)

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Set by torchrun or by the orchestrator for every rank; a spec must not override them.
RESERVED_ENV = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "PYTHONPATH", "PATH", "HOME"}


# Read by the dynamic loader or an interpreter as it starts, before (and beside) the script: they decide what code
# every process of the task runs, the orchestrator's own node agent included, as PATH does.
LOADER_ENV = {"GCONV_PATH", "BASH_ENV", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONINSPECT", "PYTHONUSERBASE",
              "PYTHONPLATLIBDIR", "PYTHONEXECUTABLE", "PYTHONBREAKPOINT"}
LOADER_ENV_PREFIXES = ("LD_", "DYLD_")  # LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...; macOS's DYLD_INSERT_LIBRARIES


def command_problem(cmd: str | None) -> str | None:
    if cmd is None:
        return None
    try:
        argv = shlex.split(cmd)
    except ValueError as exc:
        return f"cannot split into arguments ({exc}); quote it as a shell would"
    if not argv:
        return "empty command"
    if any(c < " " for c in cmd):
        return "control characters (newline, ...) are not allowed; give one command (put more in a script)"
    return None


def env_name_problem(key: str) -> str | None:
    """Why a spec may not set the task's environment variable ``key`` (env: or secrets:), or None."""
    if not _ENV_NAME.match(key):
        return f"'{key[:60]}' is not an environment variable name (letters, digits, _)"
    if key in RESERVED_ENV or key.startswith("ORCHESTRATOR_"):
        return f"{key} is set by torchrun / the orchestrator; pick another name"
    if key in LOADER_ENV or key.startswith(LOADER_ENV_PREFIXES):
        return (f"{key} is read by the loader or the interpreter as each process of the task starts (it changes "
                "what code runs, as PATH does); pick another name")
    return None


def env_problem(env: dict[str, str]) -> str | None:
    for key, value in env.items():
        if problem := env_name_problem(key):
            return problem
        if "\x00" in value:
            return f"{key}: NUL is not allowed in a value"
    return None
