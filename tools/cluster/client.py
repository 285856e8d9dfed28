"""A small client of the local API server: discovery, server-side apply, get/list/delete, and
impersonation (``Impersonate-User`` / ``Impersonate-Group``) to act as a team's principal."""

from __future__ import annotations

import json
import pathlib
import urllib.parse
from dataclasses import dataclass
from typing import Any

import urllib3

FIELD_MANAGER = "pulumi-kubernetes"  # what Pulumi's provider names itself in managedFields


class ApiError(Exception):
    def __init__(self, status: int, message: str, body: dict | None = None):
        super().__init__(message)
        self.status = status
        self.body = body or {}


@dataclass(frozen=True)
class Kind:
    group_version: str
    plural: str
    namespaced: bool


class Client:
    def __init__(self, server: str, pki: pathlib.Path, *, user: str | None = None, groups: list[str] | None = None):
        self.server = server.rstrip("/")
        self.http = urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=str(pki / "ca.crt"), cert_file=str(pki / "admin.crt"), key_file=str(pki / "admin.key"), maxsize=4)
        self._groups = list(groups or []) if user else []
        self._user = user
        self._pki = pki
        self._kinds: dict[tuple[str, str], Kind] = {}

    def impersonate(self, user: str, groups: list[str]) -> Client:
        return Client(self.server, self._pki, user=user, groups=groups)

    # --- HTTP ----------------------------------------------------------------------------

    def request(self, method: str, path: str, *, body: Any = None, params: dict | None = None, content_type: str = "application/json", timeout: float = 30) -> Any:
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        data = None if body is None else (body if isinstance(body, str | bytes) else json.dumps(body))
        # one Impersonate-Group header per group (HTTPHeaderDict keeps repeated names)
        hdrs = urllib3.HTTPHeaderDict(headers)
        if self._user:
            hdrs.add("Impersonate-User", self._user)
            for g in self._groups:
                hdrs.add("Impersonate-Group", g)
        url = self.server + path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            resp = self.http.request(method, url, body=data, headers=hdrs, timeout=timeout, retries=False)
        except urllib3.exceptions.HTTPError as err:
            raise ApiError(0, f"cannot reach the API server at {self.server} ({type(err).__name__})") from None
        text = resp.data.decode(errors="replace")
        if resp.status >= 400:
            try:
                payload = json.loads(text)
            except ValueError:
                payload = {"message": text[:300]}
            raise ApiError(resp.status, payload.get("message") or resp.reason or str(resp.status), payload)
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return text

    def get_path(self, path: str, **kw) -> Any:
        return self.request("GET", path, **kw)

    # --- discovery -----------------------------------------------------------------------

    def kind(self, api_version: str, kind: str, *, refresh: bool = False) -> Kind:
        key = (api_version, kind)
        if key in self._kinds and not refresh:
            return self._kinds[key]
        path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        found = self.get_path(path)
        for res in found.get("resources", []):
            if "/" in res["name"]:
                continue
            self._kinds[(api_version, res["kind"])] = Kind(api_version, res["name"], res["namespaced"])
        if key not in self._kinds:
            raise ApiError(404, f"the API server serves no {kind} in {api_version}")
        return self._kinds[key]

    def path(self, api_version: str, kind: str, name: str | None = None, namespace: str | None = None) -> str:
        k = self.kind(api_version, kind)
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        ns = f"/namespaces/{namespace}" if k.namespaced and namespace else ""
        return f"{base}{ns}/{k.plural}" + (f"/{name}" if name else "")

    # --- objects -------------------------------------------------------------------------

    def apply(self, obj: dict, *, manager: str = FIELD_MANAGER, dry_run: bool = False) -> dict:
        """Server-side apply (what Pulumi's Kubernetes provider does by default), forcing conflicts."""
        meta = obj["metadata"]
        # Strict: an unknown or duplicate field is an error, not silently pruned
        params = {"fieldManager": manager, "force": "true", "fieldValidation": "Strict", **({"dryRun": "All"} if dry_run else {})}
        try:
            path = self.path(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
        except ApiError as err:
            if err.status != 404:
                raise
            path = self.path(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace")) if self._refresh(obj) else None
            if path is None:
                raise
        return self.request("PATCH", path, body=obj, params=params, content_type="application/apply-patch+yaml")

    def _refresh(self, obj: dict) -> bool:
        try:
            self.kind(obj["apiVersion"], obj["kind"], refresh=True)
            return True
        except ApiError:
            return False

    def create(self, obj: dict, *, dry_run: bool = False, strict: bool = False) -> dict:
        meta = obj["metadata"]
        params = {**({"dryRun": "All"} if dry_run else {}), **({"fieldValidation": "Strict"} if strict else {})} or None
        return self.request("POST", self.path(obj["apiVersion"], obj["kind"], None, meta.get("namespace")), body=obj, params=params)

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict:
        return self.get_path(self.path(api_version, kind, name, namespace))

    def get_or_none(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict | None:
        try:
            return self.get(api_version, kind, name, namespace)
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def list(self, api_version: str, kind: str, namespace: str | None = None, *, label_selector: str | None = None) -> list[dict]:
        params = {"labelSelector": label_selector} if label_selector else None
        return self.get_path(self.path(api_version, kind, None, namespace), params=params).get("items", [])

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None, *, propagation: str = "Background") -> None:
        try:
            self.request("DELETE", self.path(api_version, kind, name, namespace), body={"propagationPolicy": propagation})
        except ApiError as err:
            if err.status != 404:
                raise
