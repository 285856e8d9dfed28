"""Pure builders of the platform's Kubernetes objects: plain dicts from typed settings, no Pulumi,
no I/O but reading the pod programs they ship. trainctl, the portal and the tools use them too.

May import: config, k8s.builders."""
