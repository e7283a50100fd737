"""Snapshots: a sandbox's files at one moment, kept as a read-only layer (docs/snapshots.md).
Take one with :meth:`Sandbox.snapshot`, start from one with ``Sandbox.create(snapshot=...)``,
fork a sandbox with :meth:`Sandbox.fork`. Processes and memory are never part of a snapshot."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Dict, List, Optional
from urllib.parse import quote

from ._http import Transport
from .models import parse_time


@dataclass
class SnapshotInfo:
    """What the daemon says about a snapshot."""

    name: str
    template: str
    source_sandbox: str
    created_at: Optional[datetime]
    layer: str
    size_bytes: int
    #: Special files (fifos, sockets, device nodes) left out of it.
    skipped: int
    #: Live sandboxes started from it.
    sandboxes: int

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "SnapshotInfo":
        return cls(
            name=d["name"],
            template=d.get("template", ""),
            source_sandbox=d.get("source_sandbox", ""),
            created_at=parse_time(d.get("created_at")),
            layer=d.get("layer", ""),
            size_bytes=int(d.get("size_bytes") or 0),
            skipped=int(d.get("skipped") or 0),
            sandboxes=int(d.get("sandboxes") or 0),
        )


class Snapshot:
    """Snapshot operations (each one call of docs/api.md#snapshots-and-forks). ``url``/``api_key``
    default to ``$GLOVEBOX_URL`` / ``$GLOVEBOX_API_KEY``."""

    @staticmethod
    def list(url: Optional[str] = None, api_key: Optional[str] = None) -> List[SnapshotInfo]:
        """The caller's snapshots, by name."""
        r = Transport(url, api_key).request("GET", "/v1/snapshots").json() or {}
        return [SnapshotInfo.from_json(s) for s in r.get("snapshots", [])]

    @staticmethod
    def get(name: str, url: Optional[str] = None, api_key: Optional[str] = None) -> SnapshotInfo:
        """One snapshot (``NotFoundError``, code ``snapshot_not_found``, if there is none)."""
        r = Transport(url, api_key).request("GET", f"/v1/snapshots/{quote(name, safe='')}")
        return SnapshotInfo.from_json(r.json())

    @staticmethod
    def delete(name: str, url: Optional[str] = None, api_key: Optional[str] = None) -> None:
        """Deletes a snapshot. Never refused for being in use: sandboxes started from it keep
        running on its files, which go with the last of them."""
        Transport(url, api_key).request("DELETE", f"/v1/snapshots/{quote(name, safe='')}")
