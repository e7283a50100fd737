"""Volumes: disk-backed directories with a size cap that outlive sandboxes and daemon
restarts (docs/volumes.md). Create one with :meth:`Volume.create`, mount it with
``Sandbox.create(volumes=[...])``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote

from ._http import Transport
from .errors import InvalidArgumentError

__all__ = ["Volume", "VolumeInfo", "VolumeSpec"]

#: How a create names a volume to mount: ``"name:/path"``, ``"name:/path:ro"``,
#: ``("name", "/path")``, ``("name", "/path", True)`` or the API's own
#: ``{"name": …, "path": …, "read_only": …}``.
VolumeSpec = Union[str, Tuple[Any, ...], Mapping[str, Any]]


@dataclass(frozen=True)
class VolumeInfo:
    """What the daemon says about a volume."""

    name: str
    size_mb: int
    created_at: str
    #: Live sandboxes that have it mounted.
    mounted_by: int

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "VolumeInfo":
        return cls(name=str(d.get("name", "")), size_mb=int(d.get("size_mb", 0)),
                   created_at=str(d.get("created_at", "")), mounted_by=int(d.get("mounted_by", 0)))


def mount_body(spec: VolumeSpec) -> Dict[str, Any]:
    """One entry of the create body's ``volumes``."""
    if isinstance(spec, str):
        name, _, rest = spec.partition(":")
        read_only = rest.endswith(":ro")
        path = rest[:-3] if read_only else (rest[:-3] if rest.endswith(":rw") else rest)
        if not name or not path:
            raise InvalidArgumentError(f"volume must be 'name:/path' or 'name:/path:ro', got {spec!r}",
                                       code="invalid_request")
        return {"name": name, "path": path, "read_only": read_only}
    if isinstance(spec, tuple):
        if len(spec) not in (2, 3):
            raise InvalidArgumentError("a volume tuple is (name, path) or (name, path, read_only)",
                                       code="invalid_request")
        return {"name": spec[0], "path": spec[1], "read_only": bool(spec[2]) if len(spec) == 3 else False}
    return dict(spec)


def mounts_body(volumes: Optional[Sequence[VolumeSpec]]) -> Optional[List[Dict[str, Any]]]:
    return [mount_body(v) for v in volumes] if volumes else None


class Volume:
    """Volume operations (each one call of docs/api.md#volumes). ``url``/``api_key`` default
    to ``$GLOVEBOX_URL`` / ``$GLOVEBOX_API_KEY``."""

    @staticmethod
    def create(name: str, size_mb: int, url: Optional[str] = None, api_key: Optional[str] = None) -> VolumeInfo:
        """Creates a volume of ``size_mb`` MiB (writes beyond it fail with ENOSPC). Raises
        ``ConflictError`` if it exists."""
        t = Transport(url, api_key)
        r = t.request("POST", "/v1/volumes", json={"name": name, "size_mb": int(size_mb)})
        return VolumeInfo.from_json(r.json())

    @staticmethod
    def list(url: Optional[str] = None, api_key: Optional[str] = None) -> List[VolumeInfo]:
        """The caller's volumes, by name."""
        r = Transport(url, api_key).request("GET", "/v1/volumes").json() or {}
        return [VolumeInfo.from_json(v) for v in r.get("volumes", [])]

    @staticmethod
    def get(name: str, url: Optional[str] = None, api_key: Optional[str] = None) -> VolumeInfo:
        """One volume (``NotFoundError``, code ``volume_not_found``, if there is none)."""
        r = Transport(url, api_key).request("GET", f"/v1/volumes/{quote(name, safe='')}")
        return VolumeInfo.from_json(r.json())

    @staticmethod
    def delete(name: str, url: Optional[str] = None, api_key: Optional[str] = None) -> None:
        """Deletes a volume and its data (``ConflictError``, code ``volume_in_use``, while a
        live sandbox mounts it)."""
        Transport(url, api_key).request("DELETE", f"/v1/volumes/{quote(name, safe='')}")
