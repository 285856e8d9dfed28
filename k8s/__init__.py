"""The Kubernetes side of the platform.

- ``k8s/builders/``: pure functions from typed settings to Kubernetes objects as plain dicts (no
  Pulumi): NodePools, runtimes, Kueue, tenants, admission policy, operations, the portal.
- the modules here: the ComponentResources that register those objects on the cluster (GPU capacity
  and device plugins, Trainer and its ClusterTrainingRuntimes, Kueue, tenants, operations,
  Prometheus, observability as a whole, the portal); ``resources.py`` and ``helm.py`` are the one
  place a manifest or a pinned chart becomes a Pulumi resource.
- ``k8s/pods/``: programs the platform runs in pods (shipped as ConfigMaps), standard library and
  the Kubernetes API only.

May import: config, k8s.builders, infra, k8s. Never workloads."""
