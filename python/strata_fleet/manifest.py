"""The VMs of a fleet job: from a manifest (TOML) or a directory of images.

Manifest::

    [[vm]]
    name = "web-1"                 # the series of its snapshots
    host = "host-a"                # where its image lives
    image = "/var/lib/vms/web-1.img"
    changed_blocks = "/var/lib/vms/web-1.dirty"   # optional: extents changed
                                                  # since the last backup

A changed-block list is one extent per line, ``OFFSET LENGTH`` in bytes
(``#`` comments allowed), or the JSON list ``qemu-img map --output=json``
prints for a dirty-bitmap export (entries with ``"data": true`` count).
``--images DIR``: every regular file of DIR is a VM named after its file,
and every subdirectory a VM named after it holding its image (its one
regular file, e.g. ``disk.img``: the layout ``strata-bench gen vmfleet``
writes); VMs go to the hosts in turn.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


# A host's name names its work directory: no path separators, no dot names.
HOST_NAME = re.compile(r"(?!\.{1,2}$)[A-Za-z0-9._-]{1,64}")


class ManifestError(ValueError):
    """A manifest or image list that cannot be used (the message says why)."""


@dataclass
class Vm:
    name: str
    host: str
    image: str
    changed: Optional[list[tuple[int, int]]] = None
    size: int = 0
    index: int = 0
    problem: Optional[str] = field(default=None)


def read_changed(path: str) -> list[tuple[int, int]]:
    """A changed-block list (see the module's doc)."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ManifestError(f"cannot read the changed-block list {path}: {e.strerror}") from e
    if text.lstrip().startswith("["):
        try:
            return [(int(x["start"]), int(x["length"])) for x in json.loads(text) if x.get("data", True)]
        except (ValueError, KeyError, TypeError) as e:
            raise ManifestError(f"{path}: not a qemu-img map JSON list ({e})") from e
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            off, length = (int(x, 0) for x in line.split())
        except ValueError as e:
            raise ManifestError(f"{path}:{n}: expected OFFSET LENGTH, got {line!r}") from e
        out.append((off, length))
    return out


def load_manifest(path: str) -> list[Vm]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ManifestError(f"cannot read the manifest {path}: {e.strerror}") from e
    except tomllib.TOMLDecodeError as e:
        raise ManifestError(f"the manifest {path} is not valid TOML: {e}") from e
    vms = []
    seen = set()
    for i, v in enumerate(data.get("vm", [])):
        if not isinstance(v, dict) or not v.get("name") or not v.get("image") or not v.get("host"):
            raise ManifestError(f"{path}: vm #{i + 1} needs name, host and image")
        if v["name"] in seen:
            raise ManifestError(f"{path}: two VMs named {v['name']!r}")
        seen.add(v["name"])
        if not HOST_NAME.fullmatch(str(v["host"])):
            raise ManifestError(f"{path}: vm {v['name']!r}: host {v['host']!r} is not a host name (letters, digits, '.', '_', '-')")
        base = os.path.dirname(path) or "."
        image = str(Path(base, v["image"]).resolve())
        cb = v.get("changed_blocks")
        cb = str(Path(base, cb).resolve()) if cb else None
        vms.append(Vm(name=str(v["name"]), host=str(v["host"]), image=image, changed=read_changed(cb) if cb else None))
    if not vms:
        raise ManifestError(f"{path}: no [[vm]] entries")
    return _finish(vms)


def from_directory(d: str, hosts: list[str]) -> list[Vm]:
    root = Path(d)
    if not root.is_dir():
        raise ManifestError(f"{d} is not a directory of images")
    vms = []
    for entry in sorted(root.iterdir()):
        if entry.is_dir():
            files = sorted(p for p in entry.iterdir() if p.is_file())
            if len(files) != 1:
                raise ManifestError(f"{entry}: a VM's directory holds one image, not {len(files)} files")
            name, img = entry.name, files[0]
        elif entry.is_file():
            name, img = entry.stem, entry
        else:
            continue
        vms.append(Vm(name=name, host=hosts[len(vms) % len(hosts)], image=str(img.resolve())))
    if not vms:
        raise ManifestError(f"{d}: no images")
    names = [v.name for v in vms]
    if len(set(names)) != len(names):
        raise ManifestError(f"{d}: two images with one name")
    return _finish(vms)


def _finish(vms: list[Vm]) -> list[Vm]:
    for i, v in enumerate(vms):
        v.index = i
        try:
            v.size = os.stat(v.image).st_size
        except OSError as e:
            v.problem = f"VM {v.name}: cannot read its image {v.image}: {e.strerror}"
    return vms
