"""The one rule for every file and folder comet-dse writes: it replaces only what it wrote itself.

A result file (Parquet, CSV, a figure, a calibrated cluster YAML, a sweep summary) is written inside a
private temporary folder beside it (``tempfile.mkdtemp``: a random name made with ``mkdir``, which fails on
anything already there, a link included, and mode 0700, so no other user can plant a link in it) and renamed
into place when complete. Before the rename its folder's ledger (``LEDGER``: name -> size, modification time,
inode and SHA-256 of the file as written) records it, both under an advisory lock (``flock`` on the folder),
so concurrent writers lose no entry and a write either ends recorded and in place or leaves nothing.

A later write may replace a file only while it is still exactly that one: a file the user made, edited (even
in place, keeping its size and time), copied in or renamed over is not in the ledger, or no longer matches its
entry, and is refused. So are symbolic links (comet-dse never writes through one), devices, FIFOs, sockets and
folders where a file is named, and any input of the same command (the runs a calibration reads, a cluster
file, a study). An empty regular file holds nothing to lose and may be replaced (``mktemp`` makes one).
The ledger itself is read only if it is a regular file of at most ``JSON_LIMIT`` bytes (never a FIFO, a device
or a link).

A result folder (a report, a dataset of Parquet parts) holds a manifest (``seal``): every file in it, with
its size and its SHA-256. Such a folder may be replaced only when it holds its manifest and nothing else than
the files listed, unchanged; a folder with one more file (a user's ``data/survey.csv`` dropped in a report
folder) is left alone. An empty folder may be filled.

Each refusal is one InputError naming the field and the path; an error the operating system reports while
writing (a full disk, a read-only file system, a permission) is a ``StorageError`` (``failure``).
docs/reliability.md lists the rule.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path

from comet_dse.base.errors import InputError, RunFailed, StorageError

try:
    import fcntl
except ImportError:                  # not on Windows: no lock there (docs/reliability.md, Limits)
    fcntl = None

LEDGER = ".comet-dse-written.json"    # in each folder comet-dse wrote a result file into
TOOL = "comet-dse"
JSON_LIMIT = 8 << 20                  # bytes: the largest ledger or manifest read (about 50,000 entries)
BLOCK = 1 << 20                       # bytes hashed per read
LOCK_WAIT_S = 60.0                    # how long a writer waits for another one's lock on a folder
# errno values that say the path given cannot be used (bad input), not that the system failed
INPUT_ERRNOS = {errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG, errno.ELOOP, errno.EEXIST, errno.ENOENT}
# after ".<name>.tmp-": [old-]<pid>[-<random>][@<host>]; random: tempfile's characters
_TEMP_TAIL = re.compile(r"(?:old-)?(\d+)(?:-[a-z0-9_]+)?(?:@(.+))?")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def failure(field: str, action: str, path, exc: OSError) -> Exception:
    """The error to raise for ``exc`` met while ``action`` (write, create, ...) ``path``: an InputError when
    the path itself cannot be used (a file where a folder is needed, a name too long), else a StorageError
    (a full disk, a read-only file system, no permission: the system, not the input)."""
    if isinstance(exc, (InputError, StorageError, RunFailed)):
        return exc
    if exc.errno in INPUT_ERRNOS:
        return InputError(field, f"cannot {action} {path}: {exc.strerror or exc}")
    return StorageError(field, action, path, exc)


def _umask() -> int:
    """The process's file mode creation mask (read without changing it where /proc tells it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def temp_folder(path, host: bool = False) -> Path:
    """A new private folder beside ``path`` (``.<name>.tmp-<pid>-<random>``, ``@<host>`` added when
    ``host``), made by ``mkdir`` with mode 0700: its name cannot be predicted, and nothing already there (a
    link planted by another user) is ever used."""
    path = Path(path)
    suffix = f"@{socket.gethostname()}" if host else ""
    return Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-{os.getpid()}-", suffix=suffix, dir=path.parent))


def result_temp_folder(output: Path, field: str = "output") -> Path:
    """The private temporary folder (``temp_folder``) a result folder ``output`` (a report, an export) is built
    in, its parent made first; a folder that cannot be made is ``failure``'s one line."""
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        return temp_folder(output)
    except OSError as exc:
        raise failure(field, "write in", output.parent, exc) from None


def publish_mode(folder: Path) -> None:
    """Give the finished temporary folder ``folder`` the mode a folder made by ``mkdir`` would have (0777
    less the umask) before it is renamed into place as a result folder."""
    os.chmod(folder, 0o777 & ~_umask())


@contextlib.contextmanager
def temp_file(path, field: str = "output"):
    """A temporary path to write ``path``'s content to: ``<private folder>/<name>`` (``temp_folder``), the
    folder removed with whatever it holds on leaving."""
    path = Path(path)
    try:
        folder = temp_folder(path)
    except OSError as exc:
        raise failure(field, "write in", path.parent, exc) from None
    try:
        yield folder / path.name
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (a process of another user counts)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, OverflowError):
        return pid < 2**31
    return True


def _stale(tmp: Path, prefix: str) -> bool:
    tail = _TEMP_TAIL.fullmatch(tmp.name[len(prefix):])
    if tail is None or (tail.group(2) and tail.group(2) != socket.gethostname()):
        return False
    return not process_alive(int(tail.group(1))) and not tmp.is_symlink()


def stale_temps(path: Path) -> list:
    """The temporaries of ``path`` (``.<name>.tmp-PID[-random][@HOST]``, files or folders) whose process no
    longer runs on this machine; links are never listed."""
    path = Path(path)
    prefix = f".{path.name}.tmp-"
    try:
        names = [n for n in os.listdir(path.parent) if n.startswith(prefix)]
    except OSError:
        return []
    return [path.parent / n for n in sorted(names) if _stale(path.parent / n, prefix)]


def remove_stale_temps_in(folder: Path) -> None:
    """Remove every temporary in ``folder`` (``.<any name>.tmp-...``) whose process no longer runs on this
    machine: files, and private folders of files (a sweep's parts folder, where workers write)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        head, sep, _ = name.rpartition(".tmp-")
        if sep and head.startswith(".") and len(head) > 1:
            remove_stale_temps(Path(folder) / head[1:])


def remove_stale_temps(path: Path, marker: str | None = None) -> None:
    """Remove the temporaries of ``path`` left by dead processes: files; a private folder of a file
    (``temp_file``: empty or holding only that name); a folder holding ``marker`` (a report or dataset being
    built). Other folders, of the user's, are left alone."""
    path = Path(path)
    for tmp in stale_temps(path):
        if tmp.is_file():
            tmp.unlink(missing_ok=True)
        elif tmp.is_dir() and (set(os.listdir(tmp)) <= {path.name} or (marker and (tmp / marker).is_file())):
            shutil.rmtree(tmp, ignore_errors=True)


def _fingerprint(st: os.stat_result) -> list:
    """What identifies one written file quickly: [size in bytes, modification time in ns, inode]."""
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def content_hash(path) -> str:
    """SHA-256 of the whole file ``path`` (``sha256:<hex>``), read through no link."""
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        for block in iter(lambda: handle.read(BLOCK), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def sha256_hex(path) -> str | None:
    """The hex SHA-256 of the whole file ``path`` (``content_hash`` without its prefix), as the files that
    record another file's digest write it (a calibrated cluster's runs, the efficiency file's runs); None when
    it cannot be read as a regular file (a link, a folder), which then matches no recorded digest."""
    try:
        return content_hash(path).removeprefix("sha256:")
    except OSError:
        return None


def read_small_json(path, field: str = "output") -> dict:
    """The JSON object comet-dse wrote as ``path`` (a ledger, a manifest), or {} when there is none or it
    is not comet-dse's. Read only if it is a regular file of at most JSON_LIMIT bytes: a link, a FIFO, a
    device or a larger file is an InputError naming it (it never blocks, and never reads without bound)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(field, f"{path} is a symbolic link; comet-dse reads its own bookkeeping files only "
                             "as regular files; move it away") from None
        raise failure(field, "read", path, exc) from None
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise InputError(field, f"{path} is not a regular file (a FIFO, device or socket); comet-dse keeps its "
                             "bookkeeping there; move it away")
        data = handle.read(JSON_LIMIT + 1)
    if len(data) > JSON_LIMIT:
        raise InputError(field, f"{path} is larger than {JSON_LIMIT >> 20} MiB, more than comet-dse ever writes "
                         "there; move it away")
    try:
        value = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) and value.get("tool") == TOOL else {}


def _write_json(path: Path, data: dict, field: str = "output") -> None:
    """``data`` as ``path``, complete or not at all (a private temporary and a rename)."""
    with temp_file(path, field) as tmp:
        try:
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
            os.replace(tmp, path)
        except OSError as exc:
            raise failure(field, "write", path, exc) from None


@contextlib.contextmanager
def folder_lock(folder: Path, field: str = "output"):
    """An exclusive advisory lock (``flock``) on ``folder`` while the block runs: two comet-dse processes
    never read-modify-write its ledger at the same time. Waits at most LOCK_WAIT_S for another holder."""
    if fcntl is None:
        yield
        return
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))   # a folder reached by a link is fine
    except OSError as exc:
        raise failure(field, "lock", folder, exc) from None
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise InputError(field, f"another process has held the lock on {folder} for "
                                     f"{LOCK_WAIT_S:g} s; try again when it ends") from None
                time.sleep(0.01)
            except OSError:         # a file system without locks: go on unlocked (docs/reliability.md)
                break
        yield
    finally:
        os.close(fd)


def _absolute(path) -> Path:
    """``path`` made absolute without following a link at its end (the link itself is what is judged)."""
    return Path(os.path.abspath(path))


def _is_input(path: Path, inputs) -> Path | None:
    """The input ``path`` is, or holds, or None; links are followed on both sides."""
    real = Path(os.path.realpath(path))
    for given in inputs:
        given_real = Path(os.path.realpath(given))
        if real == given_real or real in given_real.parents:
            return Path(given)
    return None


def check_file(path, field: str = "output", inputs=()) -> Path:
    """The absolute path of a file comet-dse may write, or an InputError that says why not.

    It may write a path that does not exist (in a folder that is not a link to elsewhere is fine), an empty
    regular file, or a regular file its ledger records as written by comet-dse and unchanged since.
    """
    path = _absolute(path)
    given = _is_input(path, inputs)
    if given is not None:
        raise InputError(field, f"{path} is an input of this command ({given}); choose another name")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    except NotADirectoryError:
        raise InputError(field, f"cannot create {path.parent}: a file on that path is not a folder") from None
    except OSError as exc:
        raise failure(field, "use", path, exc) from None
    if stat.S_ISLNK(st.st_mode):
        raise InputError(field, f"{path} is a symbolic link; comet-dse does not write through links, give the "
                         "real path")
    if stat.S_ISDIR(st.st_mode):
        raise InputError(field, f"{path} is a folder; give a file name")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(field, f"{path} is not a regular file (a device, FIFO or socket); give a file name")
    if st.st_size and not owns_file(path, st, field):
        raise InputError(field, f"{path} exists and is not a comet-dse result file (comet-dse did not write it, "
                         "or it changed since); choose another name or move it away")
    return path


def _entry(path: Path, st: os.stat_result) -> list:
    """A ledger entry: ``_fingerprint`` and the content hash of the file as written."""
    return [*_fingerprint(st), content_hash(path)]


def owns_file(path: Path, st: os.stat_result | None = None, field: str = "output") -> bool:
    """Whether ``path`` is a file comet-dse wrote and nobody changed since: its ledger entry matches its
    size, time and inode, and its content hash (an edit in place that keeps size and time is seen)."""
    path = _absolute(path)
    entry = read_small_json(path.parent / LEDGER, field).get("files", {}).get(path.name)
    st = st or os.lstat(path)
    if not isinstance(entry, list) or len(entry) != 4 or entry[:3] != _fingerprint(st):
        return False
    try:
        return entry[3] == content_hash(path)
    except OSError:
        return False


def _ledger(folder: Path, field: str) -> dict:
    """The ledger of ``folder`` to update: the one comet-dse wrote, or a new one. A file at its name that is
    not comet-dse's ledger is refused (never replaced)."""
    data = read_small_json(folder / LEDGER, field)
    if not data and (folder / LEDGER).exists():
        raise InputError(field, f"{folder / LEDGER} is not a ledger comet-dse wrote; move it away")
    data = data or {"tool": TOOL, "files": {}}
    if not isinstance(data.get("files"), dict):
        data["files"] = {}
    return data


def _enter(folder: Path, name: str, entry, field: str) -> None:
    """Set ``name``'s ledger entry to ``entry`` (None: remove it) and forget files that are gone; called
    under ``folder_lock``."""
    ledger = _ledger(folder, field)
    files = ledger["files"]
    if entry is None:
        files.pop(name, None)
    else:
        files[name] = entry
    for gone in [n for n in files if n != name and not (folder / n).is_file()]:
        del files[gone]
    if not files:          # it records nothing: a folder where comet-dse keeps no file keeps no ledger either
        try:
            (folder / LEDGER).unlink(missing_ok=True)
        except OSError as exc:
            raise failure(field, "remove", folder / LEDGER, exc) from None
        return
    _write_json(folder / LEDGER, ledger, field)


def record_file(path, field: str = "output") -> None:
    """Enter ``path`` (written and in place) in its folder's ledger, under the folder's lock."""
    path = _absolute(path)
    with folder_lock(path.parent, field):
        _enter(path.parent, path.name, _entry(path, os.lstat(path)), field)


def _make_parent(path: Path, field: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise failure(field, "create", path.parent, exc) from None


def write_file(path, write, field: str = "output", inputs=()) -> Path:
    """Write the file ``path`` by ``write(temporary path)``, complete or not at all, and record it.

    ``write`` writes into a private temporary folder (``temp_file``). Then, under the folder's lock, the path
    is checked again (a file that appeared meanwhile is not replaced either), the ledger records the new file
    and the file is renamed into place; if the ledger cannot be written nothing is renamed, and if the rename
    fails the ledger entry is put back. An error of the system (a full disk) is a StorageError, an unusable
    path an InputError; either way no half file and no unrecorded file is left. Returns the absolute path.
    """
    path = check_file(path, field, inputs)
    _make_parent(path, field)
    remove_stale_temps(path)
    with temp_file(path, field) as tmp:
        try:
            write(tmp)
            st = os.lstat(tmp)
            if not stat.S_ISREG(st.st_mode):
                raise InputError(field, f"{path} was not written as a regular file")
            entry = _entry(tmp, st)
        except OSError as exc:
            raise failure(field, "write", path, exc) from None
        with folder_lock(path.parent, field):
            check_file(path, field, inputs)
            old = _ledger(path.parent, field)["files"].get(path.name)
            _enter(path.parent, path.name, entry, field)
            try:
                os.replace(tmp, path)
            except OSError as exc:
                with contextlib.suppress(Exception):
                    _enter(path.parent, path.name, old, field)
                raise failure(field, "write", path, exc) from None
    return path


def _content_mark(path: str, size: int) -> list:
    """[size in bytes, SHA-256 of the whole file]: what identifies a file in a folder manifest.

    It depends on the bytes only (not on times), so a resumed sweep's dataset folder has the same manifest
    as an uninterrupted run's; every byte counts, so an edit in place that keeps the size is seen.
    """
    return [size, content_hash(path)]


def _entries(folder: Path, marker: str):
    """(relative path, full path, lstat) of every entry under ``folder`` but the manifest and the folders
    (a link to a folder is an entry)."""
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, folder)
            if rel != marker:
                yield rel, full, os.lstat(full)


def _listing(folder: Path, marker: str) -> dict:
    """Relative path -> ``_content_mark`` of every file under ``folder`` but the manifest; a link or any
    other entry that is neither file nor folder is listed as None (it is never ours)."""
    return {rel: _content_mark(full, st.st_size) if stat.S_ISREG(st.st_mode) else None
            for rel, full, st in _entries(folder, marker)}


def seal(folder, marker: str, kind: str, **extra) -> None:
    """Write the manifest ``marker`` into ``folder``: every file now in it, so the folder can be recognised
    (and replaced) as comet-dse's later. Call it when the folder is complete, before it is renamed into
    place."""
    folder = Path(folder)
    _write_json(folder / marker, {"tool": TOOL, "kind": kind, **extra, "files": _listing(folder, marker)})


def foreign_entry(folder, marker: str, kind: str, field: str = "output") -> str | None:
    """Why ``folder`` is not a sealed comet-dse ``kind`` folder left as written (a path in it, or the missing
    manifest), or None when it is one."""
    folder = Path(folder)
    manifest = read_small_json(folder / marker, field)
    if manifest.get("kind") != kind:
        return f"it holds no {marker} manifest of a comet-dse {kind}"
    listed = manifest.get("files", {})
    if not isinstance(listed, dict):
        return f"its {marker} manifest is not one comet-dse wrote"
    for rel, full, st in sorted(_entries(folder, marker)):
        mark = listed.get(rel)
        foreign = (not stat.S_ISREG(st.st_mode) or not isinstance(mark, list) or not mark
                   or mark[0] != st.st_size or mark != _content_mark(full, st.st_size))   # hashed only if the size fits
        if foreign:
            return f"it holds {folder / rel}, which comet-dse did not write or which changed since"
    return None


def check_folder(path, marker: str, kind: str, field: str = "output", inputs=()) -> Path:
    """The absolute path of a ``kind`` folder comet-dse may (re)place, or an InputError that says why not:
    a missing or empty folder, or one that ``foreign_entry`` finds nothing foreign in."""
    path = _absolute(path)
    given = _is_input(path, inputs)
    if given is not None:
        raise InputError(field, f"{path} is or holds the input {given} of this command; choose another folder")
    if path.is_symlink():
        raise InputError(field, f"{path} is a symbolic link; comet-dse does not write through links")
    if not path.exists():
        return path
    if not path.is_dir():
        raise InputError(field, f"{path} is a file; give a folder for the {kind}")
    if any(path.iterdir()):
        why = foreign_entry(path, marker, kind, field)
        if why:
            raise InputError(field, f"{path} is a folder comet-dse did not write as a {kind} ({why}); choose "
                             "another folder or move it away")
    return path


def replace_folder(tmp: Path, path: Path, check) -> None:
    """Move the finished folder ``tmp`` (a ``temp_folder``) to ``path``: ``check()`` (the output rule) is run
    again first; an earlier folder there is first renamed onto a new private temporary (never a predictable
    name) and removed once the new one is in place."""
    publish_mode(tmp)
    check()
    old = None
    if path.exists() and any(path.iterdir()):
        old = temp_folder(path)
        os.replace(path, old)            # onto the empty private folder just made
    os.replace(tmp, path)                # an empty folder is replaced
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
