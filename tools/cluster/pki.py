"""Certificates for the local control plane, made at start with the ``openssl`` command.

One CA signs the API server's serving certificate, the admin client certificate (group
``system:masters``) and the serving certificate every webhook server uses (127.0.0.1); the API
server verifies webhooks with that CA (their ``caBundle``). A second CA, the front proxy's, signs
only the client certificate the API server presents to aggregated API servers (Kueue's visibility
API), which they trust for the user it names (Kubernetes' "Configure the Aggregation Layer": a CA
of its own, so no other client certificate can assert a user). The service-account signing key is
a separate RSA key.
"""

from __future__ import annotations

import base64
import pathlib
import shutil
import subprocess


class PkiError(Exception):
    pass


def _openssl(*args: str, cwd: pathlib.Path) -> None:
    if shutil.which("openssl") is None:
        raise PkiError("the openssl command is not on PATH (Debian package openssl)")
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise PkiError(f"openssl {args[0]} failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")


def _key(path: pathlib.Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path), cwd=path.parent)


def _sign(d: pathlib.Path, name: str, subject: str, *, sans: list[str] | None = None, client: bool = False, days: int = 30, ca: str = "ca") -> None:
    _key(d / f"{name}.key")
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=d)
    ext = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment"]
    ext.append("extendedKeyUsage=clientAuth" if client else "extendedKeyUsage=serverAuth")
    if sans:
        ext.append("subjectAltName=" + ",".join(sans))
    (d / f"{name}.ext").write_text("\n".join(ext) + "\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial", "-days", str(days), "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=d)
    (d / f"{name}.csr").unlink()
    (d / f"{name}.ext").unlink()


FRONT_PROXY_CLIENT = "front-proxy-client"  # the API server's name to aggregated API servers (--requestheader-allowed-names)


def _ca(d: pathlib.Path, name: str, subject: str) -> None:
    _key(d / f"{name}.key")
    _openssl("req", "-x509", "-new", "-key", f"{name}.key", "-subj", subject, "-days", "30", "-sha256", "-out", f"{name}.crt",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", cwd=d)


def make(d: pathlib.Path) -> None:
    """ca, apiserver (serving), admin (client, system:masters), webhook (serving 127.0.0.1), sa (RSA);
    front-proxy-ca and front-proxy-client (the API server's client certificate to aggregated APIs)."""
    d.mkdir(parents=True, exist_ok=True)
    _ca(d, "ca", "/CN=training-platform-local-ca")
    _ca(d, "front-proxy-ca", "/CN=training-platform-local-front-proxy-ca")
    _sign(d, "front-proxy-client", f"/CN={FRONT_PROXY_CLIENT}", client=True, ca="front-proxy-ca")
    _sign(d, "apiserver", "/CN=kube-apiserver", sans=["IP:127.0.0.1", "DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default", "DNS:kubernetes.default.svc", "IP:10.96.0.1"])
    _sign(d, "admin", "/O=system:masters/CN=training-platform-admin", client=True)
    _sign(d, "webhook", "/CN=127.0.0.1", sans=["IP:127.0.0.1", "DNS:localhost"])
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key", cwd=d)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)
    for key in d.glob("*.key"):
        key.chmod(0o600)


def ca_bundle(d: pathlib.Path) -> str:
    return base64.b64encode((d / "ca.crt").read_bytes()).decode()


def kubeconfig(d: pathlib.Path, server: str, *, namespace: str | None = None) -> str:
    """An admin kubeconfig with the certificates inline (it stays valid wherever it is copied)."""
    b64 = lambda name: base64.b64encode((d / name).read_bytes()).decode()  # noqa: E731
    context: dict = {"cluster": "local", "user": "admin", **({"namespace": namespace} if namespace else {})}
    import yaml

    return yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")}}],
        "users": [{"name": "admin", "user": {"client-certificate-data": b64("admin.crt"), "client-key-data": b64("admin.key")}}],
        "contexts": [{"name": "local", "context": context}],
        "current-context": "local",
    }, sort_keys=False)
