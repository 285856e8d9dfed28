"""The portal on a local control plane: the teams stack with ``portal.enabled`` (a cluster of its
own), the app built as in the cluster but with a test signing key for the ALB's header and the
portal service account's own token (so every call goes through its impersonation rights)."""

from __future__ import annotations

import copy
import time

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from kubernetes import client, config

from k8s.builders import portal as mp
from tests.e2e.conftest import stack_file
from trainctl.portal.__main__ import settings_of

STACK = "teams"
INSTANCE = "portal"
TEAM_GROUPS = {"vision": "vision-devs", "nlp": "nlp-devs"}
# the seed guide's namespace, a team of the portal's e2e stack only (tests/e2e/test_portal.py)
GUIDE_TEAM, GUIDE_GROUP, GUIDE_TENANT = "user-123", "user-123-devs", {"gpuQuota": 4}
PORTAL = {
    "enabled": True, "host": "portal.example.com", "certificateArn": "arn:aws:acm:us-west-2:123456789012:certificate/12345678-1234-1234-1234-123456789012",
    "issuer": "https://idp.example.com", "authorizationEndpoint": "https://idp.example.com/authorize", "tokenEndpoint": "https://idp.example.com/token",
    "userInfoEndpoint": "https://idp.example.com/userinfo", "clientId": "portal",
    # as `pulumi config set --secret --path` writes it: offline an unknown secret (tools/mock_config.py), masked in the plan
    "clientSecret": {"secure": "v1:dGVzdC1jaXBoZXJ0ZXh0LW5vdC1hLXNlY3JldA=="},
    "teams": {team: {"groups": [group]} for team, group in TEAM_GROUPS.items()},
}
KEY = ec.generate_private_key(ec.SECP256R1())
PUBLIC = KEY.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
KID = "5b4e9c2a-1111-4222-8333-944455556666"


def portal_stack() -> dict:
    stack = copy.deepcopy(stack_file(STACK))
    stack["config"]["training-platform:portal"] = copy.deepcopy(PORTAL)
    stack["config"]["training-platform:tenants"][GUIDE_TEAM] = copy.deepcopy(GUIDE_TENANT)
    stack["config"]["training-platform:portal"]["teams"][GUIDE_TEAM] = {"groups": [GUIDE_GROUP]}
    return stack


def admin_api(up) -> client.ApiClient:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(up.kubeconfig), client_configuration=cfg, persist_config=False)
    return client.ApiClient(cfg)


def portal_configuration(up) -> client.Configuration:
    """The API server as the portal's pod sees it: its service account's token, nothing else."""
    admin = admin_api(up)
    token = client.CoreV1Api(admin).create_namespaced_service_account_token(mp.NAME, "platform-portal", {"spec": {"expirationSeconds": 3600}}).status.token
    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert, cfg.verify_ssl = admin.configuration.host, admin.configuration.ssl_ca_cert, True
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return cfg


def rendered_settings(up):
    """The portal's settings as the stack rendered them (its ConfigMap, read back from the cluster)."""
    import json

    cm = client.CoreV1Api(admin_api(up)).read_namespaced_config_map(mp.NAME, "platform-portal")
    return settings_of(json.loads(cm.data[mp.CONFIG_KEY]))


def signer(up) -> str:
    return rendered_settings(up).signer + "0123456789abcdef"


def alb_header(up, sub: str, team: str, *, exp_in: int = 300, key=KEY, signer_arn: str | None = None, email: bool = True) -> dict[str, str]:
    """The ALB's signed claims of ``sub`` in ``team``'s group; ``email=False``: an IdP that sends no email claim (the user is ``sub``)."""
    exp = int(time.time()) + exp_in
    claims = {"sub": sub, **({"email": f"{sub}@example.com"} if email else {}), "groups": [{**TEAM_GROUPS, GUIDE_TEAM: GUIDE_GROUP}[team]], "exp": exp}
    token = jwt.encode(claims, key, algorithm="ES256",
                       headers={"kid": KID, "signer": signer_arn or signer(up), "exp": exp})
    # with what the ALB adds to every request it forwards (trainctl/portal/identity.py forwarded_source)
    return {"x-amzn-oidc-data": token, "x-forwarded-proto": "https", "x-forwarded-for": "198.51.100.20"}


def alb_keys(kid: str) -> str:
    if kid != KID:
        raise KeyError(kid)
    return PUBLIC
