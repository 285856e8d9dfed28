"""The cluster side of trainctl: the Kubeflow SDK's ``TrainerClient`` where it serves, the
kubernetes client where it does not.

The SDK (``kubeflow`` 0.5.0, ``kubeflow/trainer/backends/kubernetes/backend.py``) is used for
``runtimes`` (``list_runtimes``), ``logs`` (``get_job_logs``: the pod of ``node-K``, container
``node``, following with a watch), ``delete`` (``delete_job``) and the per-node steps of
``status`` (``get_job``). The plain kubernetes client is used for what the SDK does not do:

* creating the code ConfigMap and a TrainJob whose spec the platform's builders made (the SDK's
  ``train`` builds its own spec from a function or image and ships no code directory);
* deleting the job's ConfigMap, which the SDK does not know about;
* the SelfSubjectAccessReview before creating anything;
* ``list`` and the conditions of ``status``: the SDK's TrainJob keeps only Created/Running/
  Complete/Failed, without the Suspended condition (queued in Kueue) or any message, and costs a
  runtime lookup and a pod listing per job;
* finding the current runtime by the platform's label and the TrainJob shape the cluster serves.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3 import HTTPHeaderDict
from urllib3.exceptions import HTTPError, MaxRetryError

from k8s.builders.runtimes import FAMILY_LABEL, JOBSET_NAME_LABEL, RUNTIME_LABEL  # the JobSet label is on every pod of a TrainJob's JobSet (named as the TrainJob)

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
TRAINJOBS, RUNTIMES = "trainjobs", "clustertrainingruntimes"
VISIBILITY_GROUP, VISIBILITY_VERSION = "visibility.kueue.x-k8s.io", "v1beta2"
# The OpenAPI v3 document of a group-version is readable by every authenticated user (the
# system:discovery ClusterRole grants /openapi/*). A CRD kind's schema is named
# <group reversed>.<version>.<Kind> (kube-openapi util.ToRESTFriendlyName, used by
# apiextensions-apiserver pkg/controller/openapi/builder).
OPENAPI_PATH = f"/openapi/v3/apis/{GROUP}/{VERSION}"
TRAINJOB_SCHEMA = "org.kubeflow.trainer.v1alpha1.TrainJob"
# Which Trainer release serves which TrainJob shape (k8s/builders/trainer_api.py): runtimePatches from v2.2.
SHAPE_VERSIONS = {"runtimePatches": "v2.3.0", "podTemplateOverrides": "v2.1.0"}


class ClusterError(Exception):
    """A failed cluster call, as one line for the user."""


class NotAllowed(ClusterError):
    """The API server refused a read (HTTP 403): one line naming the verb, the resource and the
    namespace, so a refusal never reads as "none"."""

    def __init__(self, verb: str, resource: str, namespace: str | None, user: str | None = None):
        self.verb, self.resource, self.namespace = verb, resource, namespace
        self.user = user  # whom the API server refused, as its message names them (the portal's impersonated user)
        where = f"in {namespace}" if namespace else "at the cluster scope"
        super().__init__(f"not allowed: {verb} {resource} {where} (ask the platform team)")


# The API server's 403 message (k8s.io/apiserver v0.34.4 pkg/endpoints/handlers/responsewriters/
# errors.go forbiddenMessage): 'User "u" cannot <verb> resource "<resource>[/<sub>]" in API group
# "<group>" in the namespace "<ns>"' or '... at the cluster scope'.
_FORBIDDEN = re.compile(r'cannot (\S+) resource "([^"]+)" in API group "[^"]*"(?: in the namespace "([^"]+)")?')
_REFUSED_USER = re.compile(r'User "([^"]+)" cannot ')


def not_allowed(err: BaseException, verb: str | None = None, resource: str | None = None, namespace: str | None = None) -> NotAllowed | None:
    """The :class:`NotAllowed` of a 403 (also wrapped by the SDK), else None: the verb, resource and
    namespace as the caller names them, else as the API server's message names them."""
    if status_of(err) != 403:
        return None
    message = api_message(err)
    found = _FORBIDDEN.search(message)
    if found:
        verb, resource, namespace = verb or found.group(1), resource or found.group(2), namespace or found.group(3)
    user = _REFUSED_USER.search(message)
    return NotAllowed(verb or "read", resource or "this", namespace, user.group(1) if user else None)


def unreachable(err: BaseException) -> str:
    """One line for a connection that failed (urllib3 retries end in MaxRetryError)."""
    reason = err.reason if isinstance(err, MaxRetryError) and err.reason is not None else err
    host = f" {err.pool.host}:{err.pool.port}" if isinstance(err, MaxRetryError) and err.pool is not None else ""
    text = str(reason).split(": ")[-1].rstrip("')\"")
    return f"cannot reach the API server{host} ({text}); is the cluster up and the kubeconfig's server right?"


def api_message(err: BaseException) -> str:
    """One line from an ApiException (the Status message the API server returned), also when the
    SDK wrapped it (``RuntimeError(...) from ApiException``)."""
    cause: BaseException | None = err
    while cause is not None and not isinstance(cause, ApiException):
        cause = cause.__cause__
    if isinstance(cause, ApiException):
        try:
            body = json.loads(cause.body or "{}")
            message = body.get("message") or cause.reason
        except (ValueError, AttributeError):
            message = cause.reason
        return f"{message} (HTTP {cause.status})"
    return str(err)


def status_of(err: BaseException) -> int | None:
    cause: BaseException | None = err
    while cause is not None and not isinstance(cause, ApiException):
        cause = cause.__cause__
    return cause.status if isinstance(cause, ApiException) else None


def kubeconfig_path(kubeconfig: str | None) -> str:
    """``--kubeconfig``, else ``$KUBECONFIG`` as it is now (a list of files separated by ``:`` is
    merged by the client), else ``~/.kube/config``: the usual places, read at each call (the
    client's own default is read once, at import)."""
    return kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")


def kube_context(kubeconfig: str | None, context: str | None) -> dict[str, Any]:
    """The kubeconfig's context entry: ``context`` by name, else the active one."""
    try:
        found: Any = config.list_kube_config_contexts(config_file=kubeconfig_path(kubeconfig))
        contexts, active = found
    except (ConfigException, OSError) as err:
        raise ClusterError(f"no usable kubeconfig ({err}); pass --kubeconfig or set KUBECONFIG") from None
    chosen = next((c for c in contexts if c["name"] == context), None) if context else active
    if chosen is None:
        raise ClusterError(f"kubeconfig has no context {context!r}")
    return chosen


def default_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace of the kubeconfig context (``default`` when it names none)."""
    return (kube_context(kubeconfig, context).get("context") or {}).get("namespace") or "default"


class _HeaderPool:
    """A urllib3 pool that adds fixed headers to every request, a header with several values as
    several headers (``Impersonate-Group`` once per group: the API server reads each header line as
    one group, k8s.io/apiserver pkg/endpoints/filters/impersonation.go), which the kubernetes
    client's one-value default headers cannot send."""

    def __init__(self, inner: Any, headers: dict[str, list[str]]):
        self._inner, self._headers = inner, headers

    def request(self, method: str, url: str, headers: Any = None, **kwargs: Any) -> Any:
        merged = HTTPHeaderDict(dict(headers or {}))
        for key, values in self._headers.items():
            merged.discard(key)  # never one the caller set
            for value in values:
                merged.add(key, value)
        return self._inner.request(method, url, headers=merged, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class KubeApi:
    """The Kubernetes API as trainctl uses it: one namespace, through a kubeconfig context."""

    def __init__(self, *, namespace: str, kubeconfig: str | None = None, context: str | None = None, configuration: client.Configuration | None = None, headers: dict[str, list[str]] | None = None):
        """``configuration``: a client configuration made elsewhere (the portal's: in-cluster or a
        caller's bearer token) instead of a kubeconfig. ``headers``: sent on every request (the
        portal's ``Impersonate-*``); a client with headers makes no call through the Kubeflow SDK,
        which builds a client of its own that would not send them."""
        self.namespace = namespace
        if configuration is not None:
            self.configuration = configuration
        else:
            self.configuration = client.Configuration()
            try:
                config.load_kube_config(config_file=kubeconfig_path(kubeconfig), context=context, client_configuration=self.configuration, persist_config=False)
            except (ConfigException, OSError) as err:
                raise ClusterError(f"no usable kubeconfig ({err}); pass --kubeconfig or set KUBECONFIG") from None
        self.headers = {k: list(v) for k, v in (headers or {}).items()}
        self.api = client.ApiClient(self.configuration)
        if self.headers:
            rest: Any = self.api.rest_client
            rest.pool_manager = _HeaderPool(rest.pool_manager, self.headers)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.authz = client.AuthorizationV1Api(self.api)
        self._trainer: Any = None

    @property
    def trainer(self) -> Any:
        """The Kubeflow SDK's TrainerClient on the same kubeconfig and namespace."""
        if self.headers:
            raise ClusterError("internal: a client with its own headers (impersonation) makes no call through the Kubeflow SDK")
        if self._trainer is None:
            from kubeflow.common.types import KubernetesBackendConfig
            from kubeflow.trainer import TrainerClient

            # its control-plane version probe only logs a warning when the ConfigMap is not readable
            logging.getLogger("kubeflow").setLevel(logging.ERROR)
            self._trainer = TrainerClient(backend_config=KubernetesBackendConfig(namespace=self.namespace, client_configuration=self.configuration))
        return self._trainer

    def _call(self, what: str, fn, *args, read: tuple[str, str] | None = None, **kwargs) -> Any:
        """``read``: (verb, resource) of a read in the namespace, whose 403 is :class:`NotAllowed`."""
        try:
            return fn(*args, **kwargs)
        except ApiException as err:
            refused = not_allowed(err, *read, self.namespace) if read else None
            if refused:
                raise refused from None
            raise ClusterError(f"{what}: {api_message(err)}") from None
        except (OSError, HTTPError) as err:  # urllib3 connection errors (MaxRetryError after its retries)
            raise ClusterError(f"{what}: {unreachable(err)}") from None

    # --- access and discovery ----------------------------------------------------------------

    def can(self, verb: str, group: str, resource: str) -> tuple[bool, str]:
        """SelfSubjectAccessReview for ``verb`` on ``resource`` in the namespace."""
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"namespace": self.namespace, "verb": verb, "group": group, "resource": resource}},
        }
        review = self._call("access review", self.authz.create_self_subject_access_review, body)
        status = review.status
        return bool(status and status.allowed), (status.reason or "") if status else ""

    def served_trainer_version(self) -> str:
        """The Trainer release whose TrainJob shape the cluster serves (from the served schema)."""
        doc = self._call(
            "reading the TrainJob schema", self.api.call_api, OPENAPI_PATH, "GET",
            auth_settings=["BearerToken"], response_type="object", _return_http_data_only=True,
        )
        schema = (doc or {}).get("components", {}).get("schemas", {}).get(TRAINJOB_SCHEMA)
        if schema is None:
            raise ClusterError(f"the cluster serves no TrainJob ({GROUP}/{VERSION}): is Kubeflow Trainer installed?")
        spec = schema.get("properties", {}).get("spec", {}).get("properties", {})
        for shape, version in SHAPE_VERSIONS.items():
            if shape in spec:
                return version
        raise ClusterError(f"the served TrainJob has neither {' nor '.join(SHAPE_VERSIONS)}: a Trainer release trainctl does not know; pass --trainer-version")

    def current_runtime(self, base: str) -> str:
        """The current content-hashed name of a platform runtime: the one labelled
        ``training-platform/runtime=<base>`` that is not being deleted (an old one stays, held by
        the Trainer's finalizer, while jobs use it), the newest if several."""
        found = self._call(
            "listing runtimes", self.custom.list_cluster_custom_object, GROUP, VERSION, RUNTIMES, label_selector=f"{RUNTIME_LABEL}={base}",
        )
        live = [r for r in found.get("items", []) if (r["metadata"].get("labels") or {}).get(RUNTIME_LABEL) == base and not r["metadata"].get("deletionTimestamp")]
        if not live:
            raise ClusterError(f"the cluster has no runtime {base} (label {RUNTIME_LABEL}={base}); `trainctl runtimes` lists what it offers")
        live.sort(key=lambda r: r["metadata"].get("creationTimestamp", ""))
        return live[-1]["metadata"]["name"]

    def runtimes_of(self, family: str) -> list[dict]:
        """The platform's runtimes of one kind (label ``training-platform/runtime-family``): the base
        runtime and its grace variants."""
        found = self._call("listing runtimes", self.custom.list_cluster_custom_object, GROUP, VERSION, RUNTIMES, label_selector=f"{FAMILY_LABEL}={family}")
        return list(found.get("items", []))

    def platform_facts(self) -> dict | None:
        """The platform's published facts (ConfigMap ``platform-facts`` in the namespace), or None
        where the cluster publishes none (or they may not be read)."""
        from k8s.builders import platform_facts

        try:
            cm: Any = self.core.read_namespaced_config_map(platform_facts.CONFIGMAP, self.namespace)
        except ApiException as err:
            if err.status in (403, 404):
                return None
            raise ClusterError(f"reading the platform's facts: {api_message(err)}") from None
        except (OSError, HTTPError) as err:
            raise ClusterError(f"reading the platform's facts: {unreachable(err)}") from None
        try:
            found = json.loads((cm.data or {}).get(platform_facts.KEY) or "null")
        except ValueError:
            return None
        return found if isinstance(found, dict) else None

    # --- objects -----------------------------------------------------------------------------

    def create_configmap(self, body: dict) -> bool:
        """Create the code ConfigMap; False when it exists already (same name = same content)."""
        try:
            self.core.create_namespaced_config_map(self.namespace, body)
            return True
        except ApiException as err:
            if err.status == 409:
                return False
            raise ClusterError(f"creating configmap {body['metadata']['name']}: {api_message(err)}") from None

    def delete_configmap(self, name: str) -> bool:
        try:
            self.core.delete_namespaced_config_map(name, self.namespace)
            return True
        except ApiException as err:
            if err.status == 404:
                return False
            raise ClusterError(f"deleting configmap {name}: {api_message(err)}") from None

    def create_trainjob(self, body: dict) -> dict:
        return self._call(f"creating trainjob {body['metadata']['name']}", self.custom.create_namespaced_custom_object, GROUP, VERSION, self.namespace, TRAINJOBS, body)

    def list_trainjobs(self) -> list[dict]:
        return self._call("listing trainjobs", self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, TRAINJOBS, read=("list", TRAINJOBS)).get("items", [])

    def get_trainjob(self, name: str) -> dict:
        try:
            found: Any = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, TRAINJOBS, name)
            return found
        except ApiException as err:
            if err.status == 404:
                raise ClusterError(f"trainjob {name} not found in namespace {self.namespace}") from None
            raise not_allowed(err, "get", TRAINJOBS, self.namespace) or ClusterError(f"reading trainjob {name}: {api_message(err)}") from None

    def pods(self, name: str) -> list[dict]:
        found = self._call(f"listing the pods of {name}", self.core.list_namespaced_pod, self.namespace, label_selector=f"{JOBSET_NAME_LABEL}={name}", _preload_content=False, read=("list", "pods"))
        return json.loads(found.data).get("items", [])  # as served (timestamps as the API writes them)

    def events(self, kind: str, name: str | None = None) -> list[dict]:
        selector = f"involvedObject.kind={kind}" + (f",involvedObject.name={name}" if name else "")
        found = self._call("listing events", self.core.list_namespaced_event, self.namespace, field_selector=selector, _preload_content=False, read=("list", "events"))
        return json.loads(found.data).get("items", [])

    def workloads(self, name: str) -> list[dict]:
        """Kueue's Workloads of the TrainJob (named ``trainjob-<name>-<hash>``); none without Kueue
        (404: the cluster serves no Workloads); :class:`NotAllowed` when they may not be read."""
        try:
            found: Any = self.custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", self.namespace, "workloads")
        except ApiException as err:
            if err.status == 404:
                return []
            raise not_allowed(err, "list", "workloads", self.namespace) or ClusterError(f"listing workloads: {api_message(err)}") from None
        return [w for w in found.get("items", []) if w["metadata"]["name"].startswith(f"trainjob-{name}-")]

    def all_workloads(self, *, all_namespaces: bool) -> list[dict]:
        """Kueue's Workloads of this namespace, or of every namespace (platform admins)."""
        what = "listing workloads" + (" in every namespace" if all_namespaces else f" in {self.namespace}")
        try:
            if all_namespaces:
                found: Any = self.custom.list_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "workloads")
            else:
                found = self.custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", self.namespace, "workloads")
        except ApiException as err:
            raise not_allowed(err, "list", "workloads", None if all_namespaces else self.namespace) or ClusterError(f"{what}: {api_message(err)}") from None
        return found.get("items", [])

    def nodes(self, names: set[str]) -> list[dict]:
        """The named nodes a team may read (none where RBAC says no: a team has no cluster scope)."""
        out = []
        for node in sorted(names):
            try:
                found: Any = self.core.read_node(node, _preload_content=False)
                out.append(json.loads(found.data))
            except (ApiException, HTTPError):
                continue
        return out

    def log_tail(self, pod: str, lines: int = 40) -> list[str]:
        """The pod's last lines; none where it has none yet; :class:`NotAllowed` when refused."""
        try:
            found: Any = self.core.read_namespaced_pod_log(pod, self.namespace, tail_lines=lines, _preload_content=False)
            text = found.data.decode(errors="replace")
        except ApiException as err:
            refused = not_allowed(err, "get", "pods/log", self.namespace)
            if refused:
                raise refused from None
            return []
        except HTTPError:
            return []
        return text.splitlines()

    # --- through the Kubeflow SDK ------------------------------------------------------------

    def _sdk(self, what: str, fn, *args, **kwargs) -> Any:
        try:
            return fn(*args, **kwargs)
        except (RuntimeError, TimeoutError, ApiException) as err:
            if status_of(err) == 404:
                raise ClusterError(f"{what}: not found in namespace {self.namespace}") from None
            raise not_allowed(err) or ClusterError(f"{what}: {api_message(err)}") from None

    def runtimes(self) -> list[Any]:
        return self._sdk("listing runtimes", self.trainer.list_runtimes)

    def job(self, name: str) -> Any:
        return self._sdk(f"trainjob {name}", self.trainer.get_job, name)

    def logs(self, name: str, *, node: int, follow: bool) -> Iterator[str]:
        try:
            yield from self.trainer.get_job_logs(name, follow=follow, step=f"node-{node}")
        except (RuntimeError, TimeoutError, ApiException) as err:
            if status_of(err) == 404:
                raise ClusterError(f"trainjob {name}: not found in namespace {self.namespace}") from None
            raise not_allowed(err, "get", "pods/log", self.namespace) or ClusterError(f"logs of {name}: {api_message(err)}") from None

    def delete_trainjob(self, name: str) -> None:
        self._sdk(f"deleting trainjob {name}", self.trainer.delete_job, name)


    # --- without the SDK (the portal: every call carries the caller's identity) -----------------

    def delete_trainjob_direct(self, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, TRAINJOBS, name)
        except ApiException as err:
            if err.status == 404:
                raise ClusterError(f"trainjob {name} not found in namespace {self.namespace}") from None
            raise ClusterError(f"deleting trainjob {name}: {api_message(err)}") from None
        except (OSError, HTTPError) as err:
            raise ClusterError(f"deleting trainjob {name}: {unreachable(err)}") from None

    def delete_trainjob_foreground(self, name: str) -> None:
        """Delete the TrainJob after its dependents (``propagationPolicy: Foreground``: the API
        server keeps it, with a deletion timestamp, until the objects it owns with
        ``blockOwnerDeletion`` are gone: its JobSet, whose Jobs and pods go first in turn). The Trainer
        sets that on the JobSet's owner reference (kubeflow/trainer pkg/runtime/framework/plugins/
        jobset/jobset.go, Build: ``WithController(true).WithBlockOwnerDeletion(true)``)."""
        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, TRAINJOBS, name, body={"propagationPolicy": "Foreground"})
        except ApiException as err:
            if err.status == 404:
                return
            raise ClusterError(f"deleting trainjob {name}: {api_message(err)}") from None
        except (OSError, HTTPError) as err:
            raise ClusterError(f"deleting trainjob {name}: {unreachable(err)}") from None

    def pod_log(self, pod: str, *, follow: bool, container: str = "node", tail_lines: int | None = None) -> Any:
        """The raw log response of a pod's container (``.stream()`` yields chunks; ``.release_conn()``
        when done): what ``trainctl logs`` reads through the SDK, here without it."""
        return self._call(
            f"logs of pod {pod}", self.core.read_namespaced_pod_log, pod, self.namespace, container=container, follow=follow, tail_lines=tail_lines, _preload_content=False,
            read=("get", "pods/log"),
        )

    def pending_workloads(self, queue: str) -> list[dict] | None:
        """The LocalQueue's pending Workloads in Kueue's order, from Kueue's visibility API
        (``visibility.kueue.x-k8s.io`` v1beta2, also served as v1beta1: kueue v0.19.2
        pkg/visibility/server.go; items are ``PendingWorkload``: name, ownerReferences, priority,
        positionInLocalQueue, positionInClusterQueue, apis/visibility/v1beta2/types.go). None where the
        cluster does not serve it (404: no APIService; 503: registered, its server not answering);
        :class:`NotAllowed` when it may not be read."""
        path = f"/apis/{VISIBILITY_GROUP}/{VISIBILITY_VERSION}/namespaces/{self.namespace}/localqueues/{queue}/pendingworkloads"
        try:
            found = self.raw_get(path)
        except ApiException as err:
            if err.status in (404, 503):
                return None
            raise not_allowed(err, "get", "localqueues/pendingworkloads", self.namespace) or ClusterError(f"reading the pending workloads of {queue}: {api_message(err)}") from None
        except (OSError, HTTPError) as err:
            raise ClusterError(f"reading the pending workloads of {queue}: {unreachable(err)}") from None
        return list((found or {}).get("items") or [])

    def raw_get(self, path: str) -> Any:
        """GET an API path as JSON (aggregated APIs the typed clients do not know); ApiException is raised."""
        found: Any = self.api.call_api(path, "GET", auth_settings=["BearerToken"], response_type="object", _return_http_data_only=True)
        return found
