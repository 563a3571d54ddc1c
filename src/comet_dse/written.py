"""The one rule for every file and folder comet-dse writes: it replaces only what it wrote itself.

A result file (Parquet, CSV, a figure, a calibrated cluster YAML, a sweep summary) is written under a
temporary name beside it and renamed into place when complete, then recorded in its folder's ledger
(``LEDGER``: name -> size, modification time and inode of the file as written). A later write may replace
it only while the file is still exactly that one: a file the user made, edited, copied in or renamed over is
not in the ledger, or no longer matches its entry, and is refused. So are symbolic links (comet-dse never
writes through one), devices, FIFOs, sockets and folders where a file is named, and any input of the same
command (the runs a calibration reads, a cluster file, a study). An empty regular file holds nothing to
lose and may be replaced (``mktemp`` makes one).

A result folder (a report, a dataset of Parquet parts) holds a manifest (``seal``): every file in it, with
its size and a digest of its first and last 64 KiB. Such a folder may be replaced only when it holds its manifest and nothing
else than the files listed, unchanged; a folder with one more file (a user's ``data/survey.csv`` dropped in a
report folder) is left alone. An empty folder may be filled.

Each refusal is one InputError naming the field and the path. docs/reliability.md lists the rule.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import socket
import stat
from pathlib import Path

from comet_dse.errors import InputError

LEDGER = ".comet-dse-written.json"    # in each folder comet-dse wrote a result file into
TOOL = "comet-dse"
EDGE = 1 << 16                        # bytes read at each end of a file for a folder manifest


def temp_path(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place: ``.<name>.tmp-<pid>`` beside it."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


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


def stale_temps(path: Path) -> list:
    """The temporaries of ``path`` (``.<name>.tmp-PID`` or ``-PID@HOST``) whose process no longer runs."""
    path = Path(path)
    found = []
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.tmp-*"):
        pid, _, host = tmp.name.rsplit("-", 1)[1].partition("@")
        if host and host != socket.gethostname():
            continue
        if pid.isdigit() and not process_alive(int(pid)) and not tmp.is_symlink():
            found.append(tmp)
    return found


def _fingerprint(st: os.stat_result) -> list:
    """What identifies one written file: [size in bytes, modification time in ns, inode]."""
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("tool") == TOOL else {}


def _write_json(path: Path, data: dict) -> None:
    """``data`` as ``path``, complete or not at all (a temporary and a rename)."""
    tmp = temp_path(path)
    try:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


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
        raise InputError(field, f"cannot use {path}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise InputError(field, f"{path} is a symbolic link; comet-dse does not write through links, give the "
                         "real path")
    if stat.S_ISDIR(st.st_mode):
        raise InputError(field, f"{path} is a folder; give a file name")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(field, f"{path} is not a regular file (a device, FIFO or socket); give a file name")
    if st.st_size and not owns_file(path, st):
        raise InputError(field, f"{path} exists and is not a comet-dse result file (comet-dse did not write it, "
                         "or it changed since); choose another name or move it away")
    return path


def owns_file(path: Path, st: os.stat_result | None = None) -> bool:
    """Whether ``path`` is a file comet-dse wrote and nobody changed since (its ledger entry matches)."""
    path = _absolute(path)
    entry = _read_json(path.parent / LEDGER).get("files", {}).get(path.name)
    st = st or os.lstat(path)
    return entry == _fingerprint(st)


def record_file(path) -> None:
    """Enter ``path`` (just written and renamed into place) in its folder's ledger."""
    path = _absolute(path)
    ledger_path = path.parent / LEDGER
    ledger = _read_json(ledger_path) or {"tool": TOOL, "files": {}}
    files = ledger.setdefault("files", {})
    files[path.name] = _fingerprint(os.lstat(path))
    for name in [n for n in files if not (path.parent / n).is_file()]:   # forget files that are gone
        del files[name]
    _write_json(ledger_path, ledger)


def write_file(path, write, field: str = "output", inputs=()) -> Path:
    """Write the file ``path`` by ``write(temporary path)``, complete or not at all, and record it.

    The path is checked first (``check_file``) and again just before the rename, so a file that appeared
    meanwhile is not replaced either. Returns the absolute path written.
    """
    path = check_file(path, field, inputs)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(field, f"cannot create {path.parent}: {exc.strerror}") from None
    for stale in stale_temps(path):
        if stale.is_file():
            stale.unlink(missing_ok=True)
    tmp = temp_path(path)
    try:
        write(tmp)
        check_file(path, field, inputs)
        os.replace(tmp, path)
    except OSError as exc:
        raise InputError(field, f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        if tmp.is_file() or tmp.is_symlink():
            tmp.unlink()
    record_file(path)
    return path


def _content_mark(path: str, size: int) -> list:
    """[size in bytes, SHA-256 of the first and last 64 KiB]: what identifies a file in a folder manifest.

    It depends on the bytes only (not on times), so a resumed sweep's dataset folder has the same manifest
    as an uninterrupted run's, and it costs two small reads however large the file.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        digest.update(handle.read(EDGE))
        if size > 2 * EDGE:
            handle.seek(size - EDGE)
        digest.update(handle.read(EDGE))
    return [size, digest.hexdigest()]


def _listing(folder: Path, marker: str) -> dict:
    """Relative path -> ``_content_mark`` of every file under ``folder`` but the manifest; a link or any
    other entry that is neither file nor folder is listed as None (it is never ours)."""
    out = {}
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, folder)
            if rel == marker:
                continue
            st = os.lstat(full)
            out[rel] = _content_mark(full, st.st_size) if stat.S_ISREG(st.st_mode) else None
    return out


def seal(folder, marker: str, kind: str, **extra) -> None:
    """Write the manifest ``marker`` into ``folder``: every file now in it, so the folder can be recognised
    (and replaced) as comet-dse's later. Call it when the folder is complete, before it is renamed into
    place."""
    folder = Path(folder)
    _write_json(folder / marker, {"tool": TOOL, "kind": kind, **extra, "files": _listing(folder, marker)})


def foreign_entry(folder, marker: str, kind: str) -> str | None:
    """Why ``folder`` is not a sealed comet-dse ``kind`` folder left as written (a path in it, or the missing
    manifest), or None when it is one."""
    folder = Path(folder)
    manifest = _read_json(folder / marker)
    if manifest.get("kind") != kind:
        return f"it holds no {marker} manifest of a comet-dse {kind}"
    listed = manifest.get("files", {})
    for rel, fingerprint in sorted(_listing(folder, marker).items()):
        if fingerprint is None or listed.get(rel) != fingerprint:
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
        why = foreign_entry(path, marker, kind)
        if why:
            raise InputError(field, f"{path} is a folder comet-dse did not write as a {kind} ({why}); choose "
                             "another folder or move it away")
    return path
